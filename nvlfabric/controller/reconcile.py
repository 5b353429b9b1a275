"""The nvlfabric controller: clique channel pools and each ComputeDomain's summary status.

One working replica per cluster, the Lease holder (nvlfabric/controller/leader.py; same image
as the node agent). Each pass it
- publishes one channel pool per clique that has Nodes labelled `nvlfabric.io/clique`, and
  withdraws pools of cliques that no longer have any (nvlfabric/controller/pools.py);
- for every ComputeDomain, copies the node agents' reports from their Nodes (annotations
  `nvlfabric.io/cd-<hash>`) into `status.nodes`, derives `phase`, `clique`, `channel`,
  `readyNodes`, `totalNodes`, the `Ready` condition and `observedGeneration` from them and the
  channel claim's allocation, and `unhealthyNodes` and the `FabricHealthy` condition from the
  members' Node condition `NVLinkFabricReady` (a Ready domain with a member on a sick node is
  Degraded), and writes them with server-side apply under its own field manager: the one writer
  of a domain's status (72 agents applying their own entries to one object made the API server
  retry each apply over and over);
- gives each `imexMode: Dedicated` domain an IMEX port slot (`status.imexPortSlot`) once its
  clique is known: unique among the clique's dedicated domains, kept for the domain's life, so
  every member starts its daemon on the same ports without talking to the others;
- records each dedicated domain's `status.imexAuthentication` (its spec, else the driver's
  default) and, for TLS, its authority's certificate in `status.imexCABundle`, and signs its
  members' IMEX certificates (nvlfabric/controller/imexauth.py).

It also keeps the tenancy rules: channel claims that are no live domain's own are deleted
(strayclaims.py), and each namespace with a domain keeps its channel quota (quota.py).

Reservations, placement and Kueue admission run beside the passes, on the same informers
(wiring.py starts them all); this module imports none of them.

Reconciliation is level-based (a full pass every few seconds), so a missed event never leaves a
domain stale; a watch on ComputeDomains also starts a domain pass soon after any change, so a
summary follows its members without waiting out the interval. `summarize` is pure and
table-tested.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.resources.resource_v1 import DeviceClass
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.controller import (
    endpoint,
    events,
    feasibility,
    imexauth,
    lostpods,
    nodeloss,
    placement,
    pools,
    quota,
    strayclaims,
)
from nvlfabric.controller.cache import AgentNode, ComputeDomainResource, DomainRecord, Informers, cluster_use
from nvlfabric.controller.informer import Informer
from nvlfabric.controller.members import Members
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.controller")


@dataclass(frozen=True)
class SlotRequest:
    """A dedicated ComputeDomain as slot assignment sees it."""

    key: str  # namespace/name
    clique: str | None  # None until its claim is allocated
    slot: int | None  # what its status says now
    created: str = ""  # creationTimestamp: the older domain keeps a contested slot


def assign_port_slots(domains: Sequence[SlotRequest]) -> dict[str, int | None]:
    """IMEX port slots for dedicated domains (pure): per clique, a slot already held stays (the
    members' daemons run on it); a domain without one gets the lowest free slot 1..99; None when
    its clique is unknown or every slot is taken. Two holders of one slot (two controllers raced)
    are settled for the older domain."""
    out: dict[str, int | None] = {}
    by_clique: dict[str, list[SlotRequest]] = {}
    for d in domains:
        if d.clique is None:
            out[d.key] = None
        else:
            by_clique.setdefault(d.clique, []).append(d)
    for group in by_clique.values():
        group.sort(key=lambda d: (d.created, d.key))
        taken: set[int] = set()
        waiting: list[SlotRequest] = []
        for d in group:
            if d.slot is not None and 1 <= d.slot <= names.MAX_IMEX_PORT_SLOT and d.slot not in taken:
                taken.add(d.slot)
                out[d.key] = d.slot
            else:
                waiting.append(d)
        free = (n for n in range(1, names.MAX_IMEX_PORT_SLOT + 1) if n not in taken)
        for d in waiting:
            out[d.key] = next(free, None)
    return out


def group_status(claims: Sequence[tuple[str, tuple[str, int] | None]],
                 nodes: Sequence[api.NodeStatus]) -> list[dict[str, Any]]:
    """A MultiClique domain's `status.groups` (pure): per claim, its clique and channel and the
    members in that clique."""
    out = []
    for index, (claim, alloc) in enumerate(claims):
        members = [n for n in nodes if alloc is not None and n.clique == alloc[0]]
        out.append(api.GroupStatus(index=index, claim=claim, clique=alloc[0] if alloc else None,
                                   channel=alloc[1] if alloc else None, nodes=[n.name for n in members],
                                   ready_nodes=sum(1 for n in members if n.ready)).model_dump(
            mode="json", by_alias=True, exclude_none=True))
    return out


def summarize(spec: api.ComputeDomainSpec, status: api.ComputeDomainStatus, generation: int,
              allocation: tuple[str, int] | None, *, port_slot: int | None = None, now: Any = None,
              unhealthy: Mapping[str, str] | None = None,
              groups: Sequence[tuple[str, tuple[str, int] | None]] | None = None,
              blocked: tuple[api.Phase, str, str] | None = None,
              loss: tuple[Sequence[api.LostNode], bool, str] | None = None) -> dict[str, Any]:
    """The controller-owned status fields for one domain (pure). `unhealthy`: Node name → why its
    agent reports the NVLink fabric unhealthy (its NVLinkFabricReady condition), for every node.
    `groups`: a MultiClique domain's claims with their allocations, in group order (then
    `allocation` is ignored: the domain has a channel once every group has one). `blocked`:
    phase, reason and message while the domain has no channel and cannot get one now
    (nvlfabric/controller/feasibility.py). `loss`: the lost nodes, whether the domain is healed,
    and what is done about them (nodeloss.py); `status.nodes` then holds the members that are not lost."""
    nodes = status.nodes
    lost, healed, loss_message = loss if loss is not None else ((), True, "")
    dedicated = spec.imex_mode is api.IMEXMode.DEDICATED
    sick = [(n.name, (unhealthy or {})[n.name]) for n in nodes if n.name in (unhealthy or {})]
    placed = sum(1 for _, a in groups if a is not None) if groups is not None else None
    phase, reason, message = _phase(spec, status, allocation, port_slot=port_slot, sick=sick, groups=groups,
                                    placed=placed, blocked=blocked)
    if lost and not healed and phase is not api.Phase.FAILED:
        was_ready = status.phase in (api.Phase.READY, api.Phase.DEGRADED)
        phase, reason = (api.Phase.DEGRADED if was_ready else api.Phase.ALLOCATING), "NodeLost"
        message = f"{sum(1 for n in nodes if n.ready)} of {len(nodes)} nodes ready; {loss_message}"
    out: dict[str, Any] = {
        "phase": phase.value, "readyNodes": sum(1 for n in nodes if n.ready), "totalNodes": len(nodes),
        "observedGeneration": generation,
        "conditions": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in
                       _conditions(status, phase, reason, message, sick, generation=generation, now=now,
                                   lost=(lost, loss_message))],
    }
    if sick:
        out["unhealthyNodes"] = [name for name, _ in sick]
    if lost:
        out["lostNodes"] = [n.model_dump(mode="json", by_alias=True, exclude_none=True) for n in lost]
    if groups is not None:
        out["groups"], out["placedCliques"] = group_status(groups, nodes), placed
    elif allocation is not None:
        out["clique"], out["channel"] = allocation
        out["placedCliques"] = 1
    if dedicated and port_slot is not None:
        out["imexPortSlot"] = port_slot
    return out


def _phase(spec: api.ComputeDomainSpec, status: api.ComputeDomainStatus, allocation: tuple[str, int] | None, *,
           port_slot: int | None, sick: Sequence[tuple[str, str]],
           groups: Sequence[tuple[str, tuple[str, int] | None]] | None, placed: int | None,
           blocked: tuple[api.Phase, str, str] | None) -> tuple[api.Phase, str, str]:
    """The domain's phase, with the reason and message of its Ready condition (see summarize)."""
    nodes = status.nodes
    ready = [n for n in nodes if n.ready]
    unplaced = allocation is None if groups is None else placed != len(groups)
    if blocked is not None and unplaced:
        return blocked
    if groups is not None and placed != len(groups):
        return api.Phase.PENDING, "GroupsNotPlaced", (
            f"{placed} of {len(groups)} clique groups have a channel; the controller places all of them at "
            "once where each fits (see the claims' NoCliqueRoom events)")
    if groups is None and allocation is None:
        return api.Phase.PENDING, "NoChannel", "waiting for a member pod to be scheduled"
    if spec.imex_mode is api.IMEXMode.DEDICATED and port_slot is None and allocation is not None:
        return api.Phase.FAILED, "NoIMEXPortSlot", (
            f"every IMEX port slot (1-{names.MAX_IMEX_PORT_SLOT}) of clique {allocation[0]} is held by another "
            "dedicated ComputeDomain; delete one, or use imexMode CliqueScoped")
    if nodes and len(ready) == len(nodes) and (spec.num_nodes is None or len(ready) >= spec.num_nodes):
        message = f"{len(ready)} of {len(nodes)} nodes ready"
        if sick:  # members run, slower or cut off: Degraded, so that it is seen; the pods are not touched
            return api.Phase.DEGRADED, "FabricUnhealthy", (
                f"{message}; node {sick[0][0]}: NVLink fabric unhealthy: {sick[0][1]}")
        return api.Phase.READY, "AllMembersReady", message
    was_ready = status.phase in (api.Phase.READY, api.Phase.DEGRADED)
    if was_ready and not nodes:
        # Every member left, and the domain holds its channels (reservations.py): a workload
        # that finished, or one recreating its pods (a JobSet restart), which come back here.
        return api.Phase.DEGRADED, "NoMembers", (
            "no member pod runs; the domain keeps its clique and channel for the next ones (its "
            "workload finished, or is recreating its pods)")
    want = f" (numNodes {spec.num_nodes})" if spec.num_nodes else ""
    first = next((n for n in nodes if not n.ready), None)
    detail = f"; node {first.name}: {first.message or 'not ready'}" if first else ""
    message = f"{len(ready)} of {len(nodes)} nodes ready{want}{detail}"
    if was_ready:
        return api.Phase.DEGRADED, "MemberNotReady", message
    return api.Phase.ALLOCATING, "MembersJoining", message


