"""The pure half of channel reservation (reservations.py): what a pod and a claim are to it, which
pods a pass reserves, whose scheduling gate lifts, and the patches that say so. No API calls: every
function here is a function of what the watches show, so tests can drive it with plain dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvlfabric.api import claimhold, names
from nvlfabric.api import computedomain as api
from nvlfabric.api.names import (
    CLIQUE_GROUP_ANNOTATION,
    CLIQUE_GROUPS_ANNOTATION,
    CLIQUE_LABEL,
    COMPUTE_DOMAIN_LABEL,
    GROUP_SIZE_ANNOTATION,
    RANK_ANNOTATION,
    RESERVATION_GATE,
)
from nvlfabric.controller import placement

MAX_RESERVED = names.MAX_PODS_PER_CLAIM
"""resource.k8s.io: a claim's `status.reservedFor` holds at most this many consumers."""
SETTLE_S = 0.5
"""Without a group-size annotation: a claim's group is complete once no new user came for this long."""
ADMITTED_HOLD_S = 120.0
"""How long a group placed at admission (Kueue, controller/admission.py) holds its room before its
first pod exists; a workload admitted and then deleted gives it back after this."""

Key = tuple[str, str]  # (namespace, claim name)


@dataclass(frozen=True)
class PendingPod:
    """An unbound pod, as reservation needs it."""

    namespace: str
    name: str
    uid: str
    claims: frozenset[str]  # the resourceClaimName values of spec.resourceClaims
    gated: bool = False  # carries RESERVATION_GATE
    created: str = ""  # creationTimestamp: the oldest gated pod is a claim's pioneer
    gpus: int = 0
    group_size: int = 0  # GROUP_SIZE_ANNOTATION, 0 when absent
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[tuple[tuple[str, str], ...], ...] = ()
    rank: int | None = None  # a multi-clique job's pod whose rank is not written yet: the rank to write
    pod_group: str = ""  # spec.schedulingGroup.podGroupName: Kubernetes places it (nothing to reserve)


@dataclass(frozen=True)
class ClaimState:
    """A ResourceClaim, as reservation needs it."""

    uid: str
    reserved: tuple[str, ...] = ()  # consumer UIDs
    allocated: bool = False
    ours: bool = False  # allocated from nvlfabric's pools: a channel claim
    clique: str | None = None  # the clique of the pool it was allocated from
    channels: int = 0  # channel devices of our pools its allocation holds (a pool counts devices, not claims)
    job: str = ""  # its ComputeDomain (the claim's label): the claims of one domain are one job
    groups: int = 1  # CLIQUE_GROUPS_ANNOTATION: how many claims the job has (MultiClique)
    pinned: str | None = None  # the clique its selector pins (a domain's placement.clique)
    imex_mode: str = ""  # its channel config's imexMode ("" when it has none)
    domain: tuple[str, str] | None = None  # (name, uid) of the ComputeDomain that owns it
    hold_at: int | None = None  # index in reservedFor of the domain's hold on it (claimhold.hold_consumer)
    pod_groups: bool = False  # reserved for a Kubernetes PodGroup, which holds it already
    terminating: bool = False  # being deleted


