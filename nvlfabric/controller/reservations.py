"""Reserve a domain's shared channel claim for its pending pods, many in one write, and lift their
scheduling gates (the why, and what it measured: docs/architecture.md, "Many pods on one claim").

The rules (their pure half is reservationplan.py; this module reads the watches and writes):
- Once a channel claim is allocated, every pending pod that names it is added to its
  `status.reservedFor` in one JSON patch: a `test` of `metadata.uid`, then one `add` at the end of
  the list per pod (no resourceVersion, so the scheduler's writes do not conflict with it; a
  duplicate the scheduler wrote meanwhile is refused, and the pass reads the claim and retries).
  Not a strategic-merge patch: it re-orders the opaque config in `status.allocation`, which then
  fails validation as modified.
- Safe to reserve: a pod of the claim's namespace naming it in `spec.resourceClaims`, not bound,
  not being deleted, not finished; at most 256 entries (`ResourceClaimReservedForMaxSize`); a claim
  whose `reservedFor` is empty is about to be deallocated and left alone. Only channel claims (from
  nvlfabric's clique pools) are reserved.
- Gates (`nvlfabric.io/channel-reservation`, BoundJob adds it): the pioneer (the oldest gated pod of
  a claim not allocated yet, with no ungated user) goes first, with `nodeSelector` pinning it to a
  clique where the whole group fits and a channel is free (placement.py; the group's demand is
  its `nvlfabric.io/group-size`); every other pod once the claim watch shows it in `reservedFor`
  of each allocated channel claim it names (the scheduler reads the claim from its informer), or
  after WATCH_SEEN_S without. No clique has room: the pods stay gated, with a Warning Event on the
  claim and the first pod naming the largest room, re-checked every pass.
- A domain's claim is also reserved for the domain itself (`api.hold_consumer`), so a workload
  that recreates all its pods keeps its claim, clique and channel; the hold gives way to pods and
  to deletion.
- Pods Kubernetes schedules as a gang (`spec.schedulingGroup`) are not reserved or placed here;
  a gated one in a multi-clique job only gets its rank written.

The watches: unbound pods (`spec.nodeName=`) and resource claims; every change marks its claim for
a pass, a short pause before each pass lets a burst of pod creations go out as one patch, and claims
with gated users are looked at again every few seconds (level-based, so a lost event only delays).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightkube import Client
from lightkube.models import resource_v1 as models
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.controller import endpoint, placement
from nvlfabric.controller.cache import Informers
from nvlfabric.controller.events import event
from nvlfabric.controller.reservationplan import (
    MAX_RESERVED,
    ClaimState,
    Key,
    PendingPod,
    claim_state,
    complete,
    group_of,
    hold_change,
    pending_pod,
    pioneer,
    releasable,
    reservation_patch,
    stale_admissions,
    to_reserve,
    ungate_patch,
)
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.reservations")

COALESCE_S = 0.05
"""Pause before a pass, so pod creations arriving together become one patch."""
PIONEER_GRACE_S = 5.0
"""After lifting a pioneer's gate, how long to wait for its claim's allocation before trusting
that the pioneer is gone (the pod and claim watches are two streams: a bound pioneer can leave
the pod cache before its allocation reaches the claim cache)."""
RESYNC_S = 2.0
API_WORKERS = 16
"""Writes (claim reservations, gate lifts) in flight at once. Each is one small patch, and on a busy
control plane a write's latency, not the API server's throughput, is what limits them; the
scheduler binds each pod as its gate lifts, so it waits on these (docs/architecture.md, Controller)."""
WATCH_SEEN_S = 2.0
"""How long a reservation written here may stay unseen by the claim watch before its pods' gates
lift anyway (a lost or re-listed watch only delays them this long)."""
NO_ROOM_EVENT_S = 60.0
"""How often the same no-room Event is repeated for one claim."""
class Reserver:
    """Watches unbound pods and claims; reserves each allocated channel claim for its pending
    pods and lifts the reservation gate of pods that are ready to schedule."""

    def __init__(self, client: Client, driver: str, *, coalesce_s: float = COALESCE_S,
                 watch_seen_s: float = WATCH_SEEN_S, channels_per_clique: int = names.DEFAULT_CHANNELS_PER_CLIQUE,
                 imex_modes: frozenset[api.IMEXMode] = frozenset(api.IMEXMode),
                 informers: Informers | None = None) -> None:
        self.client, self.driver, self.coalesce_s = client, driver, coalesce_s
        self.watch_seen_s = watch_seen_s
        # Claims, agents' Nodes and bound pods come from the controller's informers (cache.py)
        # when it shares them (it runs their watches), else from informers of its own.
        self._owns_cache = informers is None
        self.cache = informers or Informers.of(client)
        self.cache.claims.listen(lambda kind, key, old, new: self._claim_changed(
            kind, key, None if new is None else new.raw))
        self.cache.domains.listen(self._domain_changed)
        self.channels_per_clique = channels_per_clique
        self.imex_modes = frozenset(m.value for m in imex_modes)
        """A claim of another mode is never placed nor let through: no node would prepare it, and
        its allocation would hold a channel for nothing (its domain is Failed, reconcile.py)."""
        self._placed: dict[Key, str] = {}  # claim → the clique its pioneer is sent to
        self._admitted: dict[Key, tuple[placement.Reserved, float]] = {}
        """Groups placed at admission, before any of their pods exists: the room they hold, since when."""
        self._placing = threading.Lock()  # one placement at a time: the reserver's passes and admissions
        self._last_user: dict[Key, float] = {}  # claim → when its newest user appeared
        self._no_room: dict[Key, tuple[str, float]] = {}  # claim → (message, when) of its last Event
        self._lock = threading.Condition()
        self._pods: dict[str, PendingPod] = {}  # by uid
        self._by_claim: dict[Key, dict[str, PendingPod]] = {}
        """The same pods by each claim they name: a pass looks up a claim's users, never scans every
        pending pod for each claim (1,152 pods x 64 claims at every pass, 64 racks)."""
        self._grouped: dict[str, PendingPod] = {}  # gated pods of Kubernetes' pod groups, by uid
        self._retry: dict[str, PendingPod] = {}  # ... whose gate failed to lift: again at the resync
        self._claims: dict[Key, ClaimState] = {}
        self._dirty: set[Key] = set()
        self._pioneered: dict[Key, float] = {}  # claim → when its pioneer's gate was lifted
        self._unseen: dict[Key, dict[str, float]] = {}  # claim → pods reserved here, not yet seen by the watch
        self._pool = ThreadPoolExecutor(API_WORKERS, thread_name_prefix="writes")
        self.patches = 0  # claim status patches written (tests and logs)
        self.reserved = 0  # pods reserved ahead
        self.ungated = 0  # gates lifted

    # -- watches -------------------------------------------------------------------------------

    def pod_event(self, kind: str, obj: Pod) -> None:
        """What the pod watch delivers (ADDED, MODIFIED, DELETED): the pod remembered or forgotten."""
        raw = obj.to_dict()
        uid = (raw.get("metadata") or {}).get("uid", "")
        pod = None if kind == "DELETED" else pending_pod(raw)
        with self._lock:
            if pod is None or pod.pod_group:
                self._forget(uid)
                self._grouped.pop(uid, None)
                self._retry.pop(uid, None)
                if pod is not None and pod.gated:  # Kubernetes places it: only its rank is ours to write
                    self._grouped[uid] = pod
                    self._lock.notify()
                return
            if uid not in self._pods:
                now = time.monotonic()
                self._last_user.update(((pod.namespace, c), now) for c in pod.claims)
            self._remember(pod)
            self._dirty.update((pod.namespace, c) for c in pod.claims)
            self._lock.notify()

    def claim_event(self, kind: str, obj: ResourceClaim) -> None:
        """What the claim watch delivers: the claim's state, and the reservations it shows."""
        if obj.metadata is None:
            return
        self._claim_changed(kind, (obj.metadata.namespace or "default", obj.metadata.name or ""), obj.to_dict())

    def _claim_changed(self, kind: str, key: Key, raw: Mapping[str, Any] | None) -> None:
        with self._lock:
            if kind == "DELETED" or raw is None:
                self._claims.pop(key, None)
                self._placed.pop(key, None)
                self._last_user.pop(key, None)
                self._no_room.pop(key, None)
                self._unseen.pop(key, None)
                return
            self._claims[key] = state = claim_state(raw, self.driver)
            if (unseen := self._unseen.get(key)) is not None:
                for uid in state.reserved:
                    unseen.pop(uid, None)
                if not unseen:
                    del self._unseen[key]
            self._dirty.add(key)
            self._lock.notify()

    def _follow(self, res: Any, on_event: Callable[[str, Any], None], reset: Callable[[], None],
                stop: Callable[[], bool], **selector: Any) -> None:
        """List, then watch from the list's resourceVersion; after any error, list again, backing
        off (1 s doubling to 30 s), counted in `nvlfabric_controller_watch_failures_total` and
        logged at WARNING from the third failure in a row (until then DEBUG: a 410 Gone is routine).
        A watch that delivered an event, or ended at its server timeout, starts the count afresh."""
        failures = 0
        while not stop():
            try:
                listing = self.client.list(res, namespace="*", **selector)
                items = list(listing)
                reset()
                for obj in items:
                    on_event("ADDED", obj)
                for kind, obj in self.client.watch(res, namespace="*", resource_version=listing.resourceVersion,
                                                   server_timeout=60, **selector):
                    failures = 0
                    if stop():
                        return
                    on_event(kind, obj)
                failures = 0
            except Exception as exc:  # a watch that fails is re-listed, never fatal
                failures += 1
                time.sleep(endpoint.watch_failed(res.__name__, exc, failures, log))

    def _reset_pods(self) -> None:
        with self._lock:
            self._pods.clear()
            self._by_claim.clear()

    # -- passes --------------------------------------------------------------------------------

    def pass_once(self) -> None:
        """Reserve, then release, every dirty claim (what the worker does after each pause)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            grouped, self._grouped = list(self._grouped.values()), {}
        lifted = {p.uid for p in self._ungate([(p, None) for p in grouped])}
        with self._lock:
            self._retry.update((p.uid, p) for p in grouped if p.uid not in lifted)
        # Each claim's reservation is a write of its own: all at once, as the gate lifts are.
        list(self._pool.map(self._reserve, sorted(dirty)))
        self._place(sorted(dirty))
        releases: dict[str, tuple[PendingPod, str | None]] = {}
        with self._lock:
            for key in sorted(dirty):
                releases.update((p.uid, (p, clique)) for p, clique in self._releases(key))
        self._ungate(list(releases.values()))

    def _users(self, key: Key) -> list[PendingPod]:
        return list(self._by_claim.get(key, {}).values())

    def _remember(self, pod: PendingPod) -> None:
        """Record (or replace) a pending pod (call with the lock held)."""
        self._forget(pod.uid)
        self._pods[pod.uid] = pod
        for c in pod.claims:
            self._by_claim.setdefault((pod.namespace, c), {})[pod.uid] = pod

    def _forget(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is None:
            return
        for c in old.claims:
            users = self._by_claim.get((old.namespace, c))
            if users is not None:
                users.pop(uid, None)
                if not users:
                    del self._by_claim[(old.namespace, c)]

    def _reserve(self, key: Key, attempts: int = 3) -> None:
        namespace, name = key
        for attempt in range(attempts):
            with self._lock:
                claim = self._claims.get(key)
                if claim is None or not claim.ours or not claim.reserved:
                    return
                users = self._users(key)
                unreserved = len({p.uid for p in users if p.uid not in claim.reserved})
                _, release = hold_change(claim, unreserved, 0)
                pods = to_reserve(namespace, name, claim.reserved, users, limit=MAX_RESERVED + release)
                add, _ = hold_change(claim, unreserved, len(pods))
                hold = api.hold_consumer(*claim.domain) if add and claim.domain else None
                dropped = (claim.hold_at, claim.reserved[claim.hold_at]) \
                    if release and claim.hold_at is not None else None
                if not pods and hold is None and dropped is None:
                    return
                # Expected from the watch before the write is sent: its event may come before the answer.
                now = time.monotonic()
                self._unseen.setdefault(key, {}).update((p.uid, now) for p in pods)
            try:
                with api_call(f"reserve claim {namespace}/{name} for {len(pods)} pods"):
                    out = self.client.patch(ResourceClaim.Status, name,
                                            reservation_patch(claim.uid, pods, hold=hold, release=dropped),
                                            namespace=namespace, patch_type=PatchType.JSON)
            except errors.ApiStatusError as exc:
                with self._lock:
                    for p in pods:
                        self._unseen.get(key, {}).pop(p.uid, None)
                # 422: the scheduler reserved one of the pods meanwhile, the list is full, or the
                # claim was replaced; 404: it is gone. Read it again and retry with the truth.
                log.info("claim %s/%s: reserving %d pods ahead failed (attempt %d): %s", namespace, name, len(pods),
                         attempt + 1, exc.message)
                self._refresh(key)
                continue
            self._store(key, out)
            with self._lock:
                self.patches += 1
                self.reserved += len(pods)
            if pods:
                log.info("claim %s/%s: reserved for %d pending pods ahead of the scheduler", namespace, name,
                         len(pods))
            if hold is not None:
                log.info("claim %s/%s: held for its ComputeDomain %s (channel and clique kept while it exists)",
                         namespace, name, hold["name"])
            if dropped is not None:
                log.info("claim %s/%s: released its ComputeDomain's hold (%s)", namespace, name,
                         "the claim is being deleted" if claim.terminating else "a pod needs its place")
            return

    # -- placement -------------------------------------------------------------------------------

    def _held(self) -> list[placement.Reserved]:
        """Room the placed claims' pending pods still need (call with the lock held): bound pods
        are counted on their nodes already; a group placed at admission whose pods do not exist
        yet, its whole demand."""
        for key in stale_admissions(self._admitted, {k for k in self._placed if self._users(k)}, time.monotonic()):
            del self._admitted[key]
            if not self._users(key):  # admitted, and no pod came: its workload went
                self._placed.pop(key, None)
        out = []
        for key, clique in self._placed.items():
            users = self._users(key)
            if users:
                out.append(placement.Reserved(clique, len(users), max(p.gpus for p in users)))
            elif (admitted := self._admitted.get(key)) is not None:
                out.append(admitted[0])
        return out

    def _free_channels(self) -> dict[str, int]:
        """Clique → channels left in its pool: every allocated claim's devices (whatever its shape:
        a pool counts devices, not claims), and one per claim placed here and not allocated yet."""
        used: dict[str, int] = {}
        for key, st in self._claims.items():
            if st.allocated and st.clique:
                used[st.clique] = used.get(st.clique, 0) + st.channels
            elif not st.allocated and (clique := self._placed.get(key)):
                used[clique] = used.get(clique, 0) + 1
        return {c: max(0, self.channels_per_clique - n) for c, n in used.items()}

    def _waiting(self, key: Key, now: float) -> placement.Group | None:
        """The claim's group if it is to be placed now (call with the lock held): complete, every
        user still gated (an ungated one allocates the claim by itself: nothing to steer), and
        neither allocated nor placed yet, of a mode the driver allows."""
        claim, users = self._claims.get(key), self._users(key)
        if (claim is None or claim.allocated or key in self._placed or not users or not all(p.gated for p in users)
                or not complete(users, now - self._last_user.get(key, now)) or not self._allowed(key, claim)):
            return None
        return group_of(key, users, claim.pinned)

    def _allowed(self, key: Key, claim: ClaimState) -> bool:
        """Of a mode the driver allows, and, where the domains are watched, its owner a live domain
        whose claim it is: a stray claim (controller/strayclaims.py) is never placed, so its gated
        pods never get it a channel before the controller deletes it."""
        if claim.imex_mode and claim.imex_mode not in self.imex_modes:
            return False
        if not self.cache.domains.synced.is_set():
            return True  # a Reserver of its own cache (tests) does not watch domains
        if claim.domain is None:
            return False
        record = self.cache.domains.get((key[0], claim.domain[0]))
        return (record is not None and record.cd is not None and record.obj.metadata is not None
                and record.obj.metadata.uid == claim.domain[1]
                and key[1] in api.channel_claim_names(record.cd.metadata.name, record.cd.spec))

    def _domain_changed(self, kind: str, key: Any, old: Any, new: Any) -> None:
        """A domain that comes (its watch event after its claim's) makes its claims worth a pass."""
        record = new
        if old is not None or record is None or record.cd is None:
            return  # only a domain's arrival: its status writes are no news to placement
        with self._lock:
            self._dirty.update((key[0], c) for c in api.channel_claim_names(record.cd.metadata.name, record.cd.spec))
            self._lock.notify()

    def _jobs(self, keys: Sequence[Key], now: float) -> list[tuple[list[placement.Group], set[str], list[Key]]]:
        """What to place (call with the lock held): per job, the groups to place together, the
        cliques its other groups hold already (placed or allocated), and its keys. A MultiClique
        domain's claims are one job, placed only once every one of them exists and is complete."""
        out = []
        done: set[Key] = set()
        for key in keys:
            claim = self._claims.get(key)
            if key in done or claim is None:
                continue
            if claim.groups <= 1 or not claim.job:
                job_keys = [key]
            else:
                job_keys = sorted(k for k, st in self._claims.items()
                                  if k[0] == key[0] and st.job == claim.job and st.groups == claim.groups)
            done.update(job_keys)
            if len(job_keys) < claim.groups:
                continue  # a claim of the domain is not there (yet): none of its groups starts
            waiting = {k: g for k in job_keys if (g := self._waiting(k, now)) is not None}
            taken = {c for k in job_keys if k not in waiting
                     if (c := self._placed.get(k) or self._claims[k].clique) is not None}
            settled = len(waiting) + sum(1 for k in job_keys if k in self._placed or self._claims[k].allocated)
            if waiting and settled == len(job_keys):
                out.append((list(waiting.values()), taken, list(waiting)))
        return out

    def _place(self, keys: Sequence[Key]) -> None:
        with self._placing:
            self._place_now(keys)

    def _place_now(self, keys: Sequence[Key]) -> None:
        """Choose a clique for each claim whose group is complete and still wholly gated; a job of
        several claims gets one clique per claim, all at once or none."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, st in self._claims.items() if k in self._placed and st.allocated
                        and not self._users(k)]:
                del self._placed[key]  # all its pods are bound: their nodes count them now
                self._admitted.pop(key, None)
            jobs = self._jobs(keys, now)
            tolerations = {id(groups): [dict(t) for t in min(
                (p for k in job_keys for p in self._users(k)), key=lambda p: (p.created, p.name)).tolerations]
                for groups, _, job_keys in jobs}
            held, channels = self._held(), self._free_channels()
        if not jobs:
            return
        try:
            nodes, used = self._cluster_use()
        except errors.ApiStatusError as exc:
            log.warning("%s; placing at the next pass", exc)
            return
        rooms_for: dict[str, list[placement.NodeRoom]] = {}  # jobs of the same tolerations share them
        for groups, taken, _ in jobs:
            tolerated = tolerations[id(groups)]
            if (same := repr(tolerated)) not in rooms_for:
                rooms_for[same] = placement.rooms_of(nodes, used, tolerated)
            rooms = rooms_for[same]
            free = {c: channels.get(c, self.channels_per_clique) for c in {r.clique for r in rooms}}
            got = placement.place(groups, rooms, free, held, exclude=taken)
            if isinstance(got, placement.NoRoom):
                for g in groups:
                    self._say_no_room(g.key, got)
                continue
            for g in groups:
                clique = got[g.key]
                held.append(placement.Reserved(clique, g.pods, g.gpus_per_pod))
                channels[clique] = free[clique] = free[clique] - 1
                with self._lock:
                    self._placed[g.key] = clique
                    self._no_room.pop(g.key, None)
                    self._dirty.add(g.key)
                log.info("claim %s/%s: %d pods x %d GPUs placed in clique %s", *g.key, g.pods, g.gpus_per_pod,
                         clique)

    def _cluster_use(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The clique Nodes as placement reads them, and the GPUs their running pods use."""
        with api_call("read the Nodes and bound pods to place channel claims"):
            nodes = [n.placement for n in self.cache.nodes.fresh().values() if n.clique]
            used: dict[str, int] = {}
            for node, gpus, finished in self.cache.bound_pods.fresh().values():
                if not finished:
                    used[node] = used.get(node, 0) + gpus
        return nodes, used

    def is_channel_claim(self, namespace: str, name: str) -> bool:
        """Whether claim namespace/name is a ComputeDomain's channel claim (as the claim watch shows it)."""
        with self._lock:
            claim = self._claims.get((namespace, name))
            return claim is not None and bool(claim.job) and claim.domain is not None

    def admit(self, groups: Sequence[placement.Group],
              tolerations: Sequence[Mapping[str, str]] = ()) -> dict[Key, str] | placement.NoRoom | str:
        """Place a job before its pods exist (a Kueue workload's pod sets, controller/admission.py):
        each group (its claim's key, pods, GPUs per pod, node selector) gets a clique with room and a
        free channel, all at once or none, and holds that room until its pods come. A group whose
        claim is allocated already (its domain kept it through a restart) keeps its clique. Returns
        the cliques, why there is no room, or (a str) why it cannot be judged yet."""
        with self._placing:  # the whole of it: no pass places meanwhile on the same snapshot
            with self._lock:
                missing = [f"{k[0]}/{k[1]}" for k in (g.key for g in groups) if k not in self._claims]
                if missing:
                    return f"channel claim {missing[0]} does not exist (yet)"
                # A domain pinned to a clique (placement.clique) keeps its groups there.
                groups = [dataclasses.replace(g, clique=self._claims[g.key].pinned or g.clique) for g in groups]
                done = {g.key: c for g in groups
                        if (c := self._placed.get(g.key) or (self._claims[g.key].clique
                                                              if self._claims[g.key].allocated else None))}
                todo = [g for g in groups if g.key not in done]
                held, channels = self._held(), self._free_channels()
            if not todo:
                return done
            try:
                nodes, used = self._cluster_use()
            except errors.ApiStatusError as exc:
                return str(exc)
            rooms = placement.rooms_of(nodes, used, [dict(t) for t in tolerations])
            free = {c: channels.get(c, self.channels_per_clique) for c in {r.clique for r in rooms}}
            got = placement.place(todo, rooms, free, held, exclude=set(done.values()))
            if isinstance(got, placement.NoRoom):
                return got
            now = time.monotonic()
            with self._lock:
                for g in todo:
                    self._placed[g.key] = got[g.key]
                    self._admitted[g.key] = (placement.Reserved(got[g.key], g.pods, g.gpus_per_pod), now)
                    log.info("claim %s/%s: %d pods x %d GPUs placed in clique %s at admission", *g.key, g.pods,
                             g.gpus_per_pod, got[g.key])
            return {**done, **got}

    def _say_no_room(self, key: Key, why: placement.NoRoom) -> None:
        message = why.message()
        last = self._no_room.get(key)
        if last is not None and last[0] == message and time.monotonic() - last[1] < NO_ROOM_EVENT_S:
            return
        self._no_room[key] = (message, time.monotonic())
        log.warning("claim %s/%s: %s", *key, message)
        with self._lock:
            claim = self._claims.get(key)
            users = sorted(self._users(key), key=lambda p: (p.created, p.name))
        targets = [("ResourceClaim", "resource.k8s.io/v1", key[1], claim.uid if claim else "")]
        if users:
            targets.append(("Pod", "v1", users[0].name, users[0].uid))
        for kind, api_version, name, uid in targets:
            event(self.client, key[0], kind, api_version, name, uid, why.reason, message)

    # -- gates -----------------------------------------------------------------------------------

    def _releases(self, key: Key) -> list[tuple[PendingPod, str | None]]:
        """The gated users of `key` whose gate may lift now, each with the clique a pioneer is
        sent to (call with the lock held)."""
        users = self._users(key)
        claim = self._claims.get(key)
        if claim is None or not any(p.gated for p in users):
            return []
        first: PendingPod | None = None
        clique: str | None = None
        if not claim.allocated:
            since = self._pioneered.get(key)
            clique = self._placed.get(key)
            if clique is not None and (since is None or time.monotonic() - since > PIONEER_GRACE_S):
                first = pioneer(users)
        else:
            self._pioneered.pop(key, None)
        out: list[tuple[PendingPod, str | None]] = []
        now = time.monotonic()
        for p in users:
            if not p.gated or self._unseen_by_watch(p, now):
                continue
            claims = {c: st for c in p.claims if (st := self._claims.get((p.namespace, c))) is not None}
            if releasable(p, claims, frozenset({key[1]}) if p is first else frozenset()):
                out.append((p, clique if p is first else None))
                if p is first:
                    self._pioneered[key] = time.monotonic()
        return out

    def _unseen_by_watch(self, pod: PendingPod, now: float) -> bool:
        """Whether a reservation of `pod` written here is not yet in the claim watch, and not for
        long (call with the lock held)."""
        return any(now - written < self.watch_seen_s for c in pod.claims
                   if (written := self._unseen.get((pod.namespace, c), {}).get(pod.uid)) is not None)

    def _ungate(self, releases: list[tuple[PendingPod, str | None]]) -> list[PendingPod]:
        """Lift the gates; returns the pods whose gate was lifted."""
        if not releases:
            return []
        done = [p for (p, _), ok in zip(releases, self._pool.map(self._ungate_one, releases), strict=True) if ok]
        with self._lock:
            for p in done:
                if p.uid in self._pods:
                    self._remember(dataclasses.replace(self._pods[p.uid], gated=False))
        self.ungated += len(done)
        if done:
            log.info("lifted the channel-reservation gate of %d pods (%s/%s ...)", len(done), done[0].namespace,
                     done[0].name)
        return done

    def _ungate_one(self, release: tuple[PendingPod, str | None]) -> bool:
        pod, clique = release
        patch = ungate_patch(pod, clique)
        try:
            with api_call(f"lift the reservation gate of pod {pod.namespace}/{pod.name}"):
                self.client.patch(Pod, pod.name, patch, namespace=pod.namespace, patch_type=PatchType.STRATEGIC)
            return True
        except errors.NotFound:
            return False  # the pod is gone
        except errors.ApiStatusError as exc:
            log.warning("%s", exc)
            return False

    def _refresh(self, key: Key) -> None:
        try:
            with api_call(f"read claim {key[0]}/{key[1]}"):
                claim = self.client.get(ResourceClaim, key[1], namespace=key[0])
            self._store(key, claim)
        except errors.NotFound:
            with self._lock:
                self._claims.pop(key, None)

    def _store(self, key: Key, claim: models.ResourceClaim) -> None:
        with self._lock:
            self._claims[key] = claim_state(claim.to_dict(), self.driver)

    def _resync(self) -> None:
        """Mark every claim with a gated user dirty (level-based: a lost event only delays)."""
        with self._lock:
            self._dirty.update((p.namespace, c) for p in self._pods.values() if p.gated for c in p.claims)
            now = time.monotonic()
            for key, unseen in list(self._unseen.items()):  # what the watch never showed is waited for no more
                for uid, written in list(unseen.items()):
                    if now - written >= self.watch_seen_s:
                        del unseen[uid]
                if not unseen:
                    del self._unseen[key]
            self._grouped.update(self._retry)
            self._retry.clear()

    def run(self, stop: Callable[[], bool]) -> None:
        """Both watches in threads of their own; passes here until `stop()`."""
        threading.Thread(target=self._follow, args=(Pod, self.pod_event, self._reset_pods, stop),
                         kwargs={"fields": {"spec.nodeName": ""}}, name="watch-Pod", daemon=True).start()
        if self._owns_cache:
            for inf in (self.cache.claims, self.cache.nodes, self.cache.bound_pods):
                inf.start(stop)
        last_resync = time.monotonic()
        try:
            while not stop():
                if time.monotonic() - last_resync > RESYNC_S:
                    self._resync()
                    last_resync = time.monotonic()
                with self._lock:
                    if not self._dirty and not self._grouped:
                        self._lock.wait(timeout=1.0)
                        continue
                time.sleep(self.coalesce_s)
                try:
                    self.pass_once()
                except Exception:  # one failed pass must not end reservation
                    log.exception("reservation pass failed")
        finally:
            self._pool.shutdown(wait=False)