def _conditions(status: api.ComputeDomainStatus, phase: api.Phase, reason: str, message: str,
                sick: Sequence[tuple[str, str]], *, generation: int, now: Any,
                lost: tuple[Sequence[api.LostNode], str] = ((), "")) -> tuple[api.Condition, ...]:
    """Ready, FabricHealthy and NodesAvailable, each keeping its transition time while its status
    (and for Ready, its reason) stays."""
    cond = api.condition("Ready", api.ConditionStatus.TRUE if phase == api.Phase.READY else api.ConditionStatus.FALSE,
                         reason, message, generation=generation, now=now)
    old = next((c for c in status.conditions if c.type == "Ready"), None)
    if old is not None and old.status == cond.status and old.reason == reason:
        cond = cond.model_copy(update={"last_transition_time": old.last_transition_time})
    fabric = api.condition(
        api.ConditionType.FABRIC_HEALTHY, api.ConditionStatus.FALSE if sick else api.ConditionStatus.TRUE,
        "FabricUnhealthy" if sick else "FabricHealthy",
        "; ".join(f"node {name}: {why}" for name, why in sick)[:32768] if sick
        else "no member node reports an unhealthy NVLink fabric", generation=generation, now=now)
    old_fabric = next((c for c in status.conditions if c.type == api.ConditionType.FABRIC_HEALTHY), None)
    if old_fabric is not None and old_fabric.status == fabric.status:
        fabric = fabric.model_copy(update={"last_transition_time": old_fabric.last_transition_time})
    gone, why = lost
    available = api.condition(
        api.ConditionType.NODES_AVAILABLE, api.ConditionStatus.FALSE if gone else api.ConditionStatus.TRUE,
        str(gone[0].reason) if gone else "NoNodeLost", why[:32768] if gone else "no member node is lost",
        generation=generation, now=now)
    old_available = next((c for c in status.conditions if c.type == api.ConditionType.NODES_AVAILABLE), None)
    if old_available is not None and old_available.status == available.status:
        available = available.model_copy(update={"last_transition_time": old_available.last_transition_time})
    return cond, fabric, available


