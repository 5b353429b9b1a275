"""A minimal DRA plugin: a stand-in for a node's kubelet plugin on the simulated kubelet's side of
the gRPC contract.

It is a double of the node agent's *wire surface only* (registration + DRA service on unix
sockets), so the kubelet can be tested and benchmarked before and independently of the real agent.
It writes one CDI spec per prepared claim, like a real driver, and records every call it receives.

It lives in the simulator room, beside the kubelet it plugs into, because the kubelet tests and
bench/sim.py both drive it: benchmarks use nvlfabric as a user would and import no test helpers.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from nvlfabric.api.kubelet import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from nvlfabric.api.kubelet.cdi import ContainerEdits, Device, DeviceNode, Spec


@dataclass
class FakePlugin:
    driver: str
    registry_dir: Path
    plugin_dir: Path
    cdi_dir: Path
    versions: list[str] = field(default_factory=lambda: ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
    fail_prepare: str = ""
    skip_cdi_spec: bool = False
    prepare_delay_s: float = 0.0  # a slow prepare, to change the pod while the kubelet waits on it
    calls: list[tuple[str, str, list[str]]] = field(default_factory=list)
    registered: threading.Event = field(default_factory=threading.Event)
    registration_error: str = ""
    _servers: list[grpc.Server] = field(default_factory=list)

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"

    def kind(self) -> str:
        return f"k8s.{self.driver}/claim"

    def _prepare(self, pb: Any, request: Any, service: str) -> Any:
        uids = [c.uid for c in request.claims]
        self.calls.append(("prepare", service, uids))
        time.sleep(self.prepare_delay_s)
        resp = pb.NodePrepareResourcesResponse()
        for c in request.claims:
            if self.fail_prepare:
                resp.claims[c.uid].error = self.fail_prepare
                continue
            name = f"{c.uid}-dev"
            if not self.skip_cdi_spec:
                spec = Spec(cdi_version="0.6.0", kind=self.kind(), devices=[Device(
                    name=name, container_edits=ContainerEdits(
                        env=[f"FAKE_CLAIM={c.name}"],
                        device_nodes=[DeviceNode(path="/dev/fake0", type="c", major=507, minor=1)]))])
                (self.cdi_dir / f"k8s.{self.driver}-claim_{c.uid}.json").write_text(spec.to_json())
            resp.claims[c.uid].devices.append(pb.Device(
                request_names=["gpu"], pool_name="pool", device_name="gpu-0",
                cdi_device_ids=[f"{self.kind()}={name}"]))
        return resp

    def _unprepare(self, pb: Any, request: Any, service: str) -> Any:
        self.calls.append(("unprepare", service, [c.uid for c in request.claims]))
        resp = pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            (self.cdi_dir / f"k8s.{self.driver}-claim_{c.uid}.json").unlink(missing_ok=True)
            resp.claims[c.uid].error = ""
        return resp

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        plugin = self

        class V1(dra_v1_pb2_grpc.DRAPluginServicer):
            def NodePrepareResources(self, request: Any, context: Any) -> Any:
                return plugin._prepare(dra_v1_pb2, request, "v1")

            def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
                return plugin._unprepare(dra_v1_pb2, request, "v1")

        class V1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
            def NodePrepareResources(self, request: Any, context: Any) -> Any:
                return plugin._prepare(dra_v1beta1_pb2, request, "v1beta1")

            def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
                return plugin._unprepare(dra_v1beta1_pb2, request, "v1beta1")

        class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
            def GetInfo(self, request: Any, context: Any) -> Any:
                return pluginregistration_pb2.PluginInfo(type="DRAPlugin", name=plugin.driver,
                                                         endpoint=str(plugin.endpoint),
                                                         supported_versions=plugin.versions)

            def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                plugin.registration_error = request.error
                if request.plugin_registered:
                    plugin.registered.set()
                return pluginregistration_pb2.RegistrationStatusResponse()

        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(V1(), dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(V1beta1(), dra)
        dra.add_insecure_port(f"unix:{self.endpoint}")
        dra.start()
        reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(Registration(), reg)
        reg.add_insecure_port(f"unix:{self.registration_socket}")
        reg.start()
        self._servers = [dra, reg]

    def stop(self) -> None:
        for s in self._servers:
            s.stop(grace=None)
        self.registration_socket.unlink(missing_ok=True)
        self.endpoint.unlink(missing_ok=True)
