"""A dynamic provider for ComputeDomains (`nvlfabric.io/v1alpha1`) and their shared channel claims.

A ComputeDomain (CD) is managed as one unit with its channel ResourceClaim (docs/architecture.md,
"DRA design"): every pod of the CD references that one claim by name, so the scheduler gives the
CD one IMEX channel and keeps all its pods in one clique.

The contract, method by method:

- `check` validates the inputs with the pydantic models (`NvlfabricArgs`, whose `spec` is
  the API's own `ComputeDomainSpec`). Each failure names the property path (`spec.imexMode`,
  `labels["a/b"]`) and the fix. Values still unknown during a preview (Pulumi's sentinel string)
  are not judged, and neither is anything that depends on them. Valid inputs are returned
  normalised: the spec with its defaults filled, so state, diffs and refreshes all compare like
  with like.
- `diff` is field-level. `name`, `namespace` and the immutable spec fields (`immutable_changes`)
  are replaces; `numNodes`, `labels` and the provider settings are updates; nothing changed means
  `changes=False`. A replace deletes first (`delete_before_replace`) when the replacement reuses
  the CD's or its claim's name, which it does unless both are renamed. A value unknown during a
  preview counts as changed, and as a replace when it is a replace field.
- `create` creates the CD, then its claim `<cd>-channel` (or `spec.channelClaim.name`), owned by
  the CD (so the garbage collector removes it with the CD) and labelled
  `nvlfabric.io/compute-domain=<cd>`. Both requests ask the API server for strict field validation
  (`fieldValidation=Strict`), so an unknown or duplicate field is an error, not silently dropped;
  the spec is sent as given and the API server, holding the CRD generated from the same models,
  is the judge. Both are tried again after a temporary error (the API server unreachable or
  failing) until the deadline, as the await is, so an API server outage shorter than `timeout_s`
  is ridden out. If the claim or the await fails, what this call created is deleted before the
  error is raised (nothing half-made stays behind). An existing CD is an error listing the
  remedies, unless `adopt` is set: then its spec and labels are patched to match (its immutable
  fields must already match) and it is never rolled back.
- `read` returns the live object (drift shows on refresh) and rebuilds the inputs from it; a
  deleted CD reads as gone.
- `update` merge-patches the mutable spec fields and the labels, recreates the claim if it was
  deleted behind our back, and awaits as `create` does.
- `delete` refuses while pods use the claim (`status.reservedFor`, or pods of the namespace that
  reference it and have not finished), naming up to five of them, unless `force_delete` is set;
  then deletes the CD and the claim and waits until both are gone, naming any finalizers that
  hold them on timeout.

Awaiting (`await_for`): `None`, `Accepted` (default: the CRD is established, the CD and its claim
exist) or `Ready` (the controller reports phase Ready for the current generation); one deadline,
`timeout_s` (default 600 s), covers a whole create, update or delete. See `nvlfabric.provider.await_`.

**`channelAllocationMode: All`.** The claim is the same as for `Single`: exactly one channel
device of the clique's pool. That one device still does what the claim is for (the scheduler's
clique placement and the CD's channel identity), while `allocationMode: All` would take every
channel of the clique's pool and starve every other CD in the clique. The opaque config carries
`channelAllocationMode: All`, and the node agent injects every channel of the CD itself into its
pods (never another CD's: docs/tenants.md, "What All means on a shared clique"). The API allows
`All` only with a dedicated IMEX domain.

**Strict field validation.** lightkube 1.0.1's `create`/`patch` take no `fieldValidation`
parameter, but its request layer accepts any query parameter; `domainclient.send` goes through it
(pinned lightkube; a test proves that an unknown field is rejected by the server).

**Where it is.** This module holds the provider (its class path is in users' states: Pulumi
pickles it), which picks the backend by the `backend` input, and the resource classes. The
backends are nvlfabric/provider/nvlfabricdomain.py (all of the above) and
nvlfabric/provider/nvidiadomain.py (`backend: nvidia`, NVIDIA's ComputeDomain); the seam between
them and the provider is nvlfabric/provider/backend.py. The backends' public names are re-exported
here, where callers have always imported them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Required, TypedDict, Unpack

from pulumi import Input, Output, ResourceOptions
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from nvlfabric.api.computedomain import ComputeDomainSpec
from nvlfabric.api.nvidia import Backend, NvidiaDomainSpec
from nvlfabric.provider import await_, host, kube, nvidiadomain, nvlfabricdomain
from nvlfabric.provider.await_ import AwaitFor
from nvlfabric.provider.backend import Context, DomainBackend
from nvlfabric.provider.domaininputs import (
    DEFAULT_TIMEOUT_S,
    OUTPUT_KEYS,
    SETTINGS,
    backend_of,
    is_unknown,
    whole_numbers,
)
from nvlfabric.provider.domainusers import DEPARTING_SETTLE_S, MAX_NAMED_PODS, claim_users, in_use_message
from nvlfabric.provider.nvlfabricdomain import (
    CD,
    CHANNEL_REQUEST,
    INPUT_KEYS,
    NvlfabricArgs,
    channel_claim,
    channel_config,
    check_inputs,
    claim_drift,
    compute_diff,
    outputs,
    owned_by,
)

# The backends' names that callers import from here (tests, the components, the benchmarks).
__all__ = [
    "BACKENDS", "CD", "CHANNEL_REQUEST", "DEFAULT_TIMEOUT_S", "DEPARTING_SETTLE_S", "INPUT_KEYS", "MAX_NAMED_PODS",
    "OUTPUT_KEYS", "SETTINGS", "ComputeDomain", "ComputeDomainOutputs", "ComputeDomainProvider", "NvlfabricArgs",
    "ResourceInputs", "backend_for", "backend_of", "channel_claim", "channel_config", "check_inputs", "claim_drift",
    "claim_users", "compute_diff", "in_use_message", "is_unknown", "outputs", "owned_by", "resource_inputs",
    "whole_numbers",
]

BACKENDS: Final[Mapping[str, DomainBackend]] = {Backend.NVLFABRIC.value: nvlfabricdomain,
                                                Backend.NVIDIA.value: nvidiadomain}


def backend_for(props: Mapping[str, Any]) -> DomainBackend:
    """The backend the inputs (or the state) name; an unknown name is nvlfabric's to judge (its
    check names the backends there are)."""
    return BACKENDS.get(backend_of(props), nvlfabricdomain)


# -- the provider ------------------------------------------------------------------------------------


host.install()  # in the dynamic provider host: our errors as their message, no traceback


class ComputeDomainProvider(kube.KubeProvider):
    """CRUD for a ComputeDomain and its shared channel claim, with await (see the module docstring)."""

    # The settings of awaits, which tests replace on an instance. Class attributes, not set in
    # __init__, so that a provider unpickled from a state has them whatever it was pickled with
    # (`__setstate__`); and a pickle stays small (nothing here is pickled).
    #: The clock and poll intervals of awaits.
    clock: await_.Clock = await_.SYSTEM_CLOCK
    poll: await_.Poll = await_.POLL
    #: Where progress lines go (staticmethod: a plain function, not a method of the provider).
    on_progress: Callable[[str], None] = staticmethod(host.progress)
    #: Backend nvidia: how long a new domain may lack NVIDIA's finalizer before its controller is looked for.
    controller_grace_s: float = nvidiadomain.CONTROLLER_GRACE_S

    def __setstate__(self, state: dict[str, Any]) -> None:
        # States written before these were class attributes hold the provider as its __init__ left
        # it: clock, poll, on_progress (and, later, controller_grace_s) set to None, meaning "the
        # default". Dropped here, the class attributes above apply.
        self.__dict__.update({k: v for k, v in state.items() if v is not None or k not in _DEFAULTS})

    def _context(self) -> Context:
        return Context(connect=self._client, clock=self.clock, poll=self.poll, on_progress=self.on_progress,
                       controller_grace_s=self.controller_grace_s)

    # -- engine entry points: the backend named by the inputs (or the state) serves each

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        if is_unknown(news.get("backend")):  # which model judges the rest is not known yet
            return CheckResult(dict(news), [])
        return backend_for(news).check_inputs(news)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        if is_unknown(news.get("backend")) or backend_of(news) != backend_of(olds):
            # Another backend is another object (nvlfabric.io's or resource.nvidia.com's), made
            # before the old one goes: the migration's preview shows each domain replaced for this.
            return DiffResult(changes=True, replaces=["backend"], delete_before_replace=False)
        return backend_for(news).compute_diff(olds, news)

    @host.plain_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        return backend_for(props).create(self._context(), props)

    @host.plain_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return backend_for(props).read(self._context(), id_, props)

    @host.plain_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return backend_for(news).update(self._context(), olds, news)

    @host.plain_errors
    def delete(self, id_: str, props: dict[str, Any]) -> None:
        backend_for(props).delete(self._context(), id_, props)


_DEFAULTS: Final = frozenset({"clock", "poll", "on_progress", "controller_grace_s"})


# -- the resource ------------------------------------------------------------------------------------


class ResourceInputs(TypedDict, total=False):
    """A ComputeDomain resource's inputs (the keyword arguments of both resource classes)."""

    name: Required[Input[str]]
    namespace: Input[str]
    backend: Input[str]
    spec: ComputeDomainSpec | NvidiaDomainSpec | Input[Mapping[str, Any]] | None
    labels: Input[Mapping[str, str]] | None
    await_for: AwaitFor | str | None
    timeout_s: Input[float]
    adopt: Input[bool]
    force_delete: Input[bool]