def _key(cd: api.ComputeDomain) -> str:
    return f"{cd.metadata.namespace or 'default'}/{cd.metadata.name}"


def _age_s(obj: Any, now: datetime.datetime) -> float:
    """Seconds since the object's creationTimestamp (0 when it has none)."""
    stamp = obj.metadata.creationTimestamp if obj.metadata else None
    if isinstance(stamp, str):
        stamp = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (now - stamp).total_seconds() if isinstance(stamp, datetime.datetime) else 0.0


def free_channels(held: Iterable[tuple[str, int]], per_clique: int) -> dict[str, int]:
    """Clique → channels of its pool no claim holds (pure). `held`: every allocated channel device,
    (clique, channel), of every claim, a domain's or not: a pool counts devices, not claims."""
    used: dict[str, set[int]] = {}
    for clique, channel in held:
        used.setdefault(clique, set()).add(channel)
    return {c: max(0, per_clique - len(n)) for c, n in used.items()}


OWNER_TTL_S = 10.0
ROTATION_EVENTS = {
    "introduce": ("IMEXAuthorityIntroduced", "a new IMEX authority is trusted beside the current one "
                                             "(status.imexCABundle holds both); it signs once every ready member "
                                             "trusts it"),
    "switch": ("IMEXAuthoritySwitched", "the new IMEX authority signs; members renew their certificates, and the "
                                        "old authority is dropped once none uses it"),
    "retire": ("IMEXAuthorityRotated", "the old IMEX authority is no longer trusted: rotation complete"),
}
"""The Events (reason, message) of an authority rotation's steps (controller/imexauth.py)."""
"""How long the DeviceClass read for the pools' owner is trusted while the informers watch."""


