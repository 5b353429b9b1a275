"""The standard gRPC health service (the DaemonSet's probes), whose check exercises the kubelet's
real path to the agent.

`Check` dials the agent's own registration socket (GetInfo) and DRA socket (an empty
NodePrepareResources) with short timeouts, so a liveness probe fails when the sockets the kubelet
uses stop answering, not merely when the process is alive (the startup and liveness probes ask
for the server's overall health, service ""). The readiness probe asks for `READY_SERVICE`:
SERVING once the kubelet has registered the plugin, so `kubectl get pods` shows an agent Ready
only when its kubelet can call it, and a readiness probe costs no dialling. It is served by the plugin server
(server.py) on a TCP port besides the two sockets: one gRPC server, because each one in a Python
process wakes five times a second to look for signals, on every node.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvlfabric.api.kubelet import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

CHECK_TIMEOUT_S = 1.0
READY_SERVICE = "registered"
REGISTRATION_WAIT_S = 3.0
"""How long a readiness check waits for the kubelet's registration before saying NOT_SERVING:
the first readiness probe comes right after the startup probe passed, i.e. as the sockets
appear, while the kubelet registers the plugin a moment later; without the wait every agent
start would record a 'Readiness probe failed' warning. Below the probe's 5 s timeout."""


def sockets_answer(registration: Path, endpoint: Path) -> bool:
    try:
        with grpc.insecure_channel(f"unix:{registration}") as ch:
            pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=CHECK_TIMEOUT_S)
        with grpc.insecure_channel(f"unix:{endpoint}") as ch:
            dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=CHECK_TIMEOUT_S)
    except grpc.RpcError:
        return False
    return True


class _Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, registration: Path, endpoint: Path, registered: threading.Event) -> None:
        self.sockets = (registration, endpoint)
        self.registered = registered

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.service == READY_SERVICE:
            ok = self.registered.wait(REGISTRATION_WAIT_S)
        elif request.service == "":
            ok = sockets_answer(*self.sockets)
        else:  # the health protocol's answer for a service the server does not know
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}: ask for '' (the "
                          f"kubelet sockets answer) or {READY_SERVICE!r} (the kubelet registered the plugin)")
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


def add_to(server: grpc.Server, *, registration: Path, endpoint: Path, registered: threading.Event) -> None:
    """Add the health service to `server` (not started yet; its caller adds the port).
    `registered` is set once the kubelet has registered the plugin."""
    health_pb2_grpc.add_HealthServicer_to_server(_Health(registration, endpoint, registered), server)
