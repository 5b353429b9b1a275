"""Prometheus metrics of the node agent (served on --metrics-port; 0 disables).

Names follow Prometheus conventions: a unit suffix, `_total` for counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()
# Buckets span a warm prepare (well under 1 ms) to an IMEX cold start near the kubelet's 45 s budget.
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 45)

PREPARE_SECONDS = Histogram("nvlfabric_prepare_seconds", "NodePrepareResources latency per claim",
                            buckets=_BUCKETS, registry=REGISTRY)
UNPREPARE_SECONDS = Histogram("nvlfabric_unprepare_seconds", "NodeUnprepareResources latency per claim",
                              buckets=_BUCKETS, registry=REGISTRY)
CLAIM_ERRORS = Counter("nvlfabric_claim_errors_total", "Claims answered with an error", ["operation"],
                       registry=REGISTRY)
PREPARED_CLAIMS = Gauge("nvlfabric_prepared_claims", "Claims prepared on this node", registry=REGISTRY)
FABRIC_READY = Gauge("nvlfabric_fabric_ready", "1 when every GPU's NVLink fabric registration completed",
                     registry=REGISTRY)
IMEX_DOMAINS = Gauge("nvlfabric_imex_domains", "IMEX daemons this agent runs", registry=REGISTRY)


def serve(port: int, address: str = "") -> None:
    if port > 0:
        start_http_server(port, addr=address, registry=REGISTRY)
