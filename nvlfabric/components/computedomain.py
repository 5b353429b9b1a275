"""`ComputeDomain` component: one ComputeDomain, nvlfabric's with its shared channel claim, or NVIDIA's.

Wraps the dynamic resource `nvlfabric.provider.computedomain.ComputeDomain` with validated arguments and
typed outputs, and counts the pods bound to it (a claim's `reservedFor` holds at most 256 pods).

`backend` says whose ComputeDomain it is: `nvlfabric` (the default), served by NvlfabricDriver, or
`nvidia`: NVIDIA's `resource.nvidia.com/v1beta1` ComputeDomain, for a cluster that already runs
NVIDIA's DRA driver (nvlfabric/api/nvidia.py). The stack-wide default is the Pulumi config
`nvlfabric:backend`; moving a stack from one to the other is that one setting, and its preview
shows each domain replaced for `backend` (and the workloads bound to them replaced with it).
"""

from __future__ import annotations

from typing import Any

import pulumi
from pydantic import BaseModel, ConfigDict, Field

from nvlfabric.api.computedomain import ComputeDomainSpec, channel_claim_name, channel_claim_names
from nvlfabric.api.names import DNS_LABEL_MAX, GPUS_PER_CLIQUE, MAX_PODS_PER_CLAIM
from nvlfabric.api.nvidia import BACKEND_CONFIG, NVIDIA_LIMITS, Backend, NvidiaDomainSpec
from nvlfabric.components import program, served
from nvlfabric.components.args import ComponentArgsError, labels, validate
from nvlfabric.provider.await_ import AwaitFor
from nvlfabric.provider.computedomain import ComputeDomain as ComputeDomainResource
from nvlfabric.provider.domaininputs import DEFAULT_TIMEOUT_S, DomainName, Namespace, TimeoutS


class _DomainArgs(BaseModel):
    """The arguments both backends' domains take. Their limits and defaults are the provider's own
    (provider/domaininputs.py: the resource this component wraps judges the same inputs again)."""

    model_config = ConfigDict(extra="forbid")

    name: DomainName = Field(description=f"a DNS label of at most {DNS_LABEL_MAX} characters (the claim is "
                                         "<name>-channel)")
    namespace: Namespace = Field("default",
                                 description="the namespace of the domain, its claim and its workloads (a DNS label)")
    backend: Backend = Field(Backend.NVLFABRIC,
                             description="'nvlfabric' (nvlfabric's driver) or 'nvidia' (NVIDIA's DRA driver, already "
                                         "in the cluster); default: the config nvlfabric:backend, else nvlfabric")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels of the ComputeDomain")
    await_for: AwaitFor | None = Field(AwaitFor.ACCEPTED,
                                       description="None, 'Accepted' or 'Ready' (Ready needs pods placed in it, so not "
                                                   "with workloads bound to it by BoundJob)")
    timeout_s: TimeoutS = Field(DEFAULT_TIMEOUT_S, allow_inf_nan=False,
                                description="seconds a create, update or delete may take (a finite number > 0)")
    force_delete: bool = Field(False, description="delete even while pods use the channel")


class ComputeDomainArgs(_DomainArgs):
    spec: ComputeDomainSpec = Field(default_factory=ComputeDomainSpec,
                                    description="a ComputeDomainSpec (numNodes, imexMode, channelAllocationMode, ...)")


class NvidiaComputeDomainArgs(_DomainArgs):
    spec: NvidiaDomainSpec = Field(default_factory=NvidiaDomainSpec,
                                   description="on backend nvidia: numNodes, channelAllocationMode, channelClaim")


def backend_default() -> str:
    """The stack's default backend: the config `nvlfabric:backend`, else nvlfabric."""
    return pulumi.Config("nvlfabric").get(BACKEND_CONFIG) or Backend.NVLFABRIC.value


