"""Where a domain's pods go: the NVLink clique where the whole group fits, chosen before its first
pod is scheduled (pure functions; the Reserver feeds them from the API server).

Why: a channel claim's clique is wherever its first pod lands, and the scheduler places that pod
alone, on any node with a free GPU. Eight whole-rack domains started together on eight racks put
three of them into one rack (one filled it, two got a node each, 36 pods stayed Pending) while
two racks stayed empty. So the controller narrows the pioneer pod (the one pod of a claim whose
gate lifts first, reservations.py) to one clique with `nodeSelector: {nvlfabric.io/clique: X}`
(a gated pod's node selector may be narrowed, KEP-3838), where X is a clique in which every pod of
the group fits at once, and a free channel is left. The claim's allocation then carries X's node
selector and every later pod follows it.

The capacity of a clique for a group of `n` pods of `g` GPUs each is the number of such pods its
schedulable nodes still take: the sum over nodes of floor(free GPUs / g), where a node's free GPUs
are its allocatable `nvidia.com/gpu` minus the GPUs of the pods bound to it that have not finished.
Groups placed but not yet bound hold their room (`Reserved`), so two groups planned in one pass, or
one just after another, never count the same free node. Choice: the fitting clique with the least
room left (best fit keeps whole racks free for whole-rack groups), ties by name. A job of several
groups (one claim per group) is placed all or nothing: each group in a clique of its own, or none.

Spares: a clique whose Nodes carry `nvlfabric.io/spares=N` (an Nvl72Rack's `spares`) keeps N of
its idle nodes out of a new group's room, so they stay free for replacements of lost members;
pods joining a placed domain (reservations.py, `Placer.joiners`) may use them.

Known approximation: room is counted per node for the group's own pod size; a placed group of
another pod size holds `ceil(its GPUs / g)` of the other's slots.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nvlfabric.api.names import CLIQUE_LABEL, GPU_RESOURCE, MAX_PODS_PER_CLAIM, SPARES_LABEL


@dataclass(frozen=True)
class Group:
    """The pods of one channel claim, to be placed in one clique."""

    key: tuple[str, str]  # (namespace, claim)
    pods: int
    gpus_per_pod: int
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Labels every node of the group must carry (the pods' own nodeSelector)."""
    clique: str | None = None
    """The one clique the group may use (its domain's placement.clique), or None: any."""


@dataclass(frozen=True)
class NodeRoom:
    name: str
    clique: str
    free_gpus: int
    labels: Mapping[str, str] = field(default_factory=dict)
    idle: bool = False
    """No unfinished pod holds a GPU on it: a spare, if its clique keeps some."""


@dataclass(frozen=True)
class Reserved:
    """Room held for a group placed earlier whose pods are not all bound yet."""

    clique: str
    pods: int
    gpus_per_pod: int


@dataclass(frozen=True)
class NoRoom:
    """Why a group does not fit anywhere (for the Event a user sees)."""

    group: Group
    best_clique: str | None
    best_room: int
    groups: int = 1
    """How many groups the job has (a MultiClique domain: one per clique)."""
    fitted: int = 0
    """How many of them found a clique before this one did not."""
    exhausted: tuple[str, ...] = ()
    """Cliques with room for the group whose channel pool has no channel left."""
    spares: int = 0
    """Idle nodes the best clique keeps as spares (not counted in its room)."""

    @property
    def reason(self) -> str:
        """The Event's reason: ChannelPoolExhausted where the nodes had room but the pool had no channel."""
        return "ChannelPoolExhausted" if self.exhausted else "NoCliqueRoom"

    def message(self) -> str:
        want = f"{self.group.pods} pods x {self.group.gpus_per_pod} GPUs"
        job = (f"a job of {self.groups} clique groups needs {self.groups} cliques with room, {self.fitted} have "
               "it; " if self.groups > 1 else "")
        if self.exhausted:
            shown = ", ".join(self.exhausted[:5]) + (f" and {len(self.exhausted) - 5} more"
                                                     if len(self.exhausted) > 5 else "")
            return (f"{job}every channel of clique{'s' if len(self.exhausted) > 1 else ''} {shown} is allocated "
                    f"(ChannelPoolExhausted), where the nodes have room for {want}; the pods stay gated until a "
                    "channel there is freed (a ComputeDomain deleted), or raise NvlfabricDriver channels_per_clique")
        if self.best_clique is None:
            return f"{job}no NVLink clique with a free channel and a schedulable node for {want}"
        kept = (f" ({self.spares} idle node{'s' if self.spares > 1 else ''} kept there as spares for replacements, "
                "Nvl72Rack spares)" if self.spares else "")
        return (f"{job}no NVLink clique has room for {want}: the most is {self.best_room} such pods, in clique "
                f"{self.best_clique}{kept}; the pods stay gated until a clique has room")


