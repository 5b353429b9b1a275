"""The controller's health and metrics endpoint (`--health-port`, 8080 in the Deployment).

- `/healthz` (liveness): 200 while the process's main loop (leader election: standby reads,
  holder renews) has ticked within `stale_s`; 503 when it is stuck, so the kubelet restarts it.
- `/readyz` (readiness): 200 for the leader, and for a standby whose last read of the Lease
  succeeded within `stale_s` (it can take over); 503 otherwise. A standby is ready on purpose:
  a Deployment of two replicas must be able to roll, and only one of them can ever lead.
- `/metrics`: `nvlfabric_controller_leader` (1 on the holder),
  `nvlfabric_controller_watch_failures_total{watch}` (failed lists or watches, per watched kind)
  and `nvlfabric_controller_domain_member_changes_total{direction}` (joined, left).

Served with `nvlfabric.daemon.metrics`, the same exposition the node agent uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from socketserver import TCPServer

from nvlfabric.daemon import metrics
from nvlfabric.kube.errors import translate

log = logging.getLogger("nvlfabric.controller")

REGISTRY = metrics.Registry()
LEADER = metrics.Gauge(REGISTRY, "nvlfabric_controller_leader", "1 while this replica holds the controller's Lease")
MEMBER_CHANGES = metrics.Counter(REGISTRY, "nvlfabric_controller_domain_member_changes",
                                 "Member nodes that joined or left a Ready ComputeDomain (its job grown or shrunk, a "
                                 "replacement joining), by direction", "direction")
WATCH_FAILURES = metrics.Counter(REGISTRY, "nvlfabric_controller_watch_failures",
                                 "Lists or watches of the API server that failed, by watched kind", "watch")

WARN_AFTER = 3
"""Consecutive failures of one watch before they are logged at WARNING (one is routine: a 410 Gone)."""
BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 30.0


def backoff(consecutive: int) -> float:
    """Seconds to wait after the `consecutive`-th failure in a row (pure): 1, 2, 4 ... at most 30."""
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(10, max(0, consecutive - 1))))


def watch_failed(watch: str, exc: Exception, consecutive: int, logger: logging.Logger = log) -> float:
    """Count and log one failed list/watch of `watch`; the back-off to sleep before listing again."""
    WATCH_FAILURES.labels(watch).inc()
    delay = backoff(consecutive)
    # Translated, so a refusal reads as the API server's Status says it (a 403 names who may not
    # do what), not as httpx's "Client error ... for url" with a link to MDN.
    logger.log(logging.WARNING if consecutive >= WARN_AFTER else logging.DEBUG,
               "watch of %s failed (%d in a row): %s; listing again in %.0f s", watch, consecutive,
               translate(exc, action=f"list or watch {watch}"), delay)
    return delay


class Health:
    """What the probes answer from; the main loop calls `tick`."""

    def __init__(self, *, stale_s: float, leading: Callable[[], bool], last_read: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_s, self.leading, self.last_read, self.clock = stale_s, leading, last_read, clock
        self.last_tick = clock()

    def tick(self) -> None:
        self.last_tick = self.clock()
        LEADER.set(1 if self.leading() else 0)

    def healthz(self) -> metrics.Response:
        age = self.clock() - self.last_tick
        if age > self.stale_s:
            return 503, f"main loop stuck for {age:.0f} s\n", "text/plain; charset=utf-8"
        return 200, "ok\n", "text/plain; charset=utf-8"

    def readyz(self) -> metrics.Response:
        if self.leading():
            return 200, "leader\n", "text/plain; charset=utf-8"
        age = self.clock() - self.last_read()
        if age > self.stale_s:
            return 503, f"standby, the Lease not read for {age:.0f} s\n", "text/plain; charset=utf-8"
        return 200, "standby\n", "text/plain; charset=utf-8"


def serve(port: int, address: str, health: Health) -> TCPServer | None:
    return metrics.serve(port, address, {"/healthz": health.healthz, "/readyz": health.readyz,
                                         "/metrics": metrics.metrics_route(REGISTRY)}, name="health")
