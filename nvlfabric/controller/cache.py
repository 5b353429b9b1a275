"""What the controller's passes read: the informers (informer.py) and the records they keep; the
Admitter's informers of Kueue's objects beside them.

Each record is what the readers need of an object, parsed once per change of it: an agent's Node
(clique, fabric health, its reports per ComputeDomain, what placement reads), a ComputeDomain
validated, a claim with its allocation, a bound pod as the GPUs it holds on its node, an unbound
pod as a reservation candidate. Records compare by resourceVersion (or by value, where that is
small), so a write that changes nothing a reader uses is no news to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import Client, operators
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.nodereports import node_reports
from nvlfabric.controller import placement
from nvlfabric.controller.informer import Informer
from nvlfabric.controller.reservationplan import PendingPod, pending_pod
from nvlfabric.controller.strayclaims import ChannelClaim, channel_claim
from nvlfabric.kube.errors import api_call

ComputeDomainResource = create_namespaced_resource(names.GROUP, api.VERSION, api.KIND, api.PLURAL)


def channels_of(raw: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """Every channel of nvlfabric's pools the claim's allocation holds, as (clique, channel): what
    a pool's accounting counts (a claim, whatever its shape, holds as many channels as devices)."""
    allocation = (raw.get("status") or {}).get("allocation") or {}
    out = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        clique, channel = names.clique_of_pool(r.get("pool", "")), names.channel_of_device(r.get("device", ""))
        if r.get("driver") == names.DRIVER and clique is not None and channel is not None:
            out.append((clique, channel))
    return tuple(out)


@dataclass(frozen=True)
class AgentNode:
    """A Node with nvlfabric's agent, as the passes read it (parsed once per change of the Node)."""

    name: str
    clique: str | None
    unhealthy: str | None
    """Why its NVLinkFabricReady condition is False; None while it is not."""
    reports: tuple[tuple[str, str, api.NodeStatus], ...]
    """(namespace, name, entry) of each ComputeDomain its agent reports on (entry named as the Node)."""
    placement: dict[str, Any] = field(compare=False)
    """What placement reads of it (labels, taints, schedulability, conditions, allocatable)."""
    rv: str = ""
    down: str | None = None
    """Why its Ready condition is not True (False or Unknown: the kubelet stopped posting status);
    None while it is."""


def agent_node(obj: Any) -> AgentNode:
    raw = obj.to_dict()
    meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
    name = meta.get("name") or ""
    labels = meta.get("labels") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == names.FABRIC_CONDITION), None)
    unhealthy = None
    if cond is not None and cond.get("status") == "False":
        unhealthy = f"{cond.get('reason')}: {cond.get('message')}" if cond.get("message") else str(cond.get("reason"))
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    down = None
    if ready is not None and ready.get("status") != "True":
        down = f"Ready {ready.get('status')}: {ready.get('reason')}" + (
            f": {ready.get('message')}" if ready.get("message") else "")
    reports = tuple((r.namespace, r.name, r.entry.model_copy(update={"name": name}))
                    for r in node_reports(meta.get("annotations")))
    return AgentNode(name=name, clique=labels.get(names.CLIQUE_LABEL), unhealthy=unhealthy, down=down, reports=reports,
                     placement={"metadata": {"name": name, "labels": labels},
                                "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
                                "status": {"conditions": status.get("conditions") or [],
                                           "allocatable": status.get("allocatable") or {}}},
                     rv=meta.get("resourceVersion") or "")


@dataclass(frozen=True)
class DomainRecord:
    rv: str
    obj: Any = field(compare=False)
    cd: api.ComputeDomain | None = field(compare=False)
    error: str | None = field(compare=False, default=None)


def domain_record(obj: Any) -> DomainRecord:
    meta = obj.metadata
    try:
        return DomainRecord((meta.resourceVersion if meta else None) or "", obj,
                            api.ComputeDomain.model_validate(obj.to_dict()))
    except ValueError as exc:
        return DomainRecord((meta.resourceVersion if meta else None) or "", obj, None, str(exc))


@dataclass(frozen=True)
class ClaimRecord:
    rv: str
    raw: dict[str, Any] = field(compare=False)
    allocation: tuple[str, int] | None = field(compare=False, default=None)
    channels: tuple[tuple[str, int], ...] = field(compare=False, default=())
    """Every channel of our pools it holds (channels_of)."""
    channel_claim: ChannelClaim | None = field(compare=False, default=None)
    """What the stray-claim sweep reads of it; None when it requests no channel."""


def claim_record(obj: Any) -> ClaimRecord:
    raw = obj.to_dict()
    (raw.get("metadata") or {}).pop("managedFields", None)
    held = channels_of(raw)
    return ClaimRecord(((raw.get("metadata") or {}).get("resourceVersion")) or "", raw, held[0] if held else None,
                       held, channel_claim(raw))


def slice_record(obj: Any) -> Any:
    return obj


def gpu_slice(obj: Any) -> tuple[str, int]:
    """A node's GPU slice (nvlfabric/nodeagent/gpus.py) as placement counts it: (its node, the GPUs
    no NoSchedule or NoExecute taint keeps new claims off)."""
    spec = obj.spec
    usable = sum(1 for d in spec.devices or [] if not any(t.effect in ("NoSchedule", "NoExecute")
                                                         for t in d.taints or []))
    return spec.nodeName or "", usable


