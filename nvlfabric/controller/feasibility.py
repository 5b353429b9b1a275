"""Whether a ComputeDomain that has no channel yet can get one, from the cluster and the driver as
they are (pure functions; the controller feeds them every pass).

Why: a domain the cluster can never satisfy used to sit in Pending or Allocating for good, its
pods gated or Pending, with nothing saying why (issue 17). The API promises `Failed` with the
reason instead. What is judged, and how sure the verdict is:

| reason               | when                                                               | sure?      |
|----------------------|--------------------------------------------------------------------|------------|
| `IMEXModeNotAllowed` | `imexMode` is not in the driver's `imex_modes`                     | yes        |
| `NoCliques`          | no node with an agent is in a clique at all                        | inventory  |
| `UnknownClique`      | `placement.clique` names a clique no node with an agent is in      | inventory  |
| `NotEnoughCliques`   | `placement.cliques` is more than the cliques the cluster has       | inventory  |
| `TooManyNodes`       | fewer nodes than `numNodes` asks for in one clique (per group)     | inventory  |
| `ChannelPoolExhausted` | every channel of the cliques it may use is allocated             | transient  |

A verdict from the driver's settings is final: the domain is `Failed` at once. One from the node
inventory depends on agents that may still be starting (a `pulumi up` that creates the racks, the
driver and the domain together): it is `Failed` once the domain is `INVENTORY_GRACE_S` old, and
`Pending` with the same reason before that. An exhausted pool is never `Failed`: a domain deleted
there frees a channel. Every verdict is recomputed each pass, so a rack added later lifts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvlfabric.api import computedomain as api
from nvlfabric.api import names

INVENTORY_GRACE_S = 30.0
"""How old a domain is before a verdict from the node inventory fails it (agents starting)."""


@dataclass(frozen=True)
class Inventory:
    """What the controller knows of the cluster and the driver."""

    nodes: Mapping[str, int]
    """Clique → how many Nodes its agents labelled with it."""
    free_channels: Mapping[str, int]
    """Clique → channels of its pool not allocated to any domain's claim."""
    modes: frozenset[api.IMEXMode]
    """The driver's imex_modes (the agents prepare no other mode)."""
    channels_per_clique: int


@dataclass(frozen=True)
class Verdict:
    reason: str
    message: str
    final: bool = False
    """True: Failed at once; False: Failed after INVENTORY_GRACE_S."""
    transient: bool = False
    """True: never Failed (the domain waits, Pending, with this reason)."""


def _listed(cliques: Mapping[str, int]) -> str:
    shown = sorted(cliques)[:5]
    more = f" and {len(cliques) - 5} more" if len(cliques) > 5 else ""
    return ", ".join(f"{c} ({cliques[c]} nodes)" for c in shown) + more if cliques else "none"


def verdict(spec: api.ComputeDomainSpec, inv: Inventory, placed: int = 0) -> Verdict | None:
    """Why `spec` cannot get its channels now (None: it can, as far as the controller knows).
    `placed`: how many of a MultiClique domain's groups have a channel already."""
    if spec.imex_mode not in inv.modes:
        allowed = sorted(m.value for m in inv.modes)
        return Verdict("IMEXModeNotAllowed", (
            f"imexMode {spec.imex_mode.value} is not allowed by the driver (NvlfabricDriver imex_modes: "
            f"{', '.join(allowed)}), so no node would prepare its channel; recreate the ComputeDomain with imexMode "
            f"{allowed[0]}, or add {spec.imex_mode.value} to the driver's imex_modes"), final=True)
    pinned = spec.placement.clique
    groups = spec.groups
    if not inv.nodes:
        return Verdict("NoCliques", (
            "no node of this cluster is in an NVLink clique yet: no nvlfabric agent has labelled its Node "
            f"{names.CLIQUE_LABEL} (is NvlfabricDriver installed and its agents Running? `kubectl get nodes -L "
            f"{names.CLIQUE_LABEL},{names.FABRIC_READY_LABEL}`)"))
    if pinned is not None and pinned not in inv.nodes:
        return Verdict("UnknownClique", (
            f"placement.clique {pinned} is not a clique of this cluster: no node with an nvlfabric agent is in it "
            f"(cliques: {_listed(inv.nodes)}); pin one of those, or leave placement.clique out"))
    if groups > 1 and groups > len(inv.nodes):
        return Verdict("NotEnoughCliques", (
            f"placement.cliques {groups} needs {groups} NVLink cliques; the cluster has {len(inv.nodes)} "
            f"({_listed(inv.nodes)}); lower placement.cliques, or add racks"))
    candidates = {c: n for c, n in inv.nodes.items() if pinned is None or c == pinned}
    need = (spec.num_nodes or 0) // groups
    big = {c: n for c, n in candidates.items() if n >= need}
    if spec.num_nodes is not None and len(big) < groups:
        largest = max(candidates.items(), key=lambda cn: (cn[1], cn[0]), default=None)
        where = (f"; the largest{' allowed' if pinned else ''} clique, {largest[0]}, has {largest[1]}"
                 if largest else "")
        per = f" in each of {groups} cliques ({len(big)} have that many)" if groups > 1 else " in one clique"
        return Verdict("TooManyNodes", (
            f"numNodes {spec.num_nodes} needs {need} nodes{per}{where}; lower numNodes, or add nodes to the "
            "racks"))
    with_channel = sorted(c for c in big if inv.free_channels.get(c, inv.channels_per_clique) > 0)
    if len(with_channel) < groups - placed:
        full = sorted(c for c in big if c not in with_channel)
        return Verdict("ChannelPoolExhausted", (
            f"every channel of clique{'s' if len(full) > 1 else ''} {', '.join(full[:5])} is allocated "
            f"({inv.channels_per_clique} per clique: NvlfabricDriver channels_per_clique); the domain waits until "
            "a ComputeDomain there is deleted, or raise channels_per_clique"), transient=True)
    return None


def phase_of(v: Verdict, age_s: float) -> api.Phase:
    """Failed or Pending for a domain with verdict `v` that is `age_s` seconds old."""
    if v.transient or (not v.final and age_s < INVENTORY_GRACE_S):
        return api.Phase.PENDING
    return api.Phase.FAILED