def slots(nodes: Iterable[NodeRoom], gpus_per_pod: int, selector: Mapping[str, str] | None = None) -> int:
    """How many pods of `gpus_per_pod` GPUs these nodes still take (GPU-less pods: any number
    where a node exists, up to a claim's consumer limit per node)."""
    ok = [n for n in nodes if all(n.labels.get(k) == v for k, v in (selector or {}).items())]
    if gpus_per_pod <= 0:
        return len(ok) * MAX_PODS_PER_CLAIM
    return sum(max(0, n.free_gpus) // gpus_per_pod for n in ok)


def held(reserved: Iterable[Reserved], clique: str, gpus_per_pod: int) -> int:
    """Slots of `gpus_per_pod` GPUs that groups placed in `clique` earlier still hold."""
    total = 0
    for r in reserved:
        if r.clique == clique:
            gpus = r.pods * r.gpus_per_pod
            total += math.ceil(gpus / gpus_per_pod) if gpus_per_pod > 0 else 0
    return total


def spares(nodes: Iterable[NodeRoom]) -> int:
    """How many idle nodes a clique keeps as spares: the largest SPARES_LABEL over its nodes."""
    out = 0
    for n in nodes:
        try:
            out = max(out, int(n.labels.get(SPARES_LABEL, "0")))
        except ValueError:
            continue
    return out


def without_spares(nodes: Sequence[NodeRoom]) -> list[NodeRoom]:
    """One clique's nodes a new group may use: all but its spares (that many of its idle nodes,
    the last by name, so the same ones stay free pass after pass)."""
    keep = spares(nodes)
    if keep <= 0:
        return list(nodes)
    idle = sorted((n for n in nodes if n.idle), key=lambda n: n.name)[-keep:]
    kept = {n.name for n in idle}
    return [n for n in nodes if n.name not in kept]


def room(clique: str, nodes: Sequence[NodeRoom], reserved: Iterable[Reserved], group: Group) -> int:
    """The pods of `group` the clique still takes: its nodes but the spares, less the room held."""
    return slots(without_spares([n for n in nodes if n.clique == clique]), group.gpus_per_pod,
                 group.node_selector) - held(reserved, clique, group.gpus_per_pod)


def place(groups: Sequence[Group], nodes: Sequence[NodeRoom], free_channels: Mapping[str, int],
          reserved: Sequence[Reserved] = (), exclude: Iterable[str] = ()) -> dict[tuple[str, str], str] | NoRoom:
    """A clique for every group of one job (all or nothing), each clique used by one group of it and
    holding a free channel, none of `exclude` (the cliques of the job's groups placed before); or
    why the first group that does not fit does not.

    Groups are placed largest first (the hardest to fit), each at the best fit left after the
    ones before it."""
    out: dict[tuple[str, str], str] = {}
    taken = set(exclude)
    channels = dict(free_channels)
    # Each clique's nodes and reservations, indexed once: looking them up in the whole list for
    # every clique made one placement O(cliques x nodes), a 64-rack fleet's 64 domains O(racks^3).
    in_clique: dict[str, list[NodeRoom]] = {}
    for n in nodes:
        in_clique.setdefault(n.clique, []).append(n)
    held_in: dict[str, list[Reserved]] = {}
    for r in reserved:
        held_in.setdefault(r.clique, []).append(r)
    for g in sorted(groups, key=lambda g: (-g.pods * max(g.gpus_per_pod, 1), g.key)):
        options = [(room(c, members, held_in.get(c, ()), g), c) for c, members in sorted(in_clique.items())
                   if channels.get(c, 0) > 0 and c not in taken and g.clique in (None, c)]
        fitting = [(r, c) for r, c in options if r >= g.pods]
        if not fitting:
            best = max(options, default=None)
            exhausted = tuple(c for c, members in sorted(in_clique.items())
                              if channels.get(c, 0) <= 0 and c not in taken and g.clique in (None, c)
                              and room(c, members, held_in.get(c, ()), g) >= g.pods)
            kept = min(spares(in_clique[best[1]]), sum(1 for n in in_clique[best[1]] if n.idle)) if best else 0
            return NoRoom(g, best[1] if best else None, max(0, best[0]) if best else 0, len(groups), len(out),
                          exhausted, kept)
        _, chosen = min(fitting)
        out[g.key] = chosen
        taken.add(chosen)
        channels[chosen] -= 1
        held_in.setdefault(chosen, []).append(Reserved(chosen, g.pods, g.gpus_per_pod))
    return out


def _tolerated(taint: Mapping[str, object], tolerations: Sequence[Mapping[str, object]]) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_rooms(nodes: Iterable[Mapping[str, object]], pods: Iterable[Mapping[str, object]],
               tolerations: Sequence[Mapping[str, object]] = ()) -> list[NodeRoom]:
    """The room on each node a group may use: in a clique (labelled by its agent), Ready,
    schedulable, no NoSchedule/NoExecute taint the group's pods do not tolerate (a sick fabric's
    taint keeps new domains off); free GPUs = allocatable minus what its unfinished pods hold."""
    used: dict[str, int] = {}
    for p in pods:
        spec, status = p.get("spec") or {}, p.get("status") or {}
        assert isinstance(spec, Mapping) and isinstance(status, Mapping)
        if spec.get("nodeName") and status.get("phase") not in ("Succeeded", "Failed"):
            used[str(spec["nodeName"])] = used.get(str(spec["nodeName"]), 0) + gpus_of(p)
    return rooms_of(nodes, used, tolerations)


def with_dra_gpus(node: dict[str, Any], gpus: int | None) -> dict[str, Any]:
    """`node` as placement reads it, counting `gpus` (its GPU slice's untainted devices) as its
    allocatable GPUs when it has none of a device plugin's: with the DRA extended resource the
    scheduler serves `nvidia.com/gpu` requests from the slice there (pure; `node` unchanged)."""
    status = node.get("status") or {}
    alloc = status.get("allocatable") or {}
    if gpus is None or GPU_RESOURCE in alloc:
        return node
    return {**node, "status": {**status, "allocatable": {**alloc, GPU_RESOURCE: str(gpus)}}}


def rooms_of(nodes: Iterable[Mapping[str, object]], used: Mapping[str, int],
             tolerations: Sequence[Mapping[str, object]] = ()) -> list[NodeRoom]:
    """`node_rooms` with the GPUs each node's unfinished pods hold already summed (`used`)."""
    out = []
    for n in nodes:
        meta, spec, status = n.get("metadata") or {}, n.get("spec") or {}, n.get("status") or {}
        assert isinstance(meta, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)
        labels = meta.get("labels") or {}
        assert isinstance(labels, Mapping)
        clique = labels.get(CLIQUE_LABEL)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        taints = [t for t in spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
        if not clique or not ready or spec.get("unschedulable") or any(
                not _tolerated(t, tolerations) for t in taints):
            continue
        alloc = (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")
        taken = used.get(str(meta.get("name")), 0)
        try:
            free = int(str(alloc)) - taken
        except ValueError:
            free = 0
        out.append(NodeRoom(str(meta.get("name")), str(clique), free, dict(labels), idle=taken == 0 and free > 0))
    return out


def gpus_of(pod: Mapping[str, object]) -> int:
    """The GPUs a pod holds on its node: the most of its init containers, or the sum of its
    containers (the scheduler's rule for a pod's effective request), by limit, else request."""
    spec = pod.get("spec") or {}
    assert isinstance(spec, Mapping)

    def one(c: Mapping[str, object]) -> int:
        res = c.get("resources") or {}
        assert isinstance(res, Mapping)
        for part in ("limits", "requests"):
            value = (res.get(part) or {}).get(GPU_RESOURCE)
            if value is not None:
                try:
                    return int(str(value))
                except ValueError:
                    return 0
        return 0

    containers = sum(one(c) for c in spec.get("containers") or [])
    init = max((one(c) for c in spec.get("initContainers") or []), default=0)
    return max(containers, init)
