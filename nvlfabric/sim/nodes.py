"""Simulated GB200 NVL72 nodes: names, loopback addresses and each node's own directories.

A rack is 18 nodes (compute trays) of 4 GPUs each, joined by one NVLink domain. Every simulated node
gets a distinct loopback address (127.10.<rack>.<index+1>, all on `lo`, no set-up needed) and a
directory standing in for its host file system:

    <state>/nodes/<name>/
        kubelet -> /tmp/nvlk-<hash>/<name>/kubelet
                                     the kubelet root (/var/lib/kubelet): plugins_registry/, plugins/
                                     (kept under a short path: unix sockets hold 107 bytes)
        cdi/etc/, cdi/run/           CDI spec dirs (/etc/cdi, /var/run/cdi)
        driver-root/                 the NVIDIA driver root (/run/nvidia/driver); device nodes land here
        proc-devices                 this node's /proc/devices (with the IMEX channel major)
        containers/                  what each started container got (env, device nodes, mounts)
        pods/<uid>/                  per-pod files (projected service-account token, logs)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Final

from pydantic import BaseModel

from nvlfabric.api import names
from nvlfabric.sim.nvml import topology

NODES_PER_RACK = names.NODES_PER_CLIQUE
GPUS_PER_NODE = names.GPUS_PER_NODE
# A dynamic major, as the driver registers it; what matters is that agents read it from the file.
IMEX_CHANNELS_MAJOR = 507
NVIDIA_CAPS_MAJOR = 508


class SimNode(BaseModel):
    name: str
    rack: int
    index: int
    address: str
    dir: Path
    runtime_dir: Path
    """Where this node's kubelet root really is: a short path, because unix socket paths hold 107
    bytes and the kubelet root carries the plugin sockets (`dir/kubelet` links to it)."""
    hollow: bool = False
    """A hollow node (nvlfabric/sim/kubelet/hollow.py): its DaemonSets' pods, nvlfabric's agent and
    keeper among them, run nothing; an in-process stand-in writes what the agent would."""

    @property
    def kubelet_root(self) -> Path:
        return self.runtime_dir / "kubelet"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def cdi_dirs(self) -> list[Path]:
        """In the runtime's priority order: later directories win."""
        return [self.dir / "cdi" / "etc", self.dir / "cdi" / "run"]

    @property
    def driver_root(self) -> Path:
        return self.dir / "driver-root"

    @property
    def proc_devices(self) -> Path:
        return self.dir / "proc-devices"

    @property
    def containers_dir(self) -> Path:
        return self.dir / "containers"

    @property
    def control_file(self) -> Path:
        """Faults for the simulated kubelet of this node (see nvlfabric/sim/faults.py)."""
        return self.dir / "sim-control.json"

    def is_down(self) -> bool:
        try:
            return bool(json.loads(self.control_file.read_text()).get("down", False))
        except (FileNotFoundError, ValueError):
            return False

    @property
    def real_kubelet_dir(self) -> Path:
        """A real-kubelet node's own files (nvlfabric/sim/realnode.py): its kubelet's config,
        certificates and log, the CRI stand-in's containers under runtime/<container id>/."""
        return self.dir / "real-kubelet"

    def pod_dir(self, uid: str) -> Path:
        return self.dir / "pods" / uid

    def host_dir(self, path: str) -> Path:
        """Where a host path that is not one of `host_paths` is on this node (private to it)."""
        return self.dir / "host" / path.lstrip("/")

    @property
    def machine_pid_file(self) -> Path:
        """The host pid of the first process of the node's PID namespace (the simulated kubelet's)."""
        return self.dir / "machine.pid"

    def _namespace(self) -> tuple[os.stat_result, int] | None:
        """The node's PID namespace (its identity) and its level (0: the machine's own)."""
        try:
            init = int(self.machine_pid_file.read_text())
            return os.stat(f"/proc/{init}/ns/pid"), len(_nspid(init)) - 1
        except (OSError, ValueError, StopIteration):
            return None

    def runs(self, pid: int) -> bool:
        """Whether process `pid` (a host pid) runs on this node: in the node's PID namespace, or in
        one inside it (a container's own, a pod's)."""
        node = self._namespace()
        return node is not None and in_pid_namespace(pid, node[0])

    def host_pid(self, pid: int) -> int | None:
        """The host pid of process `pid` as this node's PID namespace numbers it (what a pid
        file written on a real-kubelet node holds), or None when no such process runs."""
        node = self._namespace()
        if node is None:
            return None
        ns, level = node
        with os.scandir("/proc") as entries:
            for entry in entries:
                if not entry.name.isdigit():
                    continue
                try:
                    nspid = _nspid(int(entry.name))
                    if len(nspid) > level and nspid[level] == pid and in_pid_namespace(int(entry.name), ns):
                        return int(entry.name)
                except (OSError, StopIteration, ValueError):
                    continue
        return None

    def host_view(self, path: str) -> Path:
        """Where a path of this node's host file system really is: under its directory for a host
        path of `host_paths`, else the path itself (a directory of the simulator's own)."""
        paths = self.host_paths()
        match = next((hp for hp in sorted(paths, key=len, reverse=True) if path == hp or path.startswith(hp + "/")),
                     None)
        return Path(path) if match is None else paths[match] / path[len(match):].lstrip("/")

    def host_paths(self) -> dict[str, Path]:
        """Host path → this node's directory, for hostPath volumes of pods placed here."""
        return {
            "/var/lib/kubelet": self.kubelet_root,
            "/etc/cdi": self.cdi_dirs[0],
            "/var/run/cdi": self.cdi_dirs[1],
            "/run/cdi": self.cdi_dirs[1],
            "/run/nvidia/driver": self.driver_root,
            "/proc/devices": self.proc_devices,
        }

    def prepare_dirs(self) -> None:
        for d in (self.registry_dir, self.kubelet_root / "plugins", *self.cdi_dirs, self.driver_root / "dev",
                  self.containers_dir):
            d.mkdir(parents=True, exist_ok=True)
        link = self.dir / "kubelet"
        if not link.is_symlink():
            link.symlink_to(self.kubelet_root)
        self.proc_devices.write_text(proc_devices_text())


