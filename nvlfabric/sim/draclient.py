"""The kubelet's side of a node agent's DRA v1 socket: NodePrepareResources and
NodeUnprepareResources for a list of claims, blocking or as futures, with the answers as plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from nvlfabric.api.kubelet import dra_v1_pb2, dra_v1_pb2_grpc
from nvlfabric.sim.channelclaims import Claim

Result = list[dict[str, object]] | str


def _prepare_results(resp: dra_v1_pb2.NodePrepareResourcesResponse) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for uid, r in resp.claims.items():
        out[uid] = r.error if r.error else [
            {"requests": list(d.request_names), "pool": d.pool_name, "device": d.device_name,
             "cdi": list(d.cdi_device_ids)} for d in r.devices]
    return out


class Kubelet:
    """The kubelet's side of the DRA v1 socket (a fresh channel per agent incarnation, so no
    reconnect back-off stands between a restarted agent and the next call)."""

    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self._channel: grpc.Channel | None = None

    def stub(self) -> dra_v1_pb2_grpc.DRAPluginStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix:{self.endpoint}")
        return dra_v1_pb2_grpc.DRAPluginStub(self._channel)

    def reconnect(self) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    @staticmethod
    def prepare_request(claims: Sequence[Claim]) -> dra_v1_pb2.NodePrepareResourcesRequest:
        return dra_v1_pb2.NodePrepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims])

    @staticmethod
    def unprepare_request(claims: Sequence[Claim]) -> dra_v1_pb2.NodeUnprepareResourcesRequest:
        return dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims])

    def prepare(self, claims: Sequence[Claim], timeout: float = 60) -> dict[str, Result]:
        return _prepare_results(self.stub().NodePrepareResources(self.prepare_request(claims), timeout=timeout))

    def unprepare(self, claims: Sequence[Claim], timeout: float = 60) -> dict[str, str]:
        resp = self.stub().NodeUnprepareResources(self.unprepare_request(claims), timeout=timeout)
        return {uid: r.error for uid, r in resp.claims.items()}

    def prepare_future(self, claims: Sequence[Claim], timeout: float = 60) -> grpc.Future:
        return self.stub().NodePrepareResources.future(self.prepare_request(claims), timeout=timeout)

    def unprepare_future(self, claims: Sequence[Claim], timeout: float = 60) -> grpc.Future:
        return self.stub().NodeUnprepareResources.future(self.unprepare_request(claims), timeout=timeout)

    @staticmethod
    def prepare_result(fut: grpc.Future) -> dict[str, Result]:
        return _prepare_results(fut.result())

    @staticmethod
    def unprepare_result(fut: grpc.Future) -> dict[str, str]:
        return {uid: r.error for uid, r in fut.result().claims.items()}
