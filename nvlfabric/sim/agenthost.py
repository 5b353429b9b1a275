"""The node agent as the kubelet sees it: a separate process (`python -m nvlfabric agent`, the real
entry point) on a simulated node, and a kubelet-side gRPC client for its DRA socket.

A host is one simulated GB200 node with its own NVML topology (a random cluster UUID, so its clique
is unique in a shared cluster), the NVML/IMEX stand-ins in its driver root, a boot id file, and its
Node object in the API server.

It lives in the simulator room because it stands in for the node and the kubelet around one agent,
and the crash and fuzz tests and bench/nodeagent.py all drive it (benchmarks import no test
helpers). Like the rest of the simulator it knows the agent only by its command line and the
contract (`nvlfabric.api.names`: paths, CDI and pool names), never by importing the node agent or
the controller. The clique's channel pool is the controller's part: callers publish it with
`nvlfabric.controller.pools.apply(client, host.clique, channels=N)` after `register`, and withdraw
it with `pools.withdraw` after `unregister`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.models.resource_v1 import (
    CELDeviceSelector,
    DeviceClaim,
    DeviceClaimConfiguration,
    DeviceClassSpec,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    OpaqueDeviceConfiguration,
    ResourceClaimSpec,
)
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import computedomain as cdapi
from nvlfabric.api import names
from nvlfabric.api.channelconfig import ChannelConfig, ComputeDomainRef
from nvlfabric.api.kubelet import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from nvlfabric.api.names import CLIQUE_LABEL, DEVICE_CLASS, DRIVER
from nvlfabric.sim import hardware, nodeimage
from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes
from nvlfabric.sim.nodes import SimNode, rack_nodes
from nvlfabric.sim.nvml import topology

ComputeDomainResource = create_namespaced_resource(names.GROUP, cdapi.VERSION, cdapi.KIND, cdapi.PLURAL)


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Host:
    """One simulated node for an agent process."""

    state: Path
    node: SimNode
    clique: str

    @property
    def boot_id(self) -> Path:
        return self.node.dir / "boot_id"

    @property
    def plugin_dir(self) -> Path:
        return self.node.kubelet_root / "plugins" / DRIVER

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration(self) -> Path:
        return self.node.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.node.cdi_dirs[1]

    @property
    def channel_dir(self) -> Path:
        return self.node.driver_root / names.IMEX_CHANNEL_DIR.lstrip("/")

    @property
    def imex_workdir(self) -> Path:
        return self.plugin_dir / "imex"

    def cdi_specs(self) -> dict[str, Path]:
        """Claim UID → our spec file in the dynamic CDI dir."""
        prefix = names.CDI_SPEC_PREFIX
        return {p.name.removeprefix(prefix).removesuffix(".json"): p
                for p in self.cdi_dir.glob(f"{prefix}*.json")}

    def channel_nodes(self) -> dict[int, Path]:
        if not self.channel_dir.is_dir():
            return {}
        return {int(p.name.removeprefix("channel")): p for p in self.channel_dir.glob("channel*")}

    def temp_files(self) -> list[Path]:
        """Leftovers of interrupted atomic writes anywhere the agent writes."""
        out: list[Path] = []
        for d in (self.plugin_dir, self.cdi_dir, self.channel_dir):
            if d.is_dir():
                out += [p for p in d.iterdir() if p.name.startswith(".")]
        if self.imex_workdir.is_dir():
            out += [p for p in self.imex_workdir.rglob(".*") if p.is_file()]
        return out

    def imex_daemons(self) -> dict[int, str]:
        """pid → config path of every live nvidia-imex process whose config lies under this host."""
        out: dict[int, str] = {}
        marker = str(self.imex_workdir).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            if argv and argv[0].endswith(b"nvidia-imex") and any(a.startswith(marker) for a in argv):
                out[int(proc.name)] = next(a.decode() for a in argv if a.startswith(marker))
        return out


def stop_daemons(host: Host, *, settle: float = 1.0) -> None:
    """Kill every nvidia-imex of `host` (its config under the host, or listening on its address), until
    none has shown up for `settle` seconds: a daemon whose agent was killed between fork and exec
    execs after a single scan."""
    quiet_since = time.monotonic()
    while True:
        pids = set(host.imex_daemons()) | _listening_imex(host.node.address)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if pids:
            quiet_since = time.monotonic()
        if time.monotonic() - quiet_since >= settle:
            return
        time.sleep(0.1)


def _listening_imex(address: str) -> set[int]:
    try:
        out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    found = set()
    for line in out.splitlines():
        if f"{address}:" in line and '"nvidia-imex"' in line:
            found |= {int(m) for m in re.findall(r"pid=(\d+)", line)}
    return found


def _address_free(address: str) -> bool:
    """Nothing holds the IMEX ports (slot 0) on this loopback address: no other run uses this rack."""
    for port in (50000, 50005):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError:
                return False
    return True


def make_host(state: Path, racks: range) -> Host:
    """Directories, stand-ins, topology (fabric ready, a clique of our own) and boot id of one node,
    on the first rack of `racks` whose loopback address is free (another run of the same test on this
    machine, or a daemon an aborted run left, holds its rack's IMEX ports)."""
    rack = next((r for r in racks if _address_free(f"127.10.{r}.1")), None)
    if rack is None:
        raise RuntimeError(f"the IMEX ports of every rack address 127.10.{racks.start}-{racks.stop - 1}.1 are taken")
    (node,) = rack_nodes(state, racks=1, nodes_per_rack=1, first_rack=rack)
    node.prepare_dirs()
    hardware.install_driver_root(node, hardware.build_standins())
    nodeimage.build_keeper()
    hardware.write_node_identity(state, node)
    rack_name = topology.rack_name(rack)
    topo = topology.Topology(
        racks=(topology.Rack(name=rack_name, cluster_uuid=uuid.uuid4()),),
        nodes=(topology.Node(name=node.name, rack=rack_name,
                             gpus=tuple(topology.gb200_gpu(node.name, i) for i in range(4))),))
    path = hardware.topology_path(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    topo.write(path)
    host = Host(state=state, node=node, clique=topo.clique(node.name))
    host.boot_id.write_text(f"{uuid.uuid4()}\n")
    return host


def register(client: Client, host: Host) -> None:
    """The cluster side a running driver would have made, but for the clique's channel pool (the
    controller's, which the caller publishes): CRD, Node (Ready, in the clique), the DeviceClass."""
    install_crd(client)
    delete_nodes(client, [host.node.name])
    make_ready_nodes(client, {host.node.name: {CLIQUE_LABEL: host.clique}},
                     addresses={host.node.name: host.node.address})
    with contextlib.suppress(ApiError):
        client.create(DeviceClass(metadata=ObjectMeta(name=DEVICE_CLASS), spec=DeviceClassSpec(selectors=[
            DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{DRIVER}"'))])))


def unregister(client: Client, host: Host) -> None:
    """The host's Node (the caller withdraws the clique's pool)."""
    delete_nodes(client, [host.node.name])


def remove_host(host: Host) -> None:
    """The host's directories (the node's runtime dir, when the simulator keeps one apart)."""
    runtime = getattr(host.node, "runtime_dir", None)
    for d in (host.state, runtime):
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)


def _uid(obj: Any) -> str:
    """The UID the API server gave `obj` (a created object always has one)."""
    assert obj.metadata is not None and obj.metadata.uid is not None, f"{obj!r} has no UID"
    return str(obj.metadata.uid)


def claim_spec(parameters: object) -> ResourceClaimSpec:
    """A channel claim of our DeviceClass with `parameters` as its opaque config: anything, not only
    a mapping, since the agent must refuse malformed configs (the model does not check)."""
    return ResourceClaimSpec(devices=DeviceClaim(
        requests=[DeviceRequest(name="channel", exactly=ExactDeviceRequest(deviceClassName=DEVICE_CLASS))],
        config=[DeviceClaimConfiguration(opaque=OpaqueDeviceConfiguration(
            driver=DRIVER, parameters=cast("dict[str, Any]", parameters)))]))


def compute_domain(client: Client, name: str, namespace: str = "default") -> ChannelConfig:
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace=namespace), spec={}))
    return ChannelConfig(compute_domain=ComputeDomainRef(name=name, namespace=namespace, uid=_uid(cd)))


def claim_meta(name: str, namespace: str, parameters: object, labels: dict[str, str] | None = None,
               owner: ComputeDomainRef | None = None) -> ObjectMeta:
    """A channel claim's metadata as the provider writes it: owned (a controller reference) by
    `owner`, else by the ComputeDomain its configuration names, when it names one (the agent
    prepares no other claim; an owner that does not exist has the garbage collector delete it)."""
    cd = owner.model_dump() if owner is not None else \
        parameters.get("computeDomain") if isinstance(parameters, dict) else None
    owners = [OwnerReference(apiVersion=cdapi.API_VERSION, kind=cdapi.KIND, name=str(cd.get("name")),
                             uid=str(cd.get("uid")), controller=True)] \
        if isinstance(cd, dict) and cd.get("name") and cd.get("uid") else None
    return ObjectMeta(name=name, namespace=namespace, labels=labels, ownerReferences=owners)


def scheduled_claim(client: Client, host: Host, name: str, parameters: object | None = None,
                    namespace: str = "default") -> Claim:
    """A ComputeDomain's shared claim allocated by the real scheduler for a pod on `host` (as the
    provider makes them); `parameters` replaces the opaque config (default: the CD's valid one)."""
    config = compute_domain(client, name, namespace)
    params = config.to_kube() if parameters is None else parameters
    claim = client.create(ResourceClaim(metadata=claim_meta(f"{name}-channel", namespace, params),
                                        spec=claim_spec(params)))
    client.create(Pod(metadata=ObjectMeta(name=f"{name}-0", namespace=namespace), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": host.node.name},
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{name}-channel")],
        containers=[Container(name="w", image="registry.invalid/w:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
    return Claim(namespace, f"{name}-channel", _uid(claim))


def allocated_claim(client: Client, host: Host, name: str, parameters: object, *, channel: int,
                    namespace: str = "default", labels: dict[str, str] | None = None,
                    owner: ComputeDomainRef | None = None) -> Claim:
    """A claim allocated without a pod: its status written as the scheduler would (admin only).
    Much faster than scheduling a pod per claim; the agent reads nothing else. `owner`: its
    ComputeDomain when `parameters` may not name it (a fuzzed configuration)."""
    claim = client.create(ResourceClaim(metadata=claim_meta(name, namespace, parameters, labels, owner),
                                        spec=claim_spec(parameters)))
    client.patch(ResourceClaim.Status, name, {"status": {"allocation": allocation(host, channel, parameters)}},
                 namespace=namespace, patch_type=PatchType.MERGE)
    return Claim(namespace, name, _uid(claim))


def allocation(host: Host, channel: int, parameters: object) -> dict[str, object]:
    """`status.allocation` of a claim given `channel` of the host's clique pool, with the claim's
    opaque config, as the scheduler writes it."""
    return {"devices": {
        "results": [{"request": "channel", "driver": DRIVER, "pool": names.pool_name(host.clique),
                     "device": names.channel_device(channel)}],
        "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": CLIQUE_LABEL, "operator": "In", "values": [host.clique]}]}]}}


def wait_allocated(client: Client, claims: Sequence[Claim], timeout: float = 120) -> None:
    for c in claims:
        def allocated(c: Claim = c) -> object:
            status = client.get(ResourceClaim, c.name, namespace=c.namespace).status
            return status.allocation if status else None

        eventually(f"claim {c.ref} to be allocated", allocated, timeout=timeout)


def delete_domain(client: Client, name: str, namespace: str = "default") -> None:
    """The domain's pod, claim and ComputeDomain (as scheduled_claim made them), those that exist."""
    with contextlib.suppress(ApiError):
        client.delete(Pod, f"{name}-0", namespace=namespace, grace_period=0)
    with contextlib.suppress(ApiError):
        client.delete(ResourceClaim, f"{name}-channel", namespace=namespace)
    with contextlib.suppress(ApiError):
        client.delete(ComputeDomainResource, name, namespace=namespace)


class AgentProcess:
    """`python -m nvlfabric agent` for `host`, started and killed like the kubelet's container runtime.

    The host's IMEX keeper (`python -m nvlfabric imex`, its own DaemonSet in a cluster) is started
    with the agent's first start and lives on when the agent is killed or stopped, as its pod would:
    `close()` ends both.
    """

    def __init__(self, host: Host, kubeconfig: Path, *, resync_seconds: float = 30.0,
                 in_cluster: tuple[str, Path] | None = None, health_port: int = 0, metrics_port: int = 0,
                 registration_timeout: float = 0.0) -> None:
        """`in_cluster`: (API server host:port, service-account dir with token and ca.crt): the agent
        configured as in its DaemonSet, instead of from `kubeconfig`. `registration_timeout`: the
        agent's --registration-timeout (0 here: tests often play the kubelet's part without
        registering the plugin)."""
        self.registration_timeout = registration_timeout
        self.host = host
        self.kubeconfig = kubeconfig
        self.resync_seconds = resync_seconds
        self.in_cluster = in_cluster
        self.ports = (health_port, metrics_port)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = host.node.dir / "agent.log"
        self.starts = 0
        self.keeper = KeeperProcess(host)

    def argv(self) -> list[str]:
        n = self.host.node
        creds = ["--kubeconfig", str(self.kubeconfig)] if self.in_cluster is None else \
            ["--service-account-dir", str(self.in_cluster[1])]
        return [sys.executable, "-m", "nvlfabric", "agent", *creds, "--node-name", n.name, "--node-ip", n.address,
                "--kubelet-root", str(n.kubelet_root),
                "--cdi-root", str(self.host.cdi_dir), "--driver-root", str(n.driver_root),
                "--proc-devices", str(n.proc_devices), "--boot-id", str(self.host.boot_id),
                "--resync-seconds", str(self.resync_seconds), "--log-format", "text",
                "--health-port", str(self.ports[0]), "--metrics-port", str(self.ports[1]),
                "--listen-address", "127.0.0.1", "--registration-timeout", str(self.registration_timeout)]

    def spawn(self) -> subprocess.Popen[bytes]:
        assert not self.alive, "the agent is already running"
        if not self.keeper.alive:
            self.keeper.start()
        env = {**os.environ, **hardware.node_env(self.host.state, self.host.node)}
        if self.in_cluster is not None:
            host, _, port = self.in_cluster[0].rpartition(":")
            env = {k: v for k, v in env.items() if k != "KUBECONFIG"}
            env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            self.proc = subprocess.Popen(self.argv(), cwd=self.host.state, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        return self.proc

    def start(self, timeout: float = 30.0) -> None:
        self.spawn()
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Until the registration socket answers GetInfo, as the kubelet's plugin watcher would see it."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                raise AssertionError(f"the agent exited with {self.returncode} while starting; log:\n{self.tail()}")
            if self.host.registration.exists() and self.host.endpoint.exists():
                try:
                    with grpc.insecure_channel(f"unix:{self.host.registration}") as ch:
                        pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                            pluginregistration_pb2.InfoRequest(), timeout=1)
                    return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the agent did not serve within {timeout} s; log:\n{self.tail()}")
            time.sleep(0.02)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node problem would; waits for the process to be gone."""
        _kill(self.proc)

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, as the kubelet stops a container; returns the exit status."""
        return _terminate(self.proc, timeout)

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)

    def close(self) -> None:
        """The agent and its keeper stopped (SIGTERM; the keeper stops its IMEX daemons)."""
        self.terminate()
        self.keeper.terminate()


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> int | None:
    """SIGTERM, then SIGKILL after `timeout` s; the exit status."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _tail(log: Path, lines: int) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class KeeperProcess:
    """`python -m nvlfabric imex` for `host` (which replaces itself with the keeper's program, as in
    the node image): the IMEX daemons' owner, apart from the agent."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = host.node.dir / "imex-keeper.log"

    @property
    def socket(self) -> Path:
        return self.host.imex_workdir / "keeper.sock"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 20.0) -> None:
        n = self.host.node
        env = {**os.environ, **nodeimage.image_env(), **hardware.node_env(self.host.state, n)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nvlfabric", "imex", "--kubelet-root", str(n.kubelet_root),
                 "--driver-root", str(n.driver_root), "--log-format", "text"],
                cwd=self.host.state, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if not self.alive or time.monotonic() > deadline:
                raise AssertionError(f"the IMEX keeper did not serve on {self.socket}; log:\n{self.tail()}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect(str(self.socket))
                s.sendall(b'{"op": "status"}\n')
                return s.recv(1).startswith(b"{")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node problem would; waits for the process to be gone."""
        _kill(self.proc)

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, as the kubelet stops a container; returns the exit status."""
        return _terminate(self.proc, timeout)

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)


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
