"""A gRPC health service whose check exercises the kubelet's real path to the agent.

`Check` dials the agent's own registration socket (GetInfo) and DRA socket (an empty
NodePrepareResources) with short timeouts, so a liveness probe fails when the sockets the kubelet
uses stop answering, not merely when the process is alive.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvlfabric.api.kubelet import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from nvlfabric.nodeagent.server import SocketPaths

CHECK_TIMEOUT_S = 1.0


def sockets_answer(paths: SocketPaths) -> bool:
    try:
        with grpc.insecure_channel(f"unix:{paths.registration}") as ch:
            pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=CHECK_TIMEOUT_S)
        with grpc.insecure_channel(f"unix:{paths.endpoint}") as ch:
            dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=CHECK_TIMEOUT_S)
    except grpc.RpcError:
        return False
    return True


class _Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, paths: SocketPaths) -> None:
        self.paths = paths

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        ok = sockets_answer(self.paths)
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


def serve(paths: SocketPaths, port: int, address: str = "") -> grpc.Server | None:
    """Start the health service on address:port (0 disables); returns the server to stop later."""
    if port <= 0:
        return None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(_Health(paths), server)
    if server.add_insecure_port(f"{address or '[::]'}:{port}") == 0:
        raise OSError(f"health service: cannot listen on {address or '*'}:{port}; choose another --health-port")
    server.start()
    return server
