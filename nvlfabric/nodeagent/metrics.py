"""Prometheus metrics of the node agent (served on --metrics-port; 0 disables).

Names follow Prometheus conventions: a unit suffix, `_total` for counters.

Why not prometheus_client: the agent has six metrics and a 60 MB budget, and the library (with
the WSGI server it starts) costs ~2 MB of it. This is the text exposition format 0.0.4 for
counters, gauges and histograms, served by a one-thread HTTP server on the standard library; the
tests parse it with prometheus_client's own parser.
"""

from __future__ import annotations

import bisect
import math
import socketserver
import threading
from collections.abc import Sequence

_LOCK = threading.Lock()
# Buckets span a warm prepare (well under 1 ms) to an IMEX cold start near the kubelet's 45 s budget.
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 45)


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        _REGISTRY.append(self)

    def header(self, name: str | None = None) -> list[str]:
        name = name or self.name
        return [f"# HELP {name} {self.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}",
                f"# TYPE {name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help_text)
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def lines(self) -> list[str]:
        return [*self.header(), f"{self.name} {_num(self.value)}"]


class _Child:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        with _LOCK:
            self.value += amount


class Counter(_Metric):
    """A counter with one label."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, label: str) -> None:
        super().__init__(name, help_text)
        self.label = label
        self.children: dict[str, _Child] = {}

    def labels(self, value: str) -> _Child:
        with _LOCK:
            return self.children.setdefault(value, _Child())

    def lines(self) -> list[str]:
        # In the 0.0.4 text format a counter's family is named with its _total suffix.
        return [*self.header(f"{self.name}_total"),
                *(f'{self.name}_total{{{self.label}="{_escape(v)}"}} {_num(c.value)}'
                  for v, c in sorted(self.children.items()))]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = _BUCKETS) -> None:
        super().__init__(name, help_text)
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        with _LOCK:
            self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
            self.sum += seconds

    def lines(self) -> list[str]:
        out, total = self.header(), 0
        with _LOCK:
            counts, observed = list(self.counts), self.sum
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            total += n
            out.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {total}')
        return [*out, f"{self.name}_count {total}", f"{self.name}_sum {_num(observed)}"]


_REGISTRY: list[_Metric] = []

PREPARE_SECONDS = Histogram("nvlfabric_prepare_seconds", "NodePrepareResources latency per claim")
UNPREPARE_SECONDS = Histogram("nvlfabric_unprepare_seconds", "NodeUnprepareResources latency per claim")
CLAIM_ERRORS = Counter("nvlfabric_claim_errors", "Claims answered with an error", "operation")
PREPARED_CLAIMS = Gauge("nvlfabric_prepared_claims", "Claims prepared on this node")
FABRIC_READY = Gauge("nvlfabric_fabric_ready", "1 when every GPU's NVLink fabric registration completed")
IMEX_DOMAINS = Gauge("nvlfabric_imex_domains", "IMEX daemons this agent runs")


def exposition() -> str:
    """Every metric in the text format (version 0.0.4)."""
    return "".join(line + "\n" for m in _REGISTRY for line in m.lines())


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5

    def handle(self) -> None:
        request = self.rfile.readline(8192).decode("latin-1").split()
        while self.rfile.readline(8192).strip():  # the headers: not needed
            pass
        if len(request) >= 2 and request[0] in ("GET", "HEAD") and request[1].split("?")[0] in ("/metrics", "/"):
            body, status = exposition().encode(), "200 OK"
            ctype = "text/plain; version=0.0.4; charset=utf-8"
        else:
            body, status, ctype = b"not found: try /metrics\n", "404 Not Found", "text/plain; charset=utf-8"
        head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        self.wfile.write(head + (body if request[:1] != ["HEAD"] else b""))


class _Server(socketserver.TCPServer):
    allow_reuse_address = True


def serve(port: int, address: str = "") -> None:
    """Serve /metrics on `address:port` from one daemon thread (0: do not serve)."""
    if port > 0:
        server = _Server((address, port), _Handler)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
