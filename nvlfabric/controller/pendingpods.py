"""The pending pods reservation knows of, indexed by uid and by each claim they name.

Why an index: a reservation pass looks up one claim's users, and scanning every pending pod for
each claim cost 1,152 pods x 64 claims at every pass at 64 racks (docs/architecture.md, Scale).
Beside the index: the gated pods of Kubernetes' own pod groups (only their rank is the
controller's to write: they are never reserved or placed here), and when each claim's newest
user came (a group without a size annotation is complete once no new user came for a while).

A plain data structure: its owner (reservationstate.py) holds the reservation lock around every
call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from nvlfabric.controller.reservationplan import Key, PendingPod


class PendingPods:
    def __init__(self) -> None:
        self._by_uid: dict[str, PendingPod] = {}
        self._by_claim: dict[Key, dict[str, PendingPod]] = {}
        self.newest_user: dict[Key, float] = {}
        """Claim → when its newest user appeared."""
        self._grouped: dict[str, PendingPod] = {}  # gated pods of Kubernetes' pod groups, by uid
        self._retry: dict[str, PendingPod] = {}  # ... whose gate failed to lift: again at the resync

    # -- the index -------------------------------------------------------------------------------

    def users(self, key: Key) -> list[PendingPod]:
        """The pending pods naming claim `key`."""
        return list(self._by_claim.get(key, {}).values())

    def __contains__(self, uid: str) -> bool:
        return uid in self._by_uid

    def remember(self, pod: PendingPod, now: float) -> None:
        """Record (or replace) a pending pod; a pod not seen before is its claims' newest user."""
        if pod.uid not in self._by_uid:
            self.newest_user.update(((pod.namespace, c), now) for c in pod.claims)
        self._put(pod)

    def _put(self, pod: PendingPod) -> None:
        self.forget(pod.uid)
        self._by_uid[pod.uid] = pod
        for c in pod.claims:
            self._by_claim.setdefault((pod.namespace, c), {})[pod.uid] = pod

    def forget(self, uid: str) -> None:
        old = self._by_uid.pop(uid, None)
        if old is None:
            return
        for c in old.claims:
            users = self._by_claim.get((old.namespace, c))
            if users is not None:
                users.pop(uid, None)
                if not users:
                    del self._by_claim[(old.namespace, c)]

    def ungated(self, pods: Iterable[PendingPod]) -> None:
        """Pods whose gate was lifted here: ungated from now on, before the watch says so."""
        for p in pods:
            if (known := self._by_uid.get(p.uid)) is not None:
                self._put(dataclasses.replace(known, gated=False))

    def gated_claims(self) -> set[Key]:
        """Every claim with a gated user."""
        return {(p.namespace, c) for p in self._by_uid.values() if p.gated for c in p.claims}

    # -- pods of Kubernetes' pod groups ----------------------------------------------------------

    def drop_grouped(self, uid: str) -> None:
        self._grouped.pop(uid, None)
        self._retry.pop(uid, None)

    def add_grouped(self, pod: PendingPod) -> None:
        """A gated pod Kubernetes places: only its rank is ours to write, as its gate lifts."""
        self._grouped[pod.uid] = pod

    def has_grouped(self) -> bool:
        return bool(self._grouped)

    def take_grouped(self) -> list[PendingPod]:
        """The grouped pods whose gate is to lift now (each taken once)."""
        out, self._grouped = list(self._grouped.values()), {}
        return out

    def retry_grouped(self, pods: Iterable[PendingPod]) -> None:
        """Grouped pods whose gate did not lift: again at the next resync."""
        self._retry.update((p.uid, p) for p in pods)

    def requeue_grouped(self) -> None:
        self._grouped.update(self._retry)
        self._retry.clear()