def pending_pod(pod: Mapping[str, Any]) -> PendingPod | None:
    """The pod as a reservation candidate, or None when it must not be reserved ahead: bound to a
    node already (the scheduler has done its part), being deleted, finished, or naming no claim."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    claims = frozenset(c["resourceClaimName"] for c in spec.get("resourceClaims") or [] if c.get("resourceClaimName"))
    if not claims or not meta.get("uid"):
        return None
    gated = any(g.get("name") == RESERVATION_GATE for g in spec.get("schedulingGates") or [])
    try:
        size = int((meta.get("annotations") or {}).get(GROUP_SIZE_ANNOTATION, 0))
    except ValueError:
        size = 0
    return PendingPod(meta.get("namespace") or "default", meta["name"], meta["uid"], claims, gated,
                      str(meta.get("creationTimestamp") or ""), gpus=placement.gpus_of(pod), group_size=max(0, size),
                      rank=job_rank(meta),
                      pod_group=str((spec.get("schedulingGroup") or {}).get("podGroupName") or ""),
                      node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
                      tolerations=tuple(tuple(sorted((k, str(v)) for k, v in t.items())) for t in
                                        spec.get("tolerations") or []))


def job_rank(meta: Mapping[str, Any]) -> int | None:
    """The rank to write on a pod of a multi-clique job (pure): its group's index x the group size
    + its own index in the group (an Indexed Job's completion index, a StatefulSet's pod index);
    None when it is not such a pod or its rank is written already."""
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    if RANK_ANNOTATION in annotations or CLIQUE_GROUP_ANNOTATION not in annotations:
        return None
    local = annotations.get(names.JOB_COMPLETION_INDEX, labels.get(names.STATEFULSET_POD_INDEX))
    try:
        group, size, index = (int(annotations[CLIQUE_GROUP_ANNOTATION]), int(annotations[GROUP_SIZE_ANNOTATION]),
                              int(str(local)))
    except (KeyError, TypeError, ValueError):
        return None
    return group * size + index if group >= 0 and size > 0 and 0 <= index < size else None


def claim_state(claim: Mapping[str, Any], driver: str) -> ClaimState:
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    ours = [r for r in results if r.get("driver") == driver]
    meta = claim.get("metadata") or {}
    try:
        groups = max(1, int((meta.get("annotations") or {}).get(CLIQUE_GROUPS_ANNOTATION, 1)))
    except ValueError:
        groups = 1
    devices = (claim.get("spec") or {}).get("devices") or {}
    cel = [s["cel"].get("expression", "") for r in devices.get("requests") or []
           for s in (r.get("exactly") or {}).get("selectors") or [] if isinstance(s.get("cel"), Mapping)]
    # Our channel config always names its imexMode (nvlfabric/api/channelconfig.py); "": not ours.
    modes = [str(((c.get("opaque") or {}).get("parameters") or {}).get("imexMode", ""))
             for c in devices.get("config") or [] if (c.get("opaque") or {}).get("driver") == driver]
    consumers = status.get("reservedFor") or []
    owner = next(((o.get("name", ""), o.get("uid", "")) for o in meta.get("ownerReferences") or []
                  if o.get("kind") == api.KIND and o.get("apiVersion") == api.API_VERSION and o.get("uid")), None)
    return ClaimState(uid=meta.get("uid", ""), job=(meta.get("labels") or {}).get(COMPUTE_DOMAIN_LABEL, ""),
                      domain=owner, terminating=bool(meta.get("deletionTimestamp")),
                      hold_at=next((i for i, c in enumerate(consumers) if claimhold.is_hold(c)), None),
                      pod_groups=any(c.get("resource") == "podgroups" for c in consumers),
                      groups=groups, pinned=next((p for e in cel if (p := names.pinned_clique_of(e))), None),
                      imex_mode=modes[0] if modes else "",
                      reserved=tuple(r["uid"] for r in consumers),
                      allocated=allocation is not None, ours=bool(ours), channels=len(ours),
                      clique=names.clique_of_pool(ours[0].get("pool", "")) if ours else None)


def to_reserve(namespace: str, claim: str, reserved: Sequence[str], pods: Iterable[PendingPod],
               limit: int = MAX_RESERVED) -> list[PendingPod]:
    """The pods to add to claim `namespace/claim`'s reservedFor (pure): those using the claim and
    not reserved yet, oldest name first, no more than the room left under `limit`."""
    have = set(reserved)
    room = max(0, limit - len(have))
    out = sorted((p for p in pods if p.namespace == namespace and claim in p.claims and p.uid not in have),
                 key=lambda p: (p.name, p.uid))
    unique = list({p.uid: p for p in out}.values())
    return unique[:room]


def pioneer(users: Iterable[PendingPod]) -> PendingPod | None:
    """The pod whose gate lifts first on a claim not allocated yet (pure): the oldest gated user,
    and only while no user is ungated (an ungated one will allocate the claim anyway)."""
    gated = []
    for p in users:
        if not p.gated:
            return None
        gated.append(p)
    return min(gated, key=lambda p: (p.created, p.name, p.uid), default=None)


def releasable(pod: PendingPod, claims: Mapping[str, ClaimState], pioneer_of: frozenset[str] = frozenset()) -> bool:
    """Whether `pod`'s gate may lift (pure): every claim it names exists, it is reserved on each
    allocated channel claim, and it is the pioneer of each claim not allocated yet."""
    for name in pod.claims:
        st = claims.get(name)
        if st is None:
            return False
        if st.ours and pod.uid not in st.reserved:
            return False
        if not st.allocated and name not in pioneer_of:
            return False
    return True


def reservation_patch(claim_uid: str, pods: Sequence[PendingPod], *, hold: Mapping[str, str] | None = None,
                      release: tuple[int, str] | None = None) -> list[dict[str, Any]]:
    """A JSON patch of the claim's status appending `pods` to a non-empty `reservedFor`, applied
    only while the claim still has `claim_uid`; first removing the domain's hold `release`
    (its index and uid, tested), last appending the domain's hold `hold`."""
    drop = [] if release is None else [{"op": "test", "path": f"/status/reservedFor/{release[0]}/uid",
                                        "value": release[1]},
                                       {"op": "remove", "path": f"/status/reservedFor/{release[0]}"}]
    return [{"op": "test", "path": "/metadata/uid", "value": claim_uid}, *drop,
            *({"op": "add", "path": "/status/reservedFor/-",
               "value": {"resource": "pods", "name": p.name, "uid": p.uid}} for p in pods),
            *([{"op": "add", "path": "/status/reservedFor/-", "value": dict(hold)}] if hold is not None else [])]


