"""What the cluster says about a rack's nodes: the clique their agents discovered, their GPUs.

A read at program time (a data source, run by preview and up alike), for `components.Nvl72Rack`:
per node whether it exists and is Ready, the clique label its node agent set from NVML
(`nvlfabric.io/clique`) or, on a cluster that runs NVIDIA's driver, the one GPU Feature Discovery
set (`nvidia.com/gpu.clique`, same `<clusterUUID>.<cliqueId>` value), whether the fabric is ready,
and its GPUs: allocatable and requested by the pods on it that have not finished, so which nodes
are fully free (what a rack's `spares` counts). `summarize` is pure and unit-tested.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric.api import errors
from nvlfabric.api.names import (
    CLIQUE_LABEL,
    FABRIC_READY_LABEL,
    RACK_FIELD_MANAGER_PREFIX,
    RACK_LABEL,
    WORKLOAD_LABEL,
)
from nvlfabric.api.nvidia import CLIQUE_LABEL as NVIDIA_CLIQUE_LABEL
from nvlfabric.kube.errors import api_call


@dataclass(frozen=True)
class NodeView:
    name: str
    exists: bool
    ready: bool = False
    clique: str | None = None
    fabric_ready: bool = False
    gpus_allocatable: int = 0
    gpus_requested: int = 0
    rack: str | None = None
    """Its `nvlfabric.io/rack` label now (the rack some declaration put it in)."""
    rack_owner: str | None = None
    """The field manager that owns that label (server-side apply), when one does."""
    gpus_by_workload: tuple[tuple[str, int], ...] = ()
    """GPUs its unfinished pods of each bound workload hold ('namespace/workload', by the pods'
    nvlfabric.io/workload label): a running job's own GPUs are not "used" when it is judged again."""


@dataclass(frozen=True)
class RackView:
    nodes: tuple[NodeView, ...]
    expected_clique: str | None
    cliques: dict[str, str | None] = field(default_factory=dict)
    mismatches: tuple[str, ...] = ()
    """Human-readable problems: a node missing, without a clique, or in another clique."""
    free_gpus: int = 0
    free_nodes: int = 0
    """Ready nodes with GPUs none of which an unfinished pod asks for: fully free, so each could be
    one of the rack's spares (`nvlfabric.io/spares`) or a new domain's member."""
    held_gpus: dict[str, int] = field(default_factory=dict)
    """'namespace/workload' → GPUs its pods hold on the rack's Ready nodes."""


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def summarize(nodes: Sequence[NodeView], expected_clique: str | None) -> RackView:
    """Which cliques the rack's nodes are in, what disagrees, and how many GPUs are free (pure)."""
    cliques = {n.name: n.clique for n in nodes}
    found = {c for c in cliques.values() if c}
    problems = [f"{n.name}: no such Node (nothing is labelled or tainted there: check the name)" for n in nodes
                if not n.exists]
    problems += [f"{n.name}: no clique discovered (NVLink fabric not ready)" for n in nodes
                 if n.exists and not n.clique]
    if expected_clique:
        problems += [f"{n.name}: in clique {n.clique}, not the declared {expected_clique}" for n in nodes
                     if n.clique and n.clique != expected_clique]
    elif len(found) > 1:
        problems.append(f"the rack's nodes report {len(found)} cliques ({', '.join(sorted(found))}); "
                        "one NVL72 rack is one clique: check the cabling or the node list")
    free = sum(max(0, n.gpus_allocatable - n.gpus_requested) for n in nodes if n.exists and n.ready)
    free_nodes = sum(1 for n in nodes if n.exists and n.ready and n.gpus_allocatable > 0 and n.gpus_requested == 0)
    held: dict[str, int] = {}
    for n in nodes:
        if n.exists and n.ready:
            for workload, gpus in n.gpus_by_workload:
                held[workload] = held.get(workload, 0) + gpus
    return RackView(nodes=tuple(nodes), expected_clique=expected_clique, cliques=cliques,
                    mismatches=tuple(problems), free_gpus=free, free_nodes=free_nodes, held_gpus=held)


def _requested(pods: Iterable[Pod], resource: str) -> int:
    total = 0
    for p in pods:
        if p.status is not None and p.status.phase in ("Succeeded", "Failed"):
            continue
        for c in (p.spec.containers if p.spec else []):
            res = c.resources
            amount = (res.limits or {}).get(resource) if res else None
            if amount is None and res is not None:
                amount = (res.requests or {}).get(resource)
            total += _quantity(amount) if amount is not None else 0
    return total


