"""Prometheus text exposition (format 0.0.4) and a tiny HTTP endpoint, for our long-running processes.

Shared by the node agent (`nvlfabric.nodeagent.metrics`) and the controller
(`nvlfabric.controller.endpoint`), each with a `Registry` of its own. Names follow Prometheus
conventions: a unit suffix, `_total` for counters.

Why not prometheus_client: the agent has six metrics and a 60 MB budget, and the library (with
the WSGI server it starts) costs ~2 MB of it. This is counters, gauges and histograms, served by a
one-thread HTTP server on the standard library; the tests parse it with prometheus_client's own
parser. Standard library only (the contract room's rule).
"""

from __future__ import annotations

import bisect
import math
import socketserver
import threading
from collections.abc import Callable, Mapping, Sequence

from nvlfabric.api import names

_LOCK = threading.Lock()
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Buckets span a warm prepare (well under 1 ms) to an IMEX cold start near the kubelet's budget.
DEFAULT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20,
                   names.KUBELET_PREPARE_TIMEOUT_S)


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Registry:
    """The metrics one process exposes."""

    def __init__(self) -> None:
        self.metrics: list[_Metric] = []

    def exposition(self) -> str:
        """Every metric in the text format (version 0.0.4)."""
        return "".join(line + "\n" for m in self.metrics for line in m.lines())


class _Metric:
    kind = ""

    def __init__(self, registry: Registry, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        registry.metrics.append(self)

    def header(self, name: str | None = None) -> list[str]:
        name = name or self.name
        return [f"# HELP {name} {self.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}",
                f"# TYPE {name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, registry: Registry, name: str, help_text: str) -> None:
        super().__init__(registry, name, help_text)
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

    def __init__(self, registry: Registry, name: str, help_text: str, label: str) -> None:
        super().__init__(registry, name, help_text)
        self.label = label
        self.children: dict[str, _Child] = {}

    def labels(self, value: str) -> _Child:
        with _LOCK:
            return self.children.setdefault(value, _Child())

    def lines(self) -> list[str]:
        # In the 0.0.4 text format a counter's family is named with its _total suffix.
        with _LOCK:
            children = sorted(self.children.items())
        return [*self.header(f"{self.name}_total"),
                *(f'{self.name}_total{{{self.label}="{_escape(v)}"}} {_num(c.value)}' for v, c in children)]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, registry: Registry, name: str, help_text: str,
                 buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        super().__init__(registry, name, help_text)
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


Response = tuple[int, str, str]
"""(HTTP status code, body, content type) of one route."""
Route = Callable[[], Response]
_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


def metrics_route(registry: Registry) -> Route:
    return lambda: (200, registry.exposition(), CONTENT_TYPE)


SHUTDOWN_POLL_S = 10.0
"""How long a `shutdown()` of a `serve` server may take to be noticed (nothing in nvlfabric calls it:
the thread is a daemon and ends with the process)."""


def serve(port: int, address: str, routes: Mapping[str, Route], *,
          name: str = "metrics") -> socketserver.TCPServer | None:
    """Serve GET/HEAD of `routes` (path → response) on `address:port` from one daemon thread; any
    other path is a 404 naming the routes. Port 0: do not serve (None)."""
    if port <= 0:
        return None
    listing = ", ".join(sorted(p for p in routes if p != "/"))

    class Handler(socketserver.StreamRequestHandler):
        timeout = 5

        def handle(self) -> None:
            request = self.rfile.readline(8192).decode("latin-1").split()
            while self.rfile.readline(8192).strip():  # the headers: not needed
                pass
            asked = len(request) >= 2 and request[0] in ("GET", "HEAD")
            route = routes.get(request[1].split("?")[0]) if asked else None
            if route is not None:
                code, text, ctype = route()
            else:
                code, text, ctype = 404, f"not found: try {listing}\n", "text/plain; charset=utf-8"
            body = text.encode()
            head = (f"HTTP/1.0 {code} {_REASONS.get(code, '')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            self.wfile.write(head + (body if request[:1] != ["HEAD"] else b""))

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    server = Server((address, port), Handler)
    # serve_forever's poll interval is only how soon shutdown() is noticed; its default (0.5 s)
    # wakes every agent twice a second for nothing. A connection wakes it at once either way.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, name=name,
                     daemon=True).start()
    return server