def hold_change(claim: ClaimState, unreserved: int, adding: int) -> tuple[bool, bool]:
    """Whether a reservation pass adds the domain's hold to the claim, or releases it (pure):
    added to a claim of a domain that is in use (reservedFor not empty), not being deleted, not
    held by a PodGroup, when every waiting user fits beside it; released when the claim is being
    deleted, or when a waiting pod needs its place (a claim's 256 consumers are the pods first).
    `unreserved`: users waiting for a place; `adding`: those this pass reserves."""
    if claim.hold_at is not None:
        return False, claim.terminating or len(claim.reserved) + unreserved > MAX_RESERVED
    fits = adding == unreserved and len(claim.reserved) + adding < MAX_RESERVED
    return (claim.domain is not None and bool(claim.reserved) and not claim.terminating and not claim.pod_groups
            and fits), False


UNGATE_PATCH: dict[str, Any] = {"spec": {"schedulingGates": [{"$patch": "delete", "name": RESERVATION_GATE}]}}
"""Strategic merge patch removing our gate and no other (schedulingGates merge by name)."""


def pioneer_patch(clique: str) -> dict[str, Any]:
    """Lift the gate and narrow the pod to `clique` in one write (a gated pod's node selector may
    gain keys; the API server checks that against the pod as it was, still gated)."""
    return {"spec": {"nodeSelector": {CLIQUE_LABEL: clique},
                     "schedulingGates": [{"$patch": "delete", "name": RESERVATION_GATE}]}}


def ungate_patch(pod: PendingPod, clique: str | None) -> dict[str, Any]:
    """What lifting `pod`'s gate writes: the gate removed; for a pioneer, its clique; for a pod of a
    multi-clique job, its rank (before it starts, so its downward-API env reads it)."""
    patch = copy.deepcopy(UNGATE_PATCH if clique is None else pioneer_patch(clique))
    if pod.rank is not None:
        patch["metadata"] = {"annotations": {RANK_ANNOTATION: str(pod.rank)}}
    return patch


def group_of(key: Key, users: Sequence[PendingPod], pinned: str | None = None) -> placement.Group:
    """The placement demand of a claim's users: as many pods as there are, or as their group size
    says if more; the largest pod's GPUs; the first user's node selector (BoundJob gives all of a
    workload's pods the same); the clique the claim pins, if it does."""
    first = min(users, key=lambda p: (p.created, p.name))
    return placement.Group(key, max(len(users), max(p.group_size for p in users)),
                           max(p.gpus for p in users), dict(first.node_selector), pinned)


def stale_admissions(admitted: Mapping[Key, tuple[placement.Reserved, float]], with_users: Iterable[Key],
                     now: float) -> list[Key]:
    """The groups placed at admission whose hold is over (pure): their pods came (the pods hold
    the room now), or none came within ADMITTED_HOLD_S."""
    came = set(with_users)
    return [k for k, (_, since) in admitted.items() if k in came or now - since >= ADMITTED_HOLD_S]


def complete(users: Sequence[PendingPod], quiet_for: float) -> bool:
    """Whether a claim's group is known well enough to place: its size is annotated on its users
    (BoundJob's group-size: the demand is that many pods, whether they exist yet or not), or (none
    annotated) no new user came for SETTLE_S. Not every annotated pod need exist: the Job
    controller creates them at its own pace, and the group's room is held from its first pod
    (docs/architecture.md, Controller)."""
    want = max((p.group_size for p in users), default=0)
    return bool(users) if want else quiet_for >= SETTLE_S