def nvlink_rack(rack: int) -> topology.Rack:
    """Rack number `rack` as the NVML topology has it: one NVLink domain, its own cluster UUID."""
    name = topology.rack_name(rack)
    return topology.Rack(name=name, cluster_uuid=topology.cluster_uuid_for(name))


def node_clique(n: SimNode) -> str:
    """The node's NVLink clique as NVML reports it (`<cluster uuid>.<clique id>`)."""
    rack = nvlink_rack(n.rack)
    return f"{rack.cluster_uuid}.{rack.clique_id}"


GFD_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4",
              "nvidia.com/gpu.product": "NVIDIA-GB200", "nvidia.com/gpu.family": "blackwell"}
"""What NVIDIA's GPU Feature Discovery (or the GPU operator) labels a GB200 compute tray with:
other drivers select GPU nodes by them (NVIDIA's DRA driver's chart: `nvidia.com/gpu.present`)."""


def node_labels(n: SimNode) -> dict[str, str]:
    """The labels a simulated GB200 compute tray registers with, whichever kubelet runs it: the
    kubelet's own, and GPU Feature Discovery's, which include `nvidia.com/gpu.clique` from NVML (all
    four GPUs of a healthy tray agree: GFD writes it then; written here at registration, where GFD
    would follow a fabric fault within its minute)."""
    return {
        "kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64",
        "node.kubernetes.io/instance-type": "gb200-nvl72-compute-tray",
        names.RACK_LABEL: topology.rack_name(n.rack), "nvlfabric.io/simulated": "true",
        **GFD_LABELS, "nvidia.com/gpu.clique": node_clique(n),
    }


def node_name(rack: int, index: int) -> str:
    """Kubernetes node name; the same name identifies the node in the NVML topology."""
    return topology.node_name(topology.rack_name(rack), index)


def runtime_root(state_dir: Path) -> Path:
    """A short directory of this simulator's own for unix sockets, whatever the state dir's length."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"nvlk-{digest}"


def rack_nodes(state_dir: Path, racks: int, nodes_per_rack: int = NODES_PER_RACK, *,
               first_rack: int = 0, hollow_racks: int = 0) -> list[SimNode]:
    """The nodes of `racks` racks from `first_rack` on; the last `hollow_racks` of them hollow."""
    if not 1 <= racks <= 200 or not 0 <= first_rack <= 255 - racks:
        raise ValueError(f"--racks must be between 1 and 200 (racks numbered up to 255), got {racks}")
    if not 0 <= hollow_racks <= racks:
        raise ValueError(f"--hollow-racks must be between 0 and --racks ({racks}), got {hollow_racks}")
    if not 1 <= nodes_per_rack <= NODES_PER_RACK:
        raise ValueError(f"--nodes-per-rack must be between 1 and {NODES_PER_RACK} (an NVL72 rack), "
                         f"got {nodes_per_rack}")
    return [
        SimNode(name=node_name(r, i), rack=r, index=i, address=f"127.10.{r}.{i + 1}",
                dir=state_dir / "nodes" / node_name(r, i), runtime_dir=runtime_root(state_dir) / node_name(r, i),
                hollow=r >= first_rack + racks - hollow_racks)
        for r in range(first_rack, first_rack + racks) for i in range(nodes_per_rack)
    ]


def proc_devices_text() -> str:
    """A /proc/devices as a GB200 node with the NVIDIA driver loaded shows it."""
    return (
        "Character devices:\n"
        "  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n  5 /dev/console\n 10 misc\n"
        "195 nvidia-frontend\n"
        f"{IMEX_CHANNELS_MAJOR} {names.IMEX_CHANNEL_DEVICE}\n"
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps\n"
        "509 nvidia-uvm\n"
        "\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
    )


NS_GET_PARENT: Final = 0xB702
"""ioctl on a namespace's file: the namespace it is in (_IO(0xb7, 0x2), linux/nsfs.h)."""


def _nspid(pid: int) -> list[int]:
    """Process `pid`'s pids, from the machine's PID namespace inwards (its status's NSpid)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return [int(p) for p in next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))]


def in_pid_namespace(pid: int, ns: os.stat_result) -> bool:
    """Whether process `pid`'s PID namespace is `ns` or one inside it (walked up with NS_GET_PARENT)."""
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return False
    try:
        while True:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino):
                return True
            try:
                parent = fcntl.ioctl(fd, NS_GET_PARENT)
            except OSError:  # the machine's own namespace (or one we may not see beyond)
                return False
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
