"""Lease renewals at fleet size: a small HTTP/1.1 client of the heartbeats' own.

1,152 simulated nodes renew 115 Leases a second. Through lightkube and httpx a renewal cost this
process ~1.8 ms of CPU (the request built by httpx, parsed by h11, the answer parsed into models):
a quarter of a core, of the 2 the whole simulated cluster has, for heartbeats alone, where a real
kubelet (Go) and kubemark's hollow node pay a fraction of it. So renewals go over keep-alive TLS
connections of their own (`connections_for`), as requests written whole and answers read for their
status line; everything else the simulated kubelet does keeps lightkube. The API server sees the same merge
PATCH of `spec.renewTime` (and, for a Lease that is gone, the same POST) as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from typing import Any
from urllib.parse import urlsplit

from lightkube import KubeConfig
from lightkube.config.client_adapter import verify_cluster

from nvlfabric.api import errors

__all__ = ["LEASES", "LeaseClient", "connections_for"]

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
MAX_HEADER_BYTES = 64 * 1024
TIMEOUT_S = 10.0


def connections_for(nodes: int) -> int:
    """Connections for `nodes` nodes' renewals: one request is in flight per HTTP/1.1 connection, and
    under a workload burst a renewal takes the API server ~60 ms, so 4 connections carried 63 of the
    115 renewals a second 1,152 nodes need (each node renewed every ~18 s, not 10). One per 32
    nodes keeps up with twice that latency, 4 to 64."""
    return max(4, min(64, nodes // 32))


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


class LeaseClient:
    """PATCH and POST of Leases over at most `connections` keep-alive connections."""

    def __init__(self, server: str, ssl_context: ssl.SSLContext | None, token: str | None, *,
                 connections: int = 4) -> None:
        url = urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"heartbeats: {server!r} is not an http(s) URL of an API server")
        self.host, self.port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl_context if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.headers = (f"Host: {url.netloc}\r\n{auth}Accept: application/json\r\n"
                        "User-Agent: nvlfabric-sim-kubelet\r\n").encode()
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(connections)

    @classmethod
    def from_config(cls, config: KubeConfig, *, connections: int = 4) -> LeaseClient:
        """From a kubeconfig whose user authenticates with a token or a client certificate."""
        context = config.get()
        assert context is not None, "the kubeconfig has no current context"
        user = context.user
        if user is None or user.exec or user.auth_provider or user.username or user.token_file:
            raise ValueError("heartbeats: the kubeconfig's user must authenticate with a token or a client "
                             "certificate")
        return cls(context.cluster.server, verify_cluster(context.cluster, user, context.abs_file), user.token,
                   connections=connections)

    async def renew(self, name: str, stamp: str) -> None:
        """Set Lease `name`'s renewTime; `errors.NotFound` when it is gone, another `ApiStatusError`
        for any other refusal, OSError/TimeoutError when the server does not answer."""
        body = json.dumps({"spec": {"renewTime": stamp}}, separators=(",", ":")).encode()
        await self._call("PATCH", f"{LEASES}/{name}", body, "application/merge-patch+json")

    async def create(self, lease: dict[str, Any]) -> None:
        """POST a Lease; `errors.AlreadyExists` when one of its name exists."""
        body = json.dumps(lease, separators=(",", ":")).encode()
        await self._call("POST", LEASES, body, "application/json")

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()

    async def _call(self, method: str, path: str, body: bytes, content_type: str) -> None:
        request = (f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode() + self.headers
                   + f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            try:
                if conn is None:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(
                        self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None),
                        TIMEOUT_S)
                    conn = _Connection(reader, writer)
                conn.writer.write(request)
                status, text, keep = await asyncio.wait_for(_response(conn.reader), TIMEOUT_S)
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()
                raise
            except BaseException:
                if conn is not None:
                    await conn.aclose()
                raise
            if keep:
                self._idle.append(conn)
            else:
                await conn.aclose()
        if status >= 400:
            raise _status_error(status, text, f"{method} {path}")


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection stays open) of one HTTP/1.1 answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > MAX_HEADER_BYTES:
        raise OSError("heartbeats: the API server's answer has oversized headers")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise OSError(f"heartbeats: not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
            body += (await reader.readexactly(size + 2))[:-2]
        while (await reader.readline()) not in (b"\r\n", b""):  # trailers
            pass
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    keep = headers.get("connection", "").lower() != "close"
    return int(parts[1]), body, keep


def _status_error(status: int, body: bytes, action: str) -> errors.ApiStatusError:
    """The API server's refusal as the contract's error class."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return errors.from_status(parsed, action=action, code=status)
    return errors.not_a_status(action=action, code=status, reason="")
