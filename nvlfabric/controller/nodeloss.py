"""Which member nodes a ComputeDomain lost, and whether it is healed (pure; the why:
docs/architecture.md, "Failure model").

A member node is lost when its Node is NotReady (the kubelet stopped posting status: the node
lifecycle controller says so after its grace period), when the Node is deleted, or, under
`nodeLossPolicy: Replace`, when its agent reports the NVLink fabric unhealthy. A lost node's entry
leaves `status.nodes` (its report may stay on the Node: a dead node withdraws nothing) and goes
to `status.lostNodes`, which the status keeps across passes and controllers: a deleted Node's
report is gone with it, so the status is the only memory that it was a member.

Healed: as many members ready as the domain had when it lost the node (`readyBefore`; the most
over its lost nodes, so two losses in a row need two replacements) and `numNodes` if set, every
member ready. A lost node is forgotten once the domain is healed and the node holds none of its
state (deleted, or no longer reporting), or once it is back (Ready, its fabric healthy): a
NotReady node that still reports stays listed, since its state is cleaned only when it returns.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from nvlfabric.api import computedomain as api


@dataclass(frozen=True)
class NodeLoss:
    """What the pass found for one domain."""

    lost: tuple[api.LostNode, ...]
    """Every lost node still listed, by name."""
    members: tuple[api.NodeStatus, ...]
    """The entries that count as members: the reported ones on nodes that are not lost."""
    healed: bool
    """The domain has as many ready members as before its losses (always, when nothing is lost)."""
    new: tuple[api.LostNode, ...] = ()
    """The losses first seen now (their Event is owed)."""

    def key(self) -> tuple[object, ...]:
        """What a summary depends on (not the fresh timestamps of losses not yet written)."""
        return tuple((n.name, n.reason) for n in self.lost), self.healed


def judge(status: api.ComputeDomainStatus, entries: Sequence[api.NodeStatus], *, down: Mapping[str, str],
          sick: Mapping[str, str], known: Set[str], policy: api.NodeLossPolicy, num_nodes: int | None,
          now: datetime.datetime) -> NodeLoss:
    """The domain's lost nodes and members now (pure). `status`: what the domain's status says
    (the last pass's members and losses); `entries`: the agents' reports now; `down` and `sick`:
    Node name → why it is NotReady / its fabric unhealthy; `known`: the agent Nodes that exist."""
    before = {n.name: n for n in status.lost_nodes}
    ready_before = sum(1 for n in status.nodes if n.ready)
    lost: dict[str, api.LostNode] = {}

    def lose(name: str, reason: api.LostReason, message: str) -> None:
        old = before.get(name)
        lost[name] = old if old is not None else api.LostNode(name=name, reason=reason, message=message[:1024],
                                                             lost_at=now.replace(microsecond=0),
                                                             ready_before=ready_before)

    reported = {e.name for e in entries}
    for e in entries:
        if e.name in down:
            lose(e.name, api.LostReason.NODE_NOT_READY, down[e.name])
        elif policy is api.NodeLossPolicy.REPLACE and e.name in sick:
            lose(e.name, api.LostReason.FABRIC_UNHEALTHY, sick[e.name])
    for n in status.nodes:
        if n.name not in reported and n.name not in known:
            lose(n.name, api.LostReason.NODE_DELETED, "the Node was deleted")
    members = tuple(e for e in entries if e.name not in lost)
    ready = sum(1 for e in members if e.ready)
    target = max([n.ready_before for n in (*lost.values(), *before.values())] + [num_nodes or 0])
    healed = ready >= target and ready == len(members)
    for name, old in before.items():
        if name in lost:
            continue
        back = name in known and name not in down and not (policy is api.NodeLossPolicy.REPLACE and name in sick)
        if not back and not healed:
            lost[name] = old  # replaced not yet: still told, though it holds nothing of the domain now
    if healed:
        # A healed domain forgets the lost nodes that hold none of its state any more.
        lost = {name: n for name, n in lost.items() if name in reported}
    new = tuple(n for name, n in sorted(lost.items()) if name not in before)
    return NodeLoss(tuple(n for _, n in sorted(lost.items())), members, healed or not lost, new)


def membership_change(status: api.ComputeDomainStatus, loss: NodeLoss) -> tuple[list[str], list[str]]:
    """The member nodes that joined and left a Ready domain since its last status (pure): a grow,
    a shrink, a replacement joining. Nodes lost are told by their own Event, not as left; a
    domain still forming (not Ready before) changes members by design, which is no news."""
    if status.phase is not api.Phase.READY:
        return [], []
    before = {n.name for n in status.nodes}
    now = {e.name for e in loss.members}
    lost = {n.name for n in loss.lost}
    return sorted(now - before), sorted(before - now - lost)


def describe(loss: NodeLoss, *, policy: api.NodeLossPolicy, clique: str | None, free_nodes: int | None) -> str:
    """The NodesAvailable condition's message: which nodes, why, and what is done about them.
    `free_nodes`: nodes of the clique with a free GPU (None: not known)."""
    lost = "; ".join(f"node {n.name} lost ({n.reason}: {n.message})" for n in loss.lost)
    where = f"clique {clique}" if clique else "its clique"
    if loss.healed:
        return (f"{lost}; replaced: the domain has as many ready members as before; the node is cleaned of the "
                "domain's state when it is back")
    if policy is api.NodeLossPolicy.KEEP:
        return (f"{lost}; nodeLossPolicy Keep: its pods are left to Kubernetes (evicted after their "
                "tolerationSeconds); set nodeLossPolicy Replace to have them replaced at once")
    if free_nodes == 0:
        return (f"{lost}; waiting for a node: no node of {where} has a free GPU, so the replacement pods stay "
                "gated, holding no GPU, until one has (a spare, a node back, or a job finished)")
    return f"{lost}; its pods are failed as disrupted and replaced on a free node of {where}"