def write_status(client: Client, domains: Informer[DomainRecord], obj: Any, cd: api.ComputeDomain,
                 allocs: list[tuple[str, tuple[str, int] | None]], port_slot: int | None,
                 unhealthy: Mapping[str, str] | None = None, entries: Sequence[api.NodeStatus] = (),
                 blocked: tuple[api.Phase, str, str] | None = None, auth: Mapping[str, str] | None = None,
                 loss: tuple[Sequence[api.LostNode], bool, str] | None = None) -> None:
    """Write one domain's summary status (server-side apply under the controller's field manager),
    unless it says what the status says already; `domains` learns what was written at once."""
    name, namespace = cd.metadata.name, cd.metadata.namespace or "default"
    status = cd.status or api.ComputeDomainStatus()
    current = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    # The members are the agents' reports on their Nodes: this writes them, the one writer of
    # the domain's status (docs/architecture.md, "Who writes a domain's status").
    status = status.model_copy(update={"nodes": list(entries)})
    generation = int((obj.metadata.generation if obj.metadata else None) or 0)
    multi = cd.spec.placement.cliques is not None
    summary = summarize(cd.spec, status, generation, allocs[0][1], port_slot=port_slot, unhealthy=unhealthy,
                        groups=allocs if multi else None, blocked=blocked, loss=loss)
    summary["nodes"] = [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in entries]
    summary.update(auth or {})
    # unhealthyNodes is left out of a summary when empty (the apply then removes it): compare it too.
    if all(current.get(k) == v for k, v in summary.items() if k not in ("conditions", "nodes")) and \
            (current.get("nodes") or []) == summary["nodes"] and \
            (current.get("unhealthyNodes") or []) == summary.get("unhealthyNodes", []) and \
            (current.get("lostNodes") or []) == summary.get("lostNodes", []) and \
            [(c.get("status"), c.get("reason"), c.get("message")) for c in current.get("conditions", [])] == \
            [(c["status"], c["reason"], c["message"]) for c in summary["conditions"]]:
        return
    stale = {n.get("name") for n in current.get("nodes") or []} - {n["name"] for n in summary["nodes"]}
    if stale:
        # Entries another field manager owns (agents before session 6 applied their own) are
        # not removed by our apply, which would then differ from the summary every pass: a
        # merge patch replaces the list whole, whoever owned its items.
        client.patch(ComputeDomainResource.Status, name, {"status": {"nodes": summary["nodes"]}},
                     namespace=namespace, patch_type=PatchType.MERGE)
        log.info("ComputeDomain %s/%s: dropped status entries of nodes that report no membership: %s",
                 namespace, name, ", ".join(sorted(str(s) for s in stale)))
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": namespace},
            "status": summary}
    written = client.patch(ComputeDomainResource.Status, name, body, namespace=namespace, patch_type=PatchType.APPLY,
                           field_manager=names.CONTROLLER_FIELD_MANAGER, force=True)
    domains.put(written)  # the next pass reads what was written, not the watch's lag
    log.info("ComputeDomain %s/%s: %s", namespace, name, summary["phase"])