@dataclass(frozen=True)
class UnboundPod:
    """A pod no node has yet, as reservation reads it. Compared by resourceVersion: every change of
    the pod is news to the Reserver (its watch was a plain list-and-watch before it was an
    informer, and each event started a pass for the pod's claims)."""

    rv: str
    uid: str = field(compare=False)
    pending: PendingPod | None = field(compare=False)
    """What reservation reads of it (reservationplan.pending_pod); None when it must not be
    reserved ahead (being deleted, finished, or naming no claim)."""


def unbound_pod(obj: Any) -> UnboundPod:
    raw = obj.to_dict()
    meta = raw.get("metadata") or {}
    return UnboundPod(meta.get("resourceVersion") or "", meta.get("uid", ""), pending_pod(raw))


def pod_usage(obj: Any) -> tuple[str, int, bool]:
    """A bound pod as placement counts it: (its node, the GPUs it holds, finished)."""
    raw = obj.to_dict()
    phase = (raw.get("status") or {}).get("phase")
    return ((raw.get("spec") or {}).get("nodeName") or "", placement.gpus_of(raw), phase in ("Succeeded", "Failed"))


@dataclass
class Informers:
    """What the controller and its Reserver read, each a list and a watch (informer.py)."""

    nodes: Informer[AgentNode]
    domains: Informer[DomainRecord]
    claims: Informer[ClaimRecord]
    slices: Informer[Any]
    gpus: Informer[tuple[str, int]]
    """The nodes' GPU slices, where the agents publish GPUs (NvlfabricDriver gpu_devices DRA)."""
    bound_pods: Informer[tuple[str, int, bool]]
    unbound_pods: Informer[UnboundPod]
    """The Reserver's alone (reservations.py): pods waiting for a node, each a candidate to reserve
    ahead. Named "Pod" in the watch-failure metric, as its own watch was before."""

    @classmethod
    def of(cls, client: Client) -> Informers:
        return cls(
            nodes=Informer(client, Node, namespaced=False, labels={names.FABRIC_READY_LABEL: None}, slim=agent_node),
            domains=Informer(client, ComputeDomainResource, slim=domain_record, name=api.KIND),
            claims=Informer(client, ResourceClaim, slim=claim_record),
            slices=Informer(client, ResourceSlice, namespaced=False, labels={names.POOL_LABEL: None},
                            slim=slice_record),
            gpus=Informer(client, ResourceSlice, namespaced=False, fields={"spec.driver": names.GPU_DRIVER},
                          slim=gpu_slice, name="ResourceSlice (GPUs)"),
            bound_pods=Informer(client, Pod, fields={"spec.nodeName": operators.not_equal("")}, slim=pod_usage,
                                name="Pod (bound)"),
            unbound_pods=Informer(client, Pod, fields={"spec.nodeName": ""}, slim=unbound_pod, name="Pod"))

    def all(self) -> list[Informer[Any]]:
        return [self.nodes, self.domains, self.claims, self.slices, self.gpus, self.bound_pods, self.unbound_pods]

    def start(self, stop: Callable[[], bool]) -> None:
        """Every informer's list and watch, each in a thread of its own, until `stop()`."""
        for inf in self.all():
            inf.start(stop)

    def wait_synced(self, stop: Callable[[], bool]) -> None:
        """Until each informer has listed once (or `stop()`): a pass before that would read an empty cache."""
        for inf in self.all():
            while not inf.synced.wait(1.0) and not stop():
                pass


def cluster_use(cache: Informers) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The clique Nodes as placement reads them, and the GPUs their running pods use. A node whose
    GPUs are DRA devices (no device plugin's `nvidia.com/gpu` in its allocatable) counts those its
    GPU slice offers untainted."""
    with api_call("read the Nodes and bound pods to place channel claims"):
        dra = dict(cache.gpus.fresh().values())
        nodes = [placement.with_dra_gpus(n.placement, dra.get(n.name)) for n in cache.nodes.fresh().values()
                 if n.clique]
        used: dict[str, int] = {}
        for node, gpus, finished in cache.bound_pods.fresh().values():
            if not finished:
                used[node] = used.get(node, 0) + gpus
    return nodes, used


_KUEUE_GROUP, _KUEUE_VERSION = names.KUEUE_API_VERSION.split("/")
Workload = create_namespaced_resource(_KUEUE_GROUP, _KUEUE_VERSION, "Workload", "workloads")
AdmissionCheck = create_global_resource(_KUEUE_GROUP, _KUEUE_VERSION, "AdmissionCheck", "admissionchecks")


def kueue_record(obj: Any) -> dict[str, Any]:
    """A Workload or AdmissionCheck as the passes read it: its dict without managedFields (the
    bulk of a status-written object, read by nobody here)."""
    raw = dict(obj.to_dict())
    (raw.get("metadata") or {}).pop("managedFields", None)
    return raw


@dataclass
class KueueInformers:
    """What the Admitter (admission.py) reads: Kueue's Workloads and AdmissionChecks. Apart from
    `Informers` because they start only once Kueue's API is served, which may be never."""

    workloads: Informer[dict[str, Any]]
    checks: Informer[dict[str, Any]]

    @classmethod
    def of(cls, client: Client) -> KueueInformers:
        return cls(workloads=Informer(client, Workload, slim=kueue_record, name="Workload"),
                   checks=Informer(client, AdmissionCheck, namespaced=False, slim=kueue_record,
                                   name="AdmissionCheck"))

    def all(self) -> list[Informer[Any]]:
        return [self.workloads, self.checks]