class ComputeDomain(pulumi.ComponentResource):
    """A ComputeDomain: pods bound to it share one IMEX channel inside one NVLink clique."""

    name: str
    namespace: str
    claim_name: pulumi.Output[str]
    clique: pulumi.Output[str | None]
    channel: pulumi.Output[int | None]
    members: pulumi.Output[list[str]]
    phase: pulumi.Output[str]
    """The domain's phase when `up` last created or updated it, as far as `await_for` waited
    (Accepted: usually Pending or Allocating; Ready: Ready); `pulumi refresh` reads it again. On
    backend nvidia, Pending until NVIDIA's IMEX daemons report."""
    ready_nodes: pulumi.Output[int]
    total_nodes: pulumi.Output[int]

    def __init__(self, resource_name: str, *, name: str | None = None, namespace: str = "default",
                 spec: ComputeDomainSpec | NvidiaDomainSpec | dict[str, Any] | None = None,
                 labels: dict[str, str] | None = None, await_for: AwaitFor | str | None = AwaitFor.ACCEPTED,
                 timeout_s: float = DEFAULT_TIMEOUT_S, force_delete: bool = False, backend: Backend | str | None = None,
                 opts: pulumi.ResourceOptions | None = None, **unknown: Any) -> None:
        backend = backend if backend is not None else backend_default()
        if isinstance(spec, BaseModel):
            spec = spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)
        model: type[_DomainArgs] = NvidiaComputeDomainArgs if backend == Backend.NVIDIA else ComputeDomainArgs
        self.args: _DomainArgs = validate(model, "ComputeDomain", resource_name, {
            "name": name if name is not None else resource_name, "namespace": namespace, "backend": backend,
            "spec": spec if spec is not None else {}, "labels": labels or {}, "await_for": await_for,
            "timeout_s": timeout_s, "force_delete": force_delete}, unknown)
        a = self.args
        program.take("ComputeDomain", a.namespace, a.name, component="ComputeDomain", resource_name=resource_name)
        # Known from the arguments (preview included), unlike the `claim_name` output, which is
        # unknown while the domain itself changes: workloads use this, so a change of the domain
        # does not show them as changing too.
        if isinstance(a, NvidiaComputeDomainArgs):
            # NVIDIA's controller makes a ResourceClaimTemplate; each pod gets a claim of its own from it.
            self.claim: str = a.spec.template_name(a.name)
            self.claims: list[str] = [self.claim]
            claim_kind, given = "ResourceClaimTemplate", a.spec.channel_claim
        else:
            assert isinstance(a, ComputeDomainArgs)
            self.claim = channel_claim_name(a.name, a.spec)
            self.claims = channel_claim_names(a.name, a.spec)
            claim_kind, given = "ResourceClaim", a.spec.channel_claim
        """Every channel claim, one per clique group (a single-clique domain: [claim]); on backend
        nvidia, NVIDIA's ResourceClaimTemplate."""
        program.channel_claims(claim_kind, a.namespace, self.claims, resource_name=resource_name, domain=a.name,
                               claim=given.name if given is not None else None)
        super().__init__("nvlfabric:index:ComputeDomain", resource_name, None, opts)
        self.name, self.namespace = a.name, a.namespace
        self.backend: Backend = a.backend
        if isinstance(a, NvidiaComputeDomainArgs):
            if len(domains := program.nvidia_domain(a.name)) == 2:  # said once, when it starts to matter
                pulumi.log.warn(f"ComputeDomains {', '.join(domains)}: {NVIDIA_LIMITS}", resource=self)
        else:
            assert isinstance(a, ComputeDomainArgs)
            program.domain_mode(resource_name, a.name, a.spec.imex_mode.value)
        self.bound_pods = 0
        self.bound_gpus: dict[str, int] = {}  # workload → its GPUs in each clique group
        # In the component provider the plugin serves the object itself (nvlfabric.components.served).
        resource_class = served.ComputeDomain if served.serving() else ComputeDomainResource
        self.resource = resource_class(
            resource_name, name=a.name, namespace=a.namespace, backend=a.backend.value, spec=a.spec,
            labels=_labels(a.labels), await_for=a.await_for, timeout_s=a.timeout_s,
            force_delete=a.force_delete, opts=pulumi.ResourceOptions(parent=self))
        r = self.resource
        self.claim_name = r.claim_name
        self.clique = r.clique
        self.channel = r.channel
        self.phase = r.phase
        self.ready_nodes = r.ready_nodes
        self.total_nodes = r.total_nodes
        self.members = r.nodes.apply(lambda nodes: [str(n.get("name")) for n in nodes or []])
        self.register_outputs({"claim_name": self.claim_name, "clique": self.clique, "channel": self.channel,
                               "members": self.members, "phase": self.phase, "ready_nodes": self.ready_nodes,
                               "total_nodes": self.total_nodes})

    def bind(self, workload: str, pods: int, gpus_per_pod: int = 0) -> None:
        """Record `pods` more pods of `workload` (with `gpus_per_pod` each) using each of this domain's
        claims; refuse past 256 pods, past one clique's GPUs in a clique group (all of a group's pods
        are in one clique), and a domain that awaits Ready (it would wait for pods created after it)."""
        if self.args.await_for is AwaitFor.READY:
            raise ComponentArgsError(
                f"ComputeDomain {self.name!r}: await_for='Ready' with workload {workload!r} bound to it: the domain "
                "becomes Ready only once pods of its workloads run, and those are created after the domain's create "
                f"returns, so `pulumi up` would wait the whole timeout_s ({self.args.timeout_s:g} s) and fail. Use "
                "await_for='Accepted' (the default) for a domain with bound workloads, and wait for the workload "
                "instead (BoundJob wait=True) or watch the domain's phase")
        if self.backend is Backend.NVIDIA:
            # Each pod's claim is its own (from NVIDIA's template), and NVIDIA's domain spans cliques.
            self.bound_pods += pods
            return
        if self.bound_pods + pods > MAX_PODS_PER_CLAIM:
            raise ComponentArgsError(
                f"ComputeDomain {self.name!r}: binding {workload!r} would make {self.bound_pods + pods} pods use "
                f"its channel claim; a claim can be reserved for at most {MAX_PODS_PER_CLAIM} pods. Split the "
                "workload over several ComputeDomains or use fewer, larger pods")
        gpus = {**self.bound_gpus, workload: self.bound_gpus.get(workload, 0) + pods * gpus_per_pod}
        if sum(gpus.values()) > GPUS_PER_CLIQUE:
            each = ", ".join(f"{w} {g}" for w, g in gpus.items())
            raise ComponentArgsError(
                f"ComputeDomain {self.name!r}: binding {workload!r} would put {sum(gpus.values())} GPUs in each of its "
                f"clique groups ({each}); a group lives in one NVL72 clique, which has {GPUS_PER_CLIQUE}: the "
                "last pods would stay Pending while the domain says Ready. Use fewer pods or GPUs, another "
                "ComputeDomain, or placement MultiClique with more cliques")
        self.bound_pods += pods
        self.bound_gpus = gpus


def _labels(extra: dict[str, str]) -> dict[str, str]:
    return labels("compute-domain", extra)