def label_owner(obj: Node, label: str) -> str | None:
    """The field manager whose managed fields hold `label` (server-side apply's owner), or None."""
    for entry in (obj.metadata.managedFields if obj.metadata else None) or []:
        labels = ((entry.fieldsV1 or {}).get("f:metadata") or {}).get("f:labels") or {}
        if f"f:{label}" in labels:
            return entry.manager
    return None


def rack_conflicts(nodes: Sequence[NodeView], rack: str) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the rack's Nodes another rack already claims (pure). Owned by a
    manager that is not Pulumi's (kubectl label, another tool), `up` would fail with a field
    conflict: refused at preview. Owned by Pulumi or by an nvlfabric rack it may be this stack's
    own earlier name for the rack (a rename updates it in place), or another stack's: a warning."""
    refused, warned = [], []
    for n in nodes:
        if not n.exists or n.rack in (None, rack):
            continue
        owner = n.rack_owner or "no field manager"
        text = (f"{n.name} is already in rack {n.rack!r} (label {RACK_LABEL}, owned by {owner!r}); a node is in one "
                "rack")
        if n.rack_owner is not None and n.rack_owner.startswith(("pulumi-kubernetes", RACK_FIELD_MANAGER_PREFIX)):
            warned.append(f"{text}: if another stack's rack declares it, `pulumi up` fails with a field conflict on "
                          f"{RACK_LABEL}; take it out of that rack first")
        else:
            refused.append(f"{text}, and `pulumi up` would fail with a field conflict on it: take it out of that "
                           f"rack (`kubectl label node {n.name} {RACK_LABEL}-` if nothing declares it any more), or "
                           f"name this rack {n.rack!r}")
    return refused, warned


def racked_nodes(client: Client) -> dict[str, Node]:
    """Every Node some rack labelled (`nvlfabric.io/rack`), by name: one list for a program's racks."""
    with api_call("list the racked Nodes"):
        nodes = client.list(Node, labels={RACK_LABEL: None})
        return {n.metadata.name: n for n in nodes if n.metadata and n.metadata.name}


OBSERVE_IN_FLIGHT = 16
"""Node reads in flight at once. A rack's observation is 2 reads per node (its Node, the pods bound
to it: the API server answers that from its watch cache's node index); one after another, a program
of 64 racks spent 23 s of every preview on 2,304 round trips before declaring its first domain."""


def observe(client: Client, names: Sequence[str], *, gpu_resource: str,
            known: Mapping[str, Node] | None = None) -> list[NodeView]:
    """Each named node as the cluster has it now (in the order given); `known`: Nodes the caller
    has just read (a list), which are not read again."""
    with ThreadPoolExecutor(min(OBSERVE_IN_FLIGHT, max(1, len(names))), thread_name_prefix="observe") as pool:
        return list(pool.map(lambda name: _observe_node(client, name, gpu_resource, (known or {}).get(name)), names))


def _observe_node(client: Client, name: str, gpu_resource: str, node: Node | None = None) -> NodeView:
    if node is None:
        try:
            with api_call(f"read Node {name}"):
                node = client.get(Node, name)
        except errors.NotFound:
            return NodeView(name=name, exists=False)
    labels = (node.metadata.labels if node.metadata else None) or {}
    conditions = (node.status.conditions if node.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    allocatable = _quantity(((node.status.allocatable if node.status else None) or {}).get(gpu_resource, 0))
    with api_call(f"list the pods of Node {name}"):
        pods = list(client.list(Pod, namespace="*", fields={"spec.nodeName": name}))
    by_workload: dict[str, list[Pod]] = {}
    for p in pods:
        workload = ((p.metadata.labels if p.metadata else None) or {}).get(WORKLOAD_LABEL)
        if workload and p.metadata:
            by_workload.setdefault(f"{p.metadata.namespace or 'default'}/{workload}", []).append(p)
    clique = labels.get(CLIQUE_LABEL) or labels.get(NVIDIA_CLIQUE_LABEL)
    return NodeView(name=name, exists=True, ready=ready, clique=clique,
                    fabric_ready=labels.get(FABRIC_READY_LABEL) == "true",
                    gpus_allocatable=allocatable, gpus_requested=_requested(pods, gpu_resource),
                    rack=labels.get(RACK_LABEL), rack_owner=label_owner(node, RACK_LABEL),
                    gpus_by_workload=tuple(sorted((w, _requested(ps, gpu_resource)) for w, ps in by_workload.items())))
