"""Prometheus metrics of the node agent (served on --metrics-port; 0 disables).

The exposition format and the HTTP endpoint are `nvlfabric.daemon.metrics` (the controller serves
its own registry with them); this module holds the agent's metrics.
"""

from __future__ import annotations

from nvlfabric.daemon import metrics as _m

REGISTRY = _m.Registry()

PREPARE_SECONDS = _m.Histogram(REGISTRY, "nvlfabric_prepare_seconds", "NodePrepareResources latency per claim")
UNPREPARE_SECONDS = _m.Histogram(REGISTRY, "nvlfabric_unprepare_seconds", "NodeUnprepareResources latency per claim")
CLAIM_ERRORS = _m.Counter(REGISTRY, "nvlfabric_claim_errors", "Claims answered with an error", "operation")
PREPARED_CLAIMS = _m.Gauge(REGISTRY, "nvlfabric_prepared_claims", "Claims prepared on this node")
FABRIC_READY = _m.Gauge(REGISTRY, "nvlfabric_fabric_ready", "1 when every GPU's NVLink fabric registration completed")
IMEX_DOMAINS = _m.Gauge(REGISTRY, "nvlfabric_imex_domains", "IMEX daemons this agent runs")
FABRIC_HEALTHY = _m.Gauge(REGISTRY, "nvlfabric_fabric_healthy",
                          "1 when NVML reports every GPU present and its NVLink fabric registered and healthy")
FABRIC_UNHEALTHY_GPUS = _m.Gauge(REGISTRY, "nvlfabric_fabric_unhealthy_gpus",
                                 "GPUs whose NVLink fabric is not healthy, missing, or unreadable (NVML errors)")


def exposition() -> str:
    """Every metric in the text format (version 0.0.4)."""
    return REGISTRY.exposition()


def serve(port: int, address: str = "") -> None:
    """Serve /metrics on `address:port` from one daemon thread (0: do not serve)."""
    route = _m.metrics_route(REGISTRY)
    _m.serve(port, address, {"/metrics": route, "/": route})
