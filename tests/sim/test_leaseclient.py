"""The simulated kubelet's Lease client (nvlfabric/sim/kubelet/leaseclient.py): against the real
API server, a renewal moves renewTime and a missing Lease is NotFound; against a bare HTTP server,
the answers the API server may also give (chunked bodies, `Connection: close`, a Status refusal)
read right, and connections are reused up to the limit."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import pytest
from lightkube import KubeConfig
from lightkube.resources.coordination_v1 import Lease

from nvlfabric.api import errors
from nvlfabric.sim.kubelet.leaseclient import LeaseClient
from tests.conftest import Cluster


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.cluster
def test_renewals_reach_the_api_server_and_a_missing_lease_is_not_found(cluster: Cluster) -> None:
    name = f"lc-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        leases = LeaseClient.from_config(KubeConfig.from_file(str(cluster.kubeconfig)), connections=2)
        try:
            with pytest.raises(errors.NotFound, match=name):
                await leases.renew(name, _stamp())
            await leases.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                 "metadata": {"name": name, "namespace": "kube-node-lease"},
                                 "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}})
            with pytest.raises(errors.AlreadyExists):
                await leases.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                     "metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": {}})
            stamps = [_stamp() for _ in range(20)]
            await asyncio.gather(*(leases.renew(name, s) for s in stamps))
        finally:
            await leases.close()

    asyncio.run(run())
    lease = cluster.client.get(Lease, name, namespace="kube-node-lease")
    assert lease.spec is not None and lease.spec.renewTime is not None
    cluster.client.delete(Lease, name, namespace="kube-node-lease")


def test_chunked_and_closing_answers_and_refusals_read_right() -> None:
    seen: list[bytes] = []
    connections = 0
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\n<html/>\r\n",
    ]
    conflict = json.dumps({"kind": "Status", "code": 409, "reason": "Conflict",
                           "message": "the object has been modified"}).encode()
    answers[2] = answers[2] % (len(conflict), conflict)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while answers:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
                b"content-length")))
            seen.append(head + await reader.readexactly(length))
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer:
                break
        writer.close()

    async def run() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        leases = LeaseClient(f"http://127.0.0.1:{port}", None, "t0ken", connections=1)
        try:
            await leases.renew("a", "2026-01-01T00:00:00.000000Z")  # chunked
            await leases.renew("b", "2026-01-01T00:00:00.000000Z")  # then the server closes
            with pytest.raises(errors.Conflict, match="has been modified"):
                await leases.renew("c", "2026-01-01T00:00:00.000000Z")
            with pytest.raises(errors.ServerError, match="not a Kubernetes Status"):
                await leases.renew("d", "2026-01-01T00:00:00.000000Z")
        finally:
            await leases.close()
            server.close()

    asyncio.run(run())
    assert connections == 2  # one kept alive for the first two answers, one after the close
    assert seen[0].startswith(b"PATCH /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/a HTTP/1.1\r\n")
    assert b"Authorization: Bearer t0ken\r\n" in seen[0]
    assert b"Content-Type: application/merge-patch+json\r\n" in seen[0]
    assert seen[0].endswith(b'{"spec":{"renewTime":"2026-01-01T00:00:00.000000Z"}}')
