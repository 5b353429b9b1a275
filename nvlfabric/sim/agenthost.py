"""One simulated node for a single node agent, as the crash and fuzz tests and bench/nodeagent.py
drive it: the host's layout (kubelet, CDI, driver-root and IMEX paths), its making (stand-ins, a
topology with a clique of its own, a boot id) and removal, its Node object, and its IMEX daemons.

A host is one simulated GB200 node with its own NVML topology (a random cluster UUID, so its clique
is unique in a shared cluster), the NVML/IMEX stand-ins in its driver root, a boot id file, and its
Node object in the API server. Its neighbours: the agent and keeper processes on it
(agentprocess.py), the claims they prepare (channelclaims.py) and the kubelet's gRPC client of the
agent's DRA socket (draclient.py).

It lives in the simulator room because it stands in for the node and the kubelet around one agent
(benchmarks import no test helpers). Like the rest of the simulator it knows the agent only by its
command line and the contract (`nvlfabric.api.names`: paths, CDI and pool names), never by
importing the node agent or the controller. The clique's channel pool is the controller's part:
callers publish it with `nvlfabric.controller.pools.apply(client, host.clique, channels=N)` after
`register`, and withdraw it with `pools.withdraw` after `unregister`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.resource_v1 import DeviceClass

from nvlfabric.api import names
from nvlfabric.api.names import CLIQUE_LABEL, DEVICE_CLASS, DRIVER
from nvlfabric.sim import hardware, nodeimage
from nvlfabric.sim.cluster import delete_nodes, install_crd, make_ready_nodes
from nvlfabric.sim.nodes import SimNode, rack_nodes
from nvlfabric.sim.nvml import topology


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
    for port in (names.IMEX_SERVER_PORT, names.IMEX_CMD_PORT):
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
