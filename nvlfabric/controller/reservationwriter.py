"""The reservation writes: a channel claim's `status.reservedFor` patched for its pending pods (and
its domain's hold), and the reservation gates lifted. What to write is reservationplan.py's (pure);
when, the pass's (reservations.py); this module only writes, and records what it wrote in the
reservation state.

- One JSON patch per claim and pass: a `test` of `metadata.uid`, then one `add` at the end of the
  list per pod (no resourceVersion, so the scheduler's writes do not conflict with it; a
  duplicate the scheduler wrote meanwhile is refused, and the claim is read again and the write
  retried). Not a strategic-merge patch: it re-orders the opaque config in `status.allocation`,
  which then fails validation as modified (docs/architecture.md, "Many pods on one claim").
- A claim whose `reservedFor` is empty is about to be deallocated and left alone; only channel
  claims (from nvlfabric's clique pools) are reserved; at most 256 entries.
- A domain's claim is also reserved for the domain itself (`claimhold.hold_consumer`), so a workload
  that recreates all its pods keeps its claim, clique and channel; the hold gives way to pods
  and to deletion (reservationplan.hold_change).
- A gate lifts with one strategic-merge patch of the pod (reservationplan.ungate_patch: a
  pioneer's clique, a multi-clique job's rank).

Placement (placer.py) and Kueue admission never come here: they decide where, the pass writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import claimhold, errors
from nvlfabric.controller.reservationplan import (
    MAX_RESERVED,
    Key,
    PendingPod,
    hold_change,
    reservation_patch,
    to_reserve,
    ungate_patch,
)
from nvlfabric.controller.reservationstate import ReservationState
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.reservations")

API_WORKERS = 16
"""Writes (claim reservations, gate lifts) in flight at once. Each is one small patch, and on a busy
control plane a write's latency, not the API server's throughput, is what limits them; the
scheduler binds each pod as its gate lifts, so it waits on these (docs/architecture.md, Controller)."""

Release = tuple[PendingPod, str | None]
"""A pod whose gate is to lift, with the clique it is sent to when it is its claim's pioneer."""


class ReservationWriter:
    def __init__(self, client: Client, state: ReservationState) -> None:
        self.client, self.state = client, state
        self._pool = ThreadPoolExecutor(API_WORKERS, thread_name_prefix="writes")
        self.patches = 0  # claim status patches written (tests and logs)
        self.reserved = 0  # pods reserved ahead
        self.ungated = 0  # gates lifted

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)

    # -- reservations ----------------------------------------------------------------------------

    def reserve_all(self, keys: Iterable[Key]) -> None:
        """Each claim's reservation is a write of its own: all at once, as the gate lifts are."""
        list(self._pool.map(self.reserve, keys))

    def reserve(self, key: Key, attempts: int = 3) -> None:
        """Reserve claim `key` for its pending pods not reserved yet, adding or releasing its
        domain's hold, in one patch; on a refusal read the claim again and retry."""
        namespace, name = key
        state = self.state
        for attempt in range(attempts):
            with state.lock:
                claim = state.claims.get(key)
                if claim is None or not claim.ours or not claim.reserved:
                    return
                users = state.pods.users(key)
                unreserved = len({p.uid for p in users if p.uid not in claim.reserved})
                _, release = hold_change(claim, unreserved, 0)
                pods = to_reserve(namespace, name, claim.reserved, users, limit=MAX_RESERVED + release)
                add, _ = hold_change(claim, unreserved, len(pods))
                hold = claimhold.hold_consumer(*claim.domain) if add and claim.domain else None
                dropped = (claim.hold_at, claim.reserved[claim.hold_at]) \
                    if release and claim.hold_at is not None else None
                if not pods and hold is None and dropped is None:
                    return
                state.expect(key, pods)
            try:
                with api_call(f"reserve claim {namespace}/{name} for {len(pods)} pods"):
                    out = self.client.patch(ResourceClaim.Status, name,
                                            reservation_patch(claim.uid, pods, hold=hold, release=dropped),
                                            namespace=namespace, patch_type=PatchType.JSON)
            except errors.ApiStatusError as exc:
                state.unexpect(key, pods)
                # 422: the scheduler reserved one of the pods meanwhile, the list is full, or the
                # claim was replaced; 404: it is gone. Read it again and retry with the truth.
                log.info("claim %s/%s: reserving %d pods ahead failed (attempt %d): %s", namespace, name, len(pods),
                         attempt + 1, exc.message)
                self._refresh(key)
                continue
            # Into the reservation state, not the claim informer: only the watch may say the
            # scheduler's informer has the write too (the gates wait for that).
            state.store(key, out.to_dict())
            with state.lock:
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

    def _refresh(self, key: Key) -> None:
        try:
            with api_call(f"read claim {key[0]}/{key[1]}"):
                claim = self.client.get(ResourceClaim, key[1], namespace=key[0])
            self.state.store(key, claim.to_dict())
        except errors.NotFound:
            self.state.drop(key)

    # -- gates -----------------------------------------------------------------------------------

    def ungate(self, releases: list[Release]) -> list[PendingPod]:
        """Lift the gates; returns the pods whose gate was lifted."""
        if not releases:
            return []
        done = [p for (p, _), ok in zip(releases, self._pool.map(self._ungate_one, releases), strict=True) if ok]
        with self.state.lock:
            self.state.pods.ungated(done)
        self.ungated += len(done)
        if done:
            log.info("lifted the channel-reservation gate of %d pods (%s/%s ...)", len(done), done[0].namespace,
                     done[0].name)
        return done

    def _ungate_one(self, release: Release) -> bool:
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