def poke_on_changes(cache: Informers, poke: threading.Event) -> None:
    """Poke the loop when what a summary reads changes, so a domain's summary follows within a
    debounce, not a full interval: any domain or claim change, and of the agents' Nodes only
    their reports, clique, fabric health and readiness (a kubelet's status updates are not news)."""
    def any_change(kind: str, key: Any, old: Any, new: Any) -> None:
        poke.set()

    def node_change(kind: str, key: Any, old: AgentNode | None, new: AgentNode | None) -> None:
        if old is None or new is None or (old.clique, old.unhealthy, old.down, old.reports) != \
                (new.clique, new.unhealthy, new.down, new.reports):
            poke.set()

    cache.domains.listen(any_change)
    cache.claims.listen(any_change)
    cache.slices.listen(any_change)
    cache.gpus.listen(any_change)  # a GPU tainted or healthy again changes a node's room
    cache.nodes.listen(node_change)


class Controller:
    def __init__(self, client: Client, *, channels_per_clique: int = names.DEFAULT_CHANNELS_PER_CLIQUE,
                 imex_modes: frozenset[api.IMEXMode] = frozenset(api.IMEXMode),
                 informers: Informers | None = None,
                 imex_authentication: api.IMEXAuthentication = api.IMEXAuthentication.DISABLED,
                 imex_cert_validity_s: float = names.DEFAULT_IMEX_CERT_VALIDITY_S,
                 channel_quota_per_namespace: int = names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE) -> None:
        self.client = client
        self.quotas = quota.Quotas(client, channel_quota_per_namespace)
        self.channels = channels_per_clique
        self.imex_modes = imex_modes
        self.imex_authentication = imex_authentication
        """The driver's default for dedicated domains whose spec does not say."""
        self.issuer = imexauth.Issuer(client, validity_s=imex_cert_validity_s)
        self.cache = informers or Informers.of(client)
        self.members = Members(self.cache.nodes)
        """Each domain's member entries, fabric health and Nodes per clique, kept per Node change."""
        self.clique_nodes: dict[str, int] = {}
        """Clique → Nodes its agents labelled with it, as of the last domain pass."""
        self._owner_read: tuple[float, pools.Owner | None] | None = None
        self._pool_seen: dict[str, Any] = {}
        """Clique → what its pool was last reconciled against: unchanged, it is not planned again."""
        self._domain_seen: dict[str, Any] = {}
        """Domain → the inputs of its last summary: unchanged, it is not summarised again."""
        self._acted: set[tuple[str, str]] = set()
        """(domain uid, node) of the lost nodes whose pods were failed, while they are lost."""

    def _owner(self) -> pools.Owner | None:
        if self._owner_read is not None and self.cache.nodes.watching and \
                time.monotonic() - self._owner_read[0] < OWNER_TTL_S:
            return self._owner_read[1]
        try:
            with api_call(f"read DeviceClass {names.DEVICE_CLASS}"):
                dc = self.client.get(DeviceClass, names.DEVICE_CLASS)
        except errors.NotFound:
            owner = None
        else:
            assert dc.metadata is not None
            owner = pools.Owner("resource.k8s.io/v1", "DeviceClass", names.DEVICE_CLASS, dc.metadata.uid or "")
        self._owner_read = (time.monotonic(), owner)
        return owner

    def reconcile_pools(self) -> set[str]:
        owner = self._owner()
        if owner is None:
            # Without the DeviceClass nobody can claim channels, and pools published now would
            # outlive an uninstall; publish once the driver install has created it.
            log.warning("DeviceClass %s does not exist; not publishing channel pools", names.DEVICE_CLASS)
        self.cache.nodes.sync()
        cliques = set(self.members.cliques())
        by_clique: dict[str | None, list[Any]] = {}
        for s in self.cache.slices.fresh().values():
            pool = (s.metadata.labels or {}).get(names.POOL_LABEL, "")
            by_clique.setdefault(names.clique_of_pool(pool), []).append(s)
        for clique in sorted(cliques) if owner is not None else []:
            have = by_clique.get(clique, [])
            seen = (self.channels, owner, tuple(sorted((s.metadata.name, s.metadata.resourceVersion) for s in have)))
            if self._pool_seen.get(clique) == seen:
                continue
            done = pools.apply(self.client, clique, self.channels, owner, existing=have)
            self._pool_seen[clique] = seen if done.empty() else None
            if not done.empty():
                log.info("clique %s: pool updated (%d created, %d updated, %d deleted)", clique, len(done.create),
                         len(done.update), len(done.delete))
        for gone in sorted(c for c in by_clique.keys() - cliques if c is not None):
            log.info("clique %s has no nodes any more: withdrawing its pool", gone)
            pools.withdraw(self.client, gone)
            self._pool_seen.pop(gone, None)
        return cliques

    def reconcile_domains(self) -> None:
        seen: list[tuple[Any, api.ComputeDomain, list[tuple[str, tuple[str, int] | None]], tuple[str, ...]]] = []
        self.cache.nodes.sync()
        unhealthy, self.clique_nodes = self.members.unhealthy(), self.members.cliques()
        down, known = self.members.down(), self.members.known()
        free_nodes: dict[str, int] | None = None  # clique → nodes with a free GPU, read once a pass if needed
        claims = self.cache.claims.fresh()
        for (namespace, name), record in sorted(self.cache.domains.fresh().items()):
            cd = record.cd
            if cd is None:
                log.warning("ComputeDomain %s/%s: %s", namespace, name, record.error)
                continue
            refs = [claims.get((namespace or "default", c)) for c in api.channel_claim_names(cd.metadata.name, cd.spec)]
            seen.append((record.obj, cd, [(c, r.allocation if r else None) for c, r in
                                          zip(api.channel_claim_names(cd.metadata.name, cd.spec), refs, strict=True)],
                         tuple(r.rv if r else "" for r in refs)))
        slots = assign_port_slots([
            SlotRequest(_key(cd), allocs[0][1][0] if allocs[0][1] else None,
                        cd.status.imex_port_slot if cd.status else None,
                        str(obj.metadata.creationTimestamp or "") if obj.metadata else "")
            for obj, cd, allocs, _ in seen if cd.spec.imex_mode is api.IMEXMode.DEDICATED])
        inventory = feasibility.Inventory(
            nodes=self.clique_nodes, modes=self.imex_modes, channels_per_clique=self.channels,
            free_channels=free_channels((ch for rec in claims.values() for ch in rec.channels), self.channels))
        now = datetime.datetime.now(datetime.UTC)
        live, served = set(), set()
        lost_now: set[tuple[str, str]] = set()
        tls: dict[str, imexauth.TlsDomain] = {}
        for obj, cd, allocs, claim_rvs in seen:
            key = _key(cd)
            live.add(key)
            domain = (cd.metadata.namespace or "default", cd.metadata.name)
            served.add(domain)
            version, members = self.members.of(domain)
            try:
                auth = self._imex_auth(obj, cd, members, tls)
            except errors.NvlfabricError as exc:
                log.warning("ComputeDomain %s: IMEX authority: %s", key, exc)
                continue
            status = cd.status or api.ComputeDomainStatus()
            clique = allocs[0][1][0] if allocs[0][1] is not None and len(allocs) == 1 else None
            sick = unhealthy
            if unhealthy and any(m.name in unhealthy for m in members):
                # A sick fabric is slower, not gone: its members move only where a node is free
                # (a dead node's pods are lost anyway, and replaced when a node frees up).
                if free_nodes is None:
                    free_nodes = self._free_nodes()
                sick = unhealthy if clique is not None and free_nodes.get(clique, 0) > 0 else {}
            loss = nodeloss.judge(status, members, down=down, sick=sick, known=known,
                                  policy=cd.spec.loss_policy, num_nodes=cd.spec.num_nodes, now=now)
            free = None
            if loss.lost and not loss.healed and clique is not None:
                if free_nodes is None:
                    free_nodes = self._free_nodes()
                free = free_nodes.get(clique, 0)
            told = nodeloss.describe(loss, policy=cd.spec.loss_policy, clique=clique, free_nodes=free)
            placed = sum(1 for _, a in allocs if a is not None)
            why = feasibility.verdict(cd.spec, inventory, placed) if placed < len(allocs) else None
            blocked = (feasibility.phase_of(why, _age_s(obj, now)), why.reason, why.message) if why else None
            # The members' version changes with their entries and their fabric health (members.py).
            inputs = ((obj.metadata.resourceVersion if obj.metadata else None), claim_rvs, blocked, slots.get(key),
                      version, auth, loss.key(), told)
            self._replace_lost(obj, cd, loss, allocs)  # every pass until done: a failed try is tried again
            lost_now.update((str(obj.metadata.uid if obj.metadata else ""), n.name) for n in loss.lost)
            if self._domain_seen.get(key) == inputs:
                continue  # nothing it is summarised from changed since its last pass
            try:
                with api_call(f"update the status of ComputeDomain {key}"):
                    write_status(self.client, self.cache.domains, obj, cd, allocs, slots.get(key), unhealthy,
                                 loss.members, blocked, auth, loss=(loss.lost, loss.healed, told))
                self._domain_seen[key] = inputs
                self._after_loss(obj, cd, status, loss, told)
            except (errors.NvlfabricError, ValueError) as exc:
                self._domain_seen.pop(key, None)
                log.warning("ComputeDomain %s: %s", key, exc)
        for gone in self._domain_seen.keys() - live:
            del self._domain_seen[gone]
        self._acted &= lost_now  # a node lost again later is acted on again
        self.members.forget(served)
        try:
            if tls:
                self.issuer.serve(tls)
            # Every domain the informer holds keeps its authority, even one whose spec does not parse now.
            self.issuer.collect(str(r.obj.metadata.uid) for r in self.cache.domains.fresh().values()
                                if r.obj is not None and r.obj.metadata is not None)
        except errors.NvlfabricError as exc:
            log.warning("IMEX certificates: %s", exc)

    def _free_nodes(self) -> dict[str, int]:
        """Clique → its Ready, schedulable, untainted agent Nodes with a free GPU (what a replacement needs)."""
        nodes, used = cluster_use(self.cache)
        out: dict[str, int] = {}
        for room in placement.rooms_of(nodes, used):
            if room.free_gpus > 0:
                out[room.clique] = out.get(room.clique, 0) + 1
        return out

    def _after_loss(self, obj: Any, cd: api.ComputeDomain, before: api.ComputeDomainStatus, loss: nodeloss.NodeLoss,
                    told: str) -> None:
        """Once a summary is written: the Events of a node lost, of members joined or left, and of
        the domain healed."""
        namespace, name = cd.metadata.namespace or "default", cd.metadata.name
        uid = str((obj.metadata.uid if obj.metadata else None) or "")
        for n in loss.new:
            events.event(self.client, namespace, api.KIND, api.API_VERSION, name, uid, "NodeLost",
                         f"member {told}" if told.startswith(f"node {n.name} lost") else
                         f"member node {n.name} lost ({n.reason}: {n.message}); {told}")
        joined, left = nodeloss.membership_change(before, loss)
        if joined or left:  # a grown or shrunk job, a replacement joining: `kubectl describe cd` says so
            endpoint.MEMBER_CHANGES.labels("joined").inc(len(joined))
            endpoint.MEMBER_CHANGES.labels("left").inc(len(left))
            events.event(self.client, namespace, api.KIND, api.API_VERSION, name, uid, "MembersChanged",
                         "; ".join([*([f"joined: {', '.join(joined)}"] if joined else []),
                                    *([f"left: {', '.join(left)}"] if left else []),
                                    f"{len(loss.members)} member nodes now"]), type_="Normal")
        was_lost = next((c.reason == "NodeLost" for c in before.conditions if c.type == "Ready"), False)
        if was_lost and loss.healed:
            events.event(self.client, namespace, api.KIND, api.API_VERSION, name, uid, "NodeLossHealed",
                         f"{sum(1 for e in loss.members if e.ready)} members ready again after the loss of "
                         f"{', '.join(n.name for n in before.lost_nodes) or 'a node'}", type_="Normal")

    def _replace_lost(self, obj: Any, cd: api.ComputeDomain, loss: nodeloss.NodeLoss,
                      allocs: Sequence[tuple[str, tuple[str, int] | None]]) -> None:
        """Under nodeLossPolicy Replace, the pods of each lost node not acted on yet are failed so
        that their workload replaces them (lostpods.py), once per loss and replica."""
        if cd.spec.loss_policy is not api.NodeLossPolicy.REPLACE or not loss.lost:
            return
        namespace, name = cd.metadata.namespace or "default", cd.metadata.name
        uid = str((obj.metadata.uid if obj.metadata else None) or "")
        for n in loss.lost:
            act = (uid, n.name)
            if act in self._acted:
                continue
            why = (f"nvlfabric: member node {n.name} of ComputeDomain {namespace}/{name} lost ({n.reason}: "
                   f"{n.message}); the pod is failed so that its workload replaces it in the same clique")
            try:
                failed = lostpods.fail_pods(self.client, namespace, n, [c for c, _ in allocs], why)
            except errors.NvlfabricError as exc:
                log.warning("ComputeDomain %s/%s: failing the pods of lost node %s: %s", namespace, name, n.name, exc)
                continue
            self._acted.add(act)
            if failed:
                events.event(self.client, namespace, api.KIND, api.API_VERSION, name, uid, "ReplacingPods",
                             f"pods {', '.join(failed)} on lost node {n.name} failed as disrupted "
                             f"({names.DISRUPTION_REASON}) and deleted: their workload replaces them", type_="Normal")

    def reconcile_tenancy(self) -> None:
        """Channel claims that are no live domain's own are deleted (strayclaims.py), and every
        namespace with a domain keeps its channel quota (quota.py)."""
        held = self.cache.domains.fresh()
        domains = {(ns or "default", name): (str(r.obj.metadata.uid or ""), api.channel_claim_names(name, r.cd.spec))
                   for (ns, name), r in held.items() if r.cd is not None and r.obj.metadata is not None}
        strayclaims.sweep(self.client, ComputeDomainResource,
                          {k: r.channel_claim for k, r in self.cache.claims.fresh().items()}, domains)
        self.quotas.keep({ns or "default" for ns, _ in held})

    def _imex_auth(self, obj: Any, cd: api.ComputeDomain, members: Sequence[api.NodeStatus],
                   tls: dict[str, imexauth.TlsDomain]) -> dict[str, str]:
        """The status fields of a dedicated domain's IMEX authentication (empty for a clique-scoped
        one); a TLS domain is added to `tls`, its authority made on first sight."""
        mode = imexauth.effective(cd.spec, cd.status, self.imex_authentication)
        if mode is None:
            return {}
        if mode is not api.IMEXAuthentication.TLS:
            return {"imexAuthentication": mode.value}
        namespace, name = cd.metadata.namespace or "default", cd.metadata.name
        uid = str((obj.metadata.uid if obj.metadata else None) or "")
        requested = ((obj.metadata.annotations if obj.metadata else None) or {}).get(
            names.ROTATE_IMEX_AUTHORITY_ANNOTATION, "")
        auth, step = self.issuer.rotate(namespace, name, uid, requested, members)
        if step is not None:
            waits = imexauth.rotation_waits_for(auth, members)
            events.event(self.client, namespace, api.KIND, api.API_VERSION, name, uid,
                               ROTATION_EVENTS[step][0], ROTATION_EVENTS[step][1] + (
                                   f"; waiting for {len(waits)} member(s): {', '.join(waits[:8])}"
                                   f"{' ...' if len(waits) > 8 else ''}" if waits else ""), type_="Normal")
        tls[uid] = imexauth.TlsDomain(namespace, name, uid, frozenset(e.name for e in members))
        return {"imexAuthentication": mode.value, "imexCABundle": auth.bundle}

    def run(self, *, interval_s: float = 2.0, stop: Callable[[], bool] = lambda: False,
            debounce_s: float = 0.1) -> None:
        """Pools and domains every interval and, between, soon after anything they read changed:
        each pass reads the informers (informer.py; their owner starts them, wiring.py, and the
        first pass waits until each has listed), summarises only the domains whose inputs
        changed, and writes only what differs."""
        poke = threading.Event()
        poke_on_changes(self.cache, poke)
        self.cache.wait_synced(stop)
        while not stop():
            try:
                with api_call("controller pass"):
                    self.reconcile_pools()
                    self.reconcile_domains()
                    self.reconcile_tenancy()
            except errors.NvlfabricError as exc:
                log.warning("reconcile pass failed, retrying at the next: %s", exc)
            if poke.wait(interval_s):
                time.sleep(debounce_s)  # the members of one domain report together
            poke.clear()