def resource_inputs(**inputs: Unpack[ResourceInputs]) -> dict[str, Any]:
    """The properties a ComputeDomain resource registers (inputs with their defaults, and its outputs
    as None), whoever serves its CRUD: the dynamic provider here, or nvlfabric's component provider
    for other languages (`nvlfabric.components.served`)."""
    spec = inputs.get("spec")
    labels = inputs.get("labels")
    await_for = inputs.get("await_for", AwaitFor.ACCEPTED)
    return {
        "name": inputs["name"],
        "namespace": inputs.get("namespace", "default"),
        "backend": inputs.get("backend", Backend.NVLFABRIC.value),
        "spec": nvlfabricdomain.dump_spec(spec) if isinstance(spec, ComputeDomainSpec) else spec.dump()
        if isinstance(spec, NvidiaDomainSpec) else spec if spec is not None else {},
        "labels": labels if labels is not None else {},
        # Python's None here means "do not wait" (a null input would mean the default).
        "await_for": str(await_for if await_for is not None else AwaitFor.NONE),
        "timeout_s": inputs.get("timeout_s", DEFAULT_TIMEOUT_S),
        "adopt": inputs.get("adopt", False),
        "force_delete": inputs.get("force_delete", False),
        **dict.fromkeys(OUTPUT_KEYS),
    }


class ComputeDomainOutputs:
    """What a ComputeDomain resource outputs, whichever class registered it."""

    name: Output[str]
    namespace: Output[str]
    spec: Output[dict[str, Any]]
    labels: Output[dict[str, str]]
    uid: Output[str]
    claim_name: Output[str]
    phase: Output[str]
    clique: Output[str | None]
    channel: Output[int | None]
    nodes: Output[list[dict[str, Any]]]
    ready_nodes: Output[int]
    total_nodes: Output[int]
    claim_drift: Output[str | None]
    """Set by a refresh when a channel claim was deleted outside the stack (see `claim_drift`)."""


class ComputeDomain(Resource, ComputeDomainOutputs, module="nvlfabric", name="ComputeDomain"):
    """An nvlfabric ComputeDomain and its shared channel claim, managed by `ComputeDomainProvider`.

    Pods join it by listing `claim_name` in `spec.resourceClaims[].resourceClaimName`.
    """

    def __init__(self, resource_name: str, opts: ResourceOptions | None = None,
                 **inputs: Unpack[ResourceInputs]) -> None:
        super().__init__(ComputeDomainProvider(), resource_name, resource_inputs(**inputs), opts)
