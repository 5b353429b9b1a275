"""The agent's Prometheus endpoint: valid exposition format (parsed with prometheus_client's own
parser), served over HTTP."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from nvlfabric.nodeagent import metrics


def test_the_exposition_parses_and_carries_what_was_recorded() -> None:
    metrics.PREPARE_SECONDS.observe(0.0007)
    metrics.PREPARE_SECONDS.observe(3.0)
    metrics.CLAIM_ERRORS.labels("prepare").inc(2)
    metrics.FABRIC_READY.set(1)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition())}
    assert {"nvlfabric_prepare_seconds", "nvlfabric_claim_errors", "nvlfabric_fabric_ready",
            "nvlfabric_prepared_claims", "nvlfabric_imex_domains", "nvlfabric_unprepare_seconds"} <= set(families)
    hist = {(s.name, s.labels.get("le")): s.value for s in families["nvlfabric_prepare_seconds"].samples}
    assert hist[("nvlfabric_prepare_seconds_bucket", "0.0005")] <= hist[("nvlfabric_prepare_seconds_bucket", "0.001")]
    assert hist[("nvlfabric_prepare_seconds_bucket", "+Inf")] == hist[("nvlfabric_prepare_seconds_count", None)]
    assert hist[("nvlfabric_prepare_seconds_bucket", "5.0")] - hist[("nvlfabric_prepare_seconds_bucket", "2.5")] >= 1
    (errors,) = [s for s in families["nvlfabric_claim_errors"].samples if s.labels == {"operation": "prepare"}]
    assert errors.name == "nvlfabric_claim_errors_total" and errors.value >= 2
    assert families["nvlfabric_fabric_ready"].samples[0].value == 1.0


def test_the_endpoint_serves_metrics_and_404s_elsewhere() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics.serve(port, "127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "# TYPE nvlfabric_prepare_seconds histogram" in resp.read().decode()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
        raise AssertionError("expected a 404")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
