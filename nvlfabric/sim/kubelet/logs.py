"""The kubelet's HTTPS API on each simulated node's address: `containerLogs` and `healthz`.

`kubectl logs` asks the API server, which connects to the node's kubelet at its InternalIP and
the port in the Node's `status.daemonEndpoints.kubeletEndpoint` (10250), shows its client
certificate (`--kubelet-client-certificate`) and checks the kubelet's serving certificate against
the cluster CA (`--kubelet-certificate-authority`): nvlfabric/sim/pki.py makes both. Each node
listens on its own loopback address, so 144 nodes share one port number.

`GET /containerLogs/<namespace>/<pod>/<container>` takes the kubelet's query parameters:
`tailLines`, `limitBytes`, `previous` (the instances before the current one) and `follow`
(streamed, chunked, until the pod goes or the client hangs up). `timestamps` and `sinceSeconds`
are accepted and not applied: the simulator keeps no time per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger("nvlfabric.sim.kubelet")

KUBELET_PORT = 10250
FOLLOW_POLL_S = 0.25
MAX_HEAD = 64 * 1024
_LOGS = re.compile(r"/containerLogs/([^/]+)/([^/]+)/([^/]+)")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


@dataclass(frozen=True)
class LogSource:
    """Where one container instance's output is: `path` from byte `start` to `end` (None: the end
    of the file, growing while `alive()`)."""

    path: Path
    start: int = 0
    end: int | None = None
    alive: Callable[[], bool] = lambda: False


class LogError(Exception):
    """No such log: the HTTP status and the kubelet's words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Locate = Callable[[str, str, str, bool], LogSource]
"""(namespace, pod, container, previous) → the log, or LogError."""


def select(data: bytes, *, tail_lines: int | None = None, limit_bytes: int | None = None) -> bytes:
    """The part of a log the query asks for (pure): its last `tail_lines` lines (a final newline
    ends the last line, it does not start another), then at most `limit_bytes` of that."""
    if tail_lines is not None:
        parts = data.split(b"\n")  # lines end at \n only, as the kubelet counts them (not at \r)
        lines = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        data = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
    if limit_bytes is not None:
        data = data[:max(limit_bytes, 0)]
    return data


def _int(query: dict[str, list[str]], key: str) -> int | None:
    value = (query.get(key) or [""])[0]
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise LogError(400, f"invalid {key} {value!r}: expected an integer") from None


def _flag(query: dict[str, list[str]], key: str) -> bool:
    return (query.get(key) or ["false"])[0].lower() in ("true", "1")


def _read(source: LogSource, start: int) -> bytes:
    try:
        with source.path.open("rb") as fh:
            fh.seek(start)
            return fh.read() if source.end is None else fh.read(max(source.end - start, 0))
    except FileNotFoundError:
        return b""


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, *, chunked: bool = False) -> None:
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", "Content-Type: text/plain; charset=utf-8",
            "Connection: close"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    if chunked:
        if body:
            writer.write(b"%x\r\n%s\r\n" % (len(body), body))
    else:
        writer.write(body)
    await writer.drain()


async def _follow(writer: asyncio.StreamWriter, source: LogSource, pos: int) -> None:
    while True:
        await asyncio.sleep(FOLLOW_POLL_S)
        alive = source.alive()
        more = _read(source, pos)
        if more:
            pos += len(more)
            writer.write(b"%x\r\n%s\r\n" % (len(more), more))
            await writer.drain()
        elif not alive:
            break
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, locate: Locate) -> None:
    """One request, then the connection closes."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
        writer.close()
        return
    try:
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        url = urlsplit(target)
        if method != "GET":
            raise LogError(405, f"{method} is not served by the simulated kubelet")
        if url.path == "/healthz":
            await _respond(writer, 200, b"ok")
            return
        m = _LOGS.fullmatch(url.path)
        if m is None:
            raise LogError(404, f"{url.path} is not served by the simulated kubelet (containerLogs and healthz are)")
        query = parse_qs(url.query)
        namespace, pod, container = (unquote(g) for g in m.groups())
        previous = _flag(query, "previous")
        source = locate(namespace, pod, container, previous)
        tail, limit = _int(query, "tailLines"), _int(query, "limitBytes")
        data = _read(source, source.start)
        if not (_flag(query, "follow") and not previous):
            await _respond(writer, 200, select(data, tail_lines=tail, limit_bytes=limit))
            return
        await _respond(writer, 200, select(data, tail_lines=tail), chunked=True)
        await _follow(writer, source, source.start + len(data))
    except LogError as exc:
        with contextlib.suppress(ConnectionError):
            await _respond(writer, exc.status, str(exc).encode())
    except (ConnectionError, ssl.SSLError):  # the client went away (kubectl logs -f ended)
        pass
    except asyncio.CancelledError:  # the kubelet stops: end the stream quietly (asyncio's stream
        pass  # callback would log a cancelled handler as an error)
    finally:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            writer.close()


def server_context(cert: Path, key: Path, ca_file: Path) -> ssl.SSLContext:
    """TLS as a kubelet serves it: its own certificate; clients must show one the cluster CA signed."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca_file))
    ctx.load_cert_chain(str(cert), str(key))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def serve(address: str, ctx: ssl.SSLContext, locate: Locate, port: int = KUBELET_PORT) -> asyncio.Server:
    return await asyncio.start_server(lambda r, w: handle(r, w, locate), host=address, port=port, ssl=ctx,
                                      limit=MAX_HEAD)
