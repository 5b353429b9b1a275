"""What reservation knows between its passes, under one lock: the pending pods (pendingpods.py),
each claim's state as the claim watch shows it (reservationplan.ClaimState), the claims a pass is
owed, where placement sent each claim's pioneer, and the reservations written but not yet seen
by the claim watch.

Why one record with one lock: the pass (reservations.py), placement (placer.py) and the writer
(reservationwriter.py) each read several of these together, and a pass must see a claim's state
and its users as of one moment. The informers' listeners here turn watch events into that state
and mark the claims they touch for a pass; nothing here calls the API server.

Fields are read and written by those three modules with `lock` held ("call with the lock held").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from nvlfabric.api import computedomain as api
from nvlfabric.controller.cache import ClaimRecord, DomainRecord, UnboundPod
from nvlfabric.controller.pendingpods import PendingPods
from nvlfabric.controller.reservationplan import ClaimState, Key, PendingPod, claim_state


class ReservationState:
    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.lock = threading.Condition()
        self.pods = PendingPods()
        self.claims: dict[Key, ClaimState] = {}
        self.dirty: set[Key] = set()
        """Claims owed a pass."""
        self.placed: dict[Key, str] = {}
        """Claim → the clique its pioneer is sent to (placer.py decides; the gate lift carries it)."""
        self.unseen: dict[Key, dict[str, float]] = {}
        """Claim → pods reserved here and when, not yet seen in the claim watch (their gates wait)."""

    # -- listeners: what the informers tell, on their watch threads --------------------------------

    def pod_changed(self, kind: str, key: Any, old: UnboundPod | None, new: UnboundPod | None) -> None:
        """An unbound pod came, changed or went (or was bound: it leaves the watch's selector)."""
        record = new or old
        if record is None:
            return
        uid, pod = record.uid, new.pending if new is not None else None
        with self.lock:
            if pod is None or pod.pod_group:
                self.pods.forget(uid)
                self.pods.drop_grouped(uid)
                if pod is not None and pod.gated:  # Kubernetes places it: only its rank is ours to write
                    self.pods.add_grouped(pod)
                    self.lock.notify()
                return
            self.pods.remember(pod, time.monotonic())
            self.dirty.update((pod.namespace, c) for c in pod.claims)
            self.lock.notify()

    def claim_changed(self, kind: str, key: Key, old: ClaimRecord | None, new: ClaimRecord | None) -> None:
        """A claim's state, and the reservations it shows."""
        with self.lock:
            if new is None:
                self.claims.pop(key, None)
                self.placed.pop(key, None)
                self.pods.newest_user.pop(key, None)
                self.unseen.pop(key, None)
                return
            self.claims[key] = state = claim_state(new.raw, self.driver)
            if (unseen := self.unseen.get(key)) is not None:
                for uid in state.reserved:
                    unseen.pop(uid, None)
                if not unseen:
                    del self.unseen[key]
            self.dirty.add(key)
            self.lock.notify()

    def domain_changed(self, kind: str, key: Key, old: DomainRecord | None, new: DomainRecord | None) -> None:
        """A domain that comes (its watch event after its claim's) makes its claims worth a pass."""
        if old is not None or new is None or new.cd is None:
            return  # only a domain's arrival: its status writes are no news to placement
        with self.lock:
            self.dirty.update((key[0], c) for c in api.channel_claim_names(new.cd.metadata.name, new.cd.spec))
            self.lock.notify()

    # -- the pass's side -------------------------------------------------------------------------

    def wait_for_work(self, timeout: float) -> bool:
        """Whether a pass is owed; if none is, waits up to `timeout` for one first (and says False)."""
        with self.lock:
            if not self.dirty and not self.pods.has_grouped():
                self.lock.wait(timeout=timeout)
                return False
            return True

    def take(self) -> tuple[set[Key], list[PendingPod]]:
        """The claims owed a pass and the grouped pods whose gate is to lift, each taken once."""
        with self.lock:
            dirty, self.dirty = self.dirty, set()
            return dirty, self.pods.take_grouped()

    def retry_grouped(self, pods: list[PendingPod]) -> None:
        """Grouped pods whose gate did not lift: again at the next resync."""
        with self.lock:
            self.pods.retry_grouped(pods)

    def resync(self, watch_seen_s: float) -> None:
        """Mark every claim with a gated user dirty (level-based: a lost event only delays); stop
        waiting for the watch to show reservations written `watch_seen_s` ago; retry the grouped
        pods whose gate did not lift."""
        with self.lock:
            self.dirty.update(self.pods.gated_claims())
            now = time.monotonic()
            for key, unseen in list(self.unseen.items()):  # what the watch never showed is waited for no more
                for uid, written in list(unseen.items()):
                    if now - written >= watch_seen_s:
                        del unseen[uid]
                if not unseen:
                    del self.unseen[key]
            self.pods.requeue_grouped()

    def unseen_by_watch(self, pod: PendingPod, now: float, watch_seen_s: float) -> bool:
        """Whether a reservation of `pod` written here is not yet in the claim watch, and not for
        long (call with the lock held)."""
        return any(now - written < watch_seen_s for c in pod.claims
                   if (written := self.unseen.get((pod.namespace, c), {}).get(pod.uid)) is not None)

    # -- the writer's side -----------------------------------------------------------------------

    def expect(self, key: Key, pods: list[PendingPod]) -> None:
        """Reservations about to be written: their pods' gates wait for the watch to show them (call
        with the lock held, before the write is sent: its event may come before the answer)."""
        now = time.monotonic()
        self.unseen.setdefault(key, {}).update((p.uid, now) for p in pods)

    def unexpect(self, key: Key, pods: list[PendingPod]) -> None:
        """Reservations whose write failed: nothing to wait for."""
        with self.lock:
            for p in pods:
                self.unseen.get(key, {}).pop(p.uid, None)

    def store(self, key: Key, raw: dict[str, Any]) -> None:
        """A claim as a write of ours returned it, or as read again."""
        with self.lock:
            self.claims[key] = claim_state(raw, self.driver)

    def drop(self, key: Key) -> None:
        with self.lock:
            self.claims.pop(key, None)
