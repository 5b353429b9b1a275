"""The reservation passes: reserve a domain's shared channel claim for its pending pods, many in
one write, place the claims still to be placed, and lift the scheduling gates of the pods that
may go (the why, and what it measured: docs/architecture.md, "Many pods on one claim").

This module holds the order of a pass and when passes run; each step is its own module:
- what the watches show (unbound pods, claims, domains: informers of cache.py) is kept by
  reservationstate.py, the pending pods indexed by pendingpods.py;
- the reservation and gate writes are reservationwriter.py's;
- placement (the pioneer's clique, Kueue's admissions, the no-room Events) is placer.py's;
- the pure rules (what to reserve, whose gate lifts, the patches) are reservationplan.py's and
  placement.py's.

Gates (`nvlfabric.io/channel-reservation`, BoundJob adds it): the pioneer (the oldest gated pod of
a claim not allocated yet, with no ungated user) goes first, with `nodeSelector` pinning it to a
clique where the whole group fits and a channel is free (the group's demand is its
`nvlfabric.io/group-size`); every other pod once the claim watch shows it in `reservedFor` of each
allocated channel claim it names (the scheduler reads the claim from its informer), or after
WATCH_SEEN_S without. Pods Kubernetes schedules as a gang (`spec.schedulingGroup`) are not
reserved or placed here; a gated one in a multi-clique job only gets its rank written.

Every watched change marks its claim for a pass, a short pause before each pass lets a burst of
pod creations go out as one patch, and claims with gated users are looked at again every few
seconds (level-based, so a lost event only delays).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lightkube import Client

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller.cache import Informers
from nvlfabric.controller.placer import Placer
from nvlfabric.controller.reservationplan import Key, PendingPod, pioneer, releasable
from nvlfabric.controller.reservationstate import ReservationState
from nvlfabric.controller.reservationwriter import Release, ReservationWriter

log = logging.getLogger("nvlfabric.reservations")

COALESCE_S = 0.05
"""Pause before a pass, so pod creations arriving together become one patch."""
PIONEER_GRACE_S = 5.0
"""After lifting a pioneer's gate, how long to wait for its claim's allocation before trusting
that the pioneer is gone (the pod and claim watches are two streams: a bound pioneer can leave
the pod cache before its allocation reaches the claim cache)."""
RESYNC_S = 2.0
WATCH_SEEN_S = 2.0
"""How long a reservation written here may stay unseen by the claim watch before its pods' gates
lift anyway (a lost or re-listed watch only delays them this long)."""


class Reserver:
    """Reserves each allocated channel claim for its pending pods and lifts the reservation gate
    of pods that are ready to schedule, from the controller's informers (or its own: tests)."""

    def __init__(self, client: Client, driver: str, *, coalesce_s: float = COALESCE_S,
                 watch_seen_s: float = WATCH_SEEN_S, channels_per_clique: int = names.DEFAULT_CHANNELS_PER_CLIQUE,
                 imex_modes: frozenset[api.IMEXMode] = frozenset(api.IMEXMode),
                 informers: Informers | None = None) -> None:
        self.coalesce_s, self.watch_seen_s = coalesce_s, watch_seen_s
        # Claims, pods, agents' Nodes and domains come from the controller's informers (cache.py)
        # when it shares them (wiring.py runs their watches), else from informers of its own.
        self._owns_cache = informers is None
        self.cache = informers or Informers.of(client)
        self.state = ReservationState(driver)
        self.cache.unbound_pods.listen(self.state.pod_changed)
        self.cache.claims.listen(self.state.claim_changed)
        self.cache.domains.listen(self.state.domain_changed)
        self.placer = Placer(client, self.state, self.cache, channels_per_clique=channels_per_clique,
                             imex_modes=frozenset(m.value for m in imex_modes))
        self.writer = ReservationWriter(client, self.state)
        self._pioneered: dict[Key, float] = {}  # claim → when its pioneer's gate was lifted

    def pass_once(self) -> None:
        """Reserve, place, then release every dirty claim (what `run` does after each pause)."""
        dirty, grouped = self.state.take()
        lifted = {p.uid for p in self.writer.ungate([(p, None) for p in grouped])}
        self.state.retry_grouped([p for p in grouped if p.uid not in lifted])
        self.writer.reserve_all(sorted(dirty))
        self.placer.place(sorted(dirty))
        releases: dict[str, Release] = {}
        with self.state.lock:
            for key in sorted(dirty):
                releases.update((p.uid, (p, clique)) for p, clique in self._releases(key))
        # Pods joining a running domain (replacements, growth) only where their clique has a node.
        self.writer.ungate(self.placer.joiners(list(releases.values())))

    def _releases(self, key: Key) -> list[Release]:
        """The gated users of `key` whose gate may lift now, each with the clique a pioneer is
        sent to (call with the lock held)."""
        state = self.state
        users = state.pods.users(key)
        claim = state.claims.get(key)
        if claim is None or not any(p.gated for p in users):
            return []
        first: PendingPod | None = None
        clique: str | None = None
        if not claim.allocated:
            since = self._pioneered.get(key)
            clique = state.placed.get(key)
            if clique is not None and (since is None or time.monotonic() - since > PIONEER_GRACE_S):
                first = pioneer(users)
        else:
            self._pioneered.pop(key, None)
        out: list[Release] = []
        now = time.monotonic()
        for p in users:
            if not p.gated or state.unseen_by_watch(p, now, self.watch_seen_s):
                continue
            claims = {c: st for c in p.claims if (st := state.claims.get((p.namespace, c))) is not None}
            if releasable(p, claims, frozenset({key[1]}) if p is first else frozenset()):
                out.append((p, clique if p is first else None))
                if p is first:
                    self._pioneered[key] = time.monotonic()
        return out

    def resync(self) -> None:
        """Every claim with a gated user owed a pass; reservations the watch has not shown for
        `watch_seen_s` waited for no more (what `run` does every RESYNC_S)."""
        self.state.resync(self.watch_seen_s)

    def run(self, stop: Callable[[], bool]) -> None:
        """Passes until `stop()` (and, with informers of its own, their watches in threads)."""
        if self._owns_cache:
            for inf in (self.cache.unbound_pods, self.cache.claims, self.cache.nodes, self.cache.bound_pods):
                inf.start(stop)
        last_resync = time.monotonic()
        try:
            while not stop():
                if time.monotonic() - last_resync > RESYNC_S:
                    self.resync()
                    last_resync = time.monotonic()
                if not self.state.wait_for_work(timeout=1.0):
                    continue
                time.sleep(self.coalesce_s)
                try:
                    self.pass_once()
                except Exception:  # one failed pass must not end reservation
                    log.exception("reservation pass failed")
        finally:
            self.writer.shutdown()
