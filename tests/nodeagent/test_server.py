"""The agent's gRPC surface, driven by the kubelet's own generated clients (kubeletcheck)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from nvlfabric.nodeagent.server import ClaimRef, PluginServer, PreparedDevice, SocketPaths
from nvlfabric.sim.paths import load_tools


class RecordingDriver:
    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.unprepared: list[str] = []

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        out: dict[str, list[PreparedDevice] | str] = {}
        for c in claims:
            self.prepared.append(c.uid)
            if c.name.startswith("bad"):
                out[c.uid] = f"claim {c.namespace}/{c.name}: not allocated yet"
            elif c.name.startswith("lost"):
                continue  # the server must still answer for it
            else:
                out[c.uid] = [PreparedDevice(("channel",), "rack-0", "channel-7",
                                             (f"k8s.channel.nvlfabric.io/claim={c.uid}-channel-7",))]
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.unprepared += [c.uid for c in claims]
        return {c.uid: "" for c in claims}


@pytest.fixture
def server() -> Iterator[tuple[PluginServer, RecordingDriver]]:
    root = Path(tempfile.mkdtemp(prefix="nvla-", dir="/tmp"))
    driver = RecordingDriver()
    srv = PluginServer(paths=SocketPaths(kubelet_root=root, driver="channel.nvlfabric.io"), driver=driver)
    srv.start()
    yield srv, driver
    srv.stop()
    shutil.rmtree(root, ignore_errors=True)


def check(srv: PluginServer, *claims: str) -> dict[str, object]:
    argv = [str(load_tools().binary("kubeletcheck")), "-registration", str(srv.paths.registration)]
    for c in claims:
        argv += ["-claim", c]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_registers_with_v1_first_and_prepares_every_claim(server: tuple[PluginServer, RecordingDriver]) -> None:
    srv, driver = server
    out = check(srv, "ml/good/u1", "ml/bad-one/u2", "ml/lost/u3")
    assert out["info"] == {"type": "DRAPlugin", "name": "channel.nvlfabric.io", "endpoint": str(srv.paths.endpoint),
                           "supportedVersions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"]}
    assert out["service"] == "v1.DRAPlugin"
    assert srv.registration.registered.is_set()
    prepared = out["prepare"]
    assert isinstance(prepared, dict)
    assert prepared["u1"]["devices"][0]["cdiDeviceIDs"] == ["k8s.channel.nvlfabric.io/claim=u1-channel-7"]
    assert prepared["u2"]["error"] == "claim ml/bad-one: not allocated yet"
    assert "no result" in prepared["u3"]["error"]  # every claim gets an answer
    assert driver.unprepared == ["u1", "u2", "u3"]


def test_sockets_are_owner_only_and_removed_on_stop(server: tuple[PluginServer, RecordingDriver]) -> None:
    srv, _ = server
    for path in (srv.paths.endpoint, srv.paths.registration):
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, oct(mode)
    srv.stop()
    assert not srv.paths.endpoint.exists() and not srv.paths.registration.exists()


def test_a_socket_path_too_long_for_unix_sockets_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"unix sockets allow 107.*--kubelet-root"):
        SocketPaths(kubelet_root=Path("/" + "x" * 100), driver="channel.nvlfabric.io").check()
    # counted in bytes, as sun_path holds them: 40 two-byte characters are 80 bytes
    root = Path("/" + "é" * 40)
    assert len(str(SocketPaths(kubelet_root=root, driver="channel.nvlfabric.io").endpoint)) <= 107
    with pytest.raises(ValueError, match=r"is 1\d\d bytes; unix sockets allow 107"):
        SocketPaths(kubelet_root=root, driver="channel.nvlfabric.io").check()


def test_device_health_is_advertised_and_streamed_when_the_agent_has_a_source() -> None:
    import grpc

    from nvlfabric.api.kubelet import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc
    from nvlfabric.nodeagent.server import HEALTH_VERSION, DeviceHealth

    root = Path(tempfile.mkdtemp(prefix="nvlh-", dir="/tmp"))
    devices = [DeviceHealth("clique-x.1", "channel-3", True), DeviceHealth("clique-x.1", "channel-4", False,
                                                                          "GPU 2 fabric degraded")]
    srv = PluginServer(paths=SocketPaths(kubelet_root=root, driver="channel.nvlfabric.io"), driver=RecordingDriver(),
                       health=lambda: devices)
    srv.start()
    try:
        out = check(srv)
        assert out["info"]["supportedVersions"] == ["v1.DRAPlugin", "v1beta1.DRAPlugin", HEALTH_VERSION]
        assert out["service"] == "v1.DRAPlugin"  # the kubelet still picks the DRA service
        with grpc.insecure_channel(f"unix:{srv.paths.endpoint}") as ch:
            stream = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=10)
            first = next(stream)
            stream.cancel()
        got = [(d.device.device_name, d.health, d.message) for d in first.devices]
        assert got == [("channel-3", dra_health_v1alpha1_pb2.HEALTHY, ""),
                       ("channel-4", dra_health_v1alpha1_pb2.UNHEALTHY, "GPU 2 fabric degraded")]
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_probes_health_service_shares_the_plugin_server_and_fails_when_a_kubelet_socket_is_gone() -> None:
    """The DaemonSet's probes ask the standard health service on a TCP port of the same server:
    SERVING while both kubelet sockets answer, even with probes overlapping each other and the
    kubelet's health stream (each check calls back into the server's own thread pool), and
    NOT_SERVING once the registration socket is gone (the kubelet could not reach the agent).
    The readiness probe's service is SERVING only once the kubelet has registered the plugin."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from nvlfabric.api.kubelet import (
        dra_health_v1alpha1_pb2,
        dra_health_v1alpha1_pb2_grpc,
        pluginregistration_pb2,
        pluginregistration_pb2_grpc,
    )
    from nvlfabric.nodeagent.probes import READY_SERVICE
    from nvlfabric.nodeagent.server import DeviceHealth

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(tempfile.mkdtemp(prefix="nvlp-", dir="/tmp"))
    srv = PluginServer(paths=SocketPaths(kubelet_root=root, driver="channel.nvlfabric.io"), driver=RecordingDriver(),
                       health=lambda: [DeviceHealth("p", "channel-1", True)], health_port=port,
                       listen_address="127.0.0.1")
    srv.start()
    try:
        with grpc.insecure_channel(f"unix:{srv.paths.endpoint}") as kubelet, \
                grpc.insecure_channel(f"127.0.0.1:{port}") as probe:
            stream = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(kubelet).NodeWatchResources(
                dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=30)
            next(stream)  # a worker now holds the open stream
            stub = health_pb2_grpc.HealthStub(probe)
            ready = health_pb2.HealthCheckRequest(service=READY_SERVICE)
            assert stub.Check(ready, timeout=5).status == health_pb2.HealthCheckResponse.NOT_SERVING
            with grpc.insecure_channel(f"unix:{srv.paths.registration}") as reg:
                pluginregistration_pb2_grpc.RegistrationStub(reg).NotifyRegistrationStatus(
                    pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
            assert stub.Check(ready, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as unknown:
                stub.Check(health_pb2.HealthCheckRequest(service="nvlfabric"), timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            with ThreadPoolExecutor(4) as pool:
                statuses = list(pool.map(lambda _: stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status,
                                         range(4)))
            assert statuses == [health_pb2.HealthCheckResponse.SERVING] * 4
            srv.paths.registration.unlink()
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
            stream.cancel()
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_health_port_in_use_fails_the_start_naming_the_flag_before_any_socket_appears() -> None:
    import socket

    root = Path(tempfile.mkdtemp(prefix="nvlq-", dir="/tmp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        srv = PluginServer(paths=SocketPaths(kubelet_root=root, driver="channel.nvlfabric.io"),
                           driver=RecordingDriver(), health_port=s.getsockname()[1], listen_address="127.0.0.1")
        try:
            with pytest.raises(OSError, match="--health-port"):
                srv.start()
            assert not srv.paths.registration.exists() and not srv.paths.endpoint.exists()
        finally:
            shutil.rmtree(root, ignore_errors=True)
