"""What each simulated node has instead of hardware: the NVML and IMEX stand-ins in its driver root.

A real GB200 node carries the NVIDIA driver under its driver root (`/run/nvidia/driver` with the
GPU operator): `usr/lib64/libnvidia-ml.so.1`, `usr/bin/nvidia-imex`, `usr/bin/nvidia-imex-ctl`,
`usr/bin/nvidia-smi`, `usr/lib64/libcuda.so.<driver version>` (and `libcuda.so.1`). The simulator
puts the stand-ins at the same places in each node's driver root, so the node agent (and other GPU
software) finds them exactly as it would on a real node. The node's host file system has what GPU
components probe there too (`install_host_files`): the character devices `/dev/nvidia<minor>` of
its GPUs (the minors NVML reports), `/dev/nvidiactl`, `/dev/nvidia-uvm`, the IMEX management
capability `/dev/nvidia-caps/nvidia-cap<minor>` and its `/proc/driver/nvidia/capabilities/
fabric-imex-mgmt`, and `/proc/driver/nvidia/version`, with the majors of the node's `/proc/devices`.
Which node a process "is" comes from the environment the simulated kubelet gives the processes it
runs on that node (see `node_env`), like a machine's identity comes from its hardware.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from nvlfabric.sim import nodes as simnodes
from nvlfabric.sim import paths
from nvlfabric.sim.nodes import NVIDIA_CAPS_MAJOR, SimNode
from nvlfabric.sim.nvml import faults, topology

#: Stand-in → the files its Makefile builds; the C sources ship inside the package (package data).
STANDINS = {"nvml": ["libnvidia-ml.so.1"], "imex": ["nvidia-imex", "nvidia-imex-ctl"],
             "gpu": ["nvidia-smi", "libcuda.so.1"], "shim": ["nvlfabric-shim"]}
SOURCES = Path(__file__).resolve().parent
DRIVER_ROOT_PATHS = {"libnvidia-ml.so.1": "usr/lib64", "nvidia-imex": "usr/bin", "nvidia-imex-ctl": "usr/bin",
                     "nvidia-smi": "usr/bin"}
NVIDIA_FRONTEND_MAJOR = 195  # /dev/nvidia<minor> and /dev/nvidiactl (minor 255), as the driver numbers them
NVIDIACTL_MINOR = 255
NVIDIA_UVM_MAJOR = 509
FABRIC_IMEX_MGMT_MINOR = 1
"""The minor of the IMEX management capability's device under nvidia-caps (ours to choose)."""


class StandinsMissing(RuntimeError):
    pass


def build_standins(build_dir: Path | None = None) -> dict[str, Path]:
    """Build (or confirm up to date) the C stand-ins (into `paths.build_dir()` unless told); returns file
    name → built path."""
    build_dir = build_dir or paths.build_dir()
    out: dict[str, Path] = {}
    for name, files in STANDINS.items():
        target, src = build_dir / name, SOURCES / name
        res = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(src), f"OUT={target}"],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise StandinsMissing(f"building the {name} stand-in failed (make -C {src}):\n{res.stderr[-2000:]}")
        out.update({f: target / f for f in files})
    return out


def topology_path(state_dir: Path) -> Path:
    return state_dir / "nvml" / "topology.conf"


def node_clique(node: SimNode) -> str:
    """The node's NVLink clique as NVML reports it: what a hollow node's stand-in agent labels it
    with (nodes.node_clique, also GPU Feature Discovery's label there)."""
    return simnodes.node_clique(node)


def write_topology(state_dir: Path, nodes: list[SimNode]) -> topology.Topology:
    """One NVML topology for the whole simulated cluster: each rack is one NVLink domain."""
    racks = sorted({n.rack for n in nodes})
    topo = topology.Topology(
        racks=tuple(simnodes.nvlink_rack(r) for r in racks),
        nodes=tuple(topology.Node(name=n.name, rack=topology.rack_name(n.rack),
                                  gpus=tuple(topology.gb200_gpu(n.name, i) for i in range(4))) for n in nodes),
    )
    path = topology_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    topo.write(path)
    return topo


def fault_path(state_dir: Path, node: str) -> Path:
    return faults.default_fault_path(topology_path(state_dir), node)


def _link(target: Path, to: Path | str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    target.symlink_to(to)


def install_driver_root(node: SimNode, built: dict[str, Path],
                        driver_version: str = topology.DEFAULT_DRIVER_VERSION) -> None:
    for name, rel in DRIVER_ROOT_PATHS.items():
        _link(node.driver_root / rel / name, built[name])
    # libcuda is named after the driver version (what nvmlSystemGetDriverVersion says), libcuda.so.1 beside it.
    lib64 = node.driver_root / "usr" / "lib64"
    _link(lib64 / f"libcuda.so.{driver_version}", built["libcuda.so.1"])
    _link(lib64 / "libcuda.so.1", f"libcuda.so.{driver_version}")


def install_host_files(node: SimNode, gpu_minors: list[int], driver_version: str = topology.DEFAULT_DRIVER_VERSION,
                       ) -> list[str]:
    """The node's GPU device files and /proc/driver/nvidia; what could not be made (a character
    device needs CAP_MKNOD), one line each."""
    dev, proc = node.host_dir("/dev"), node.host_dir("/proc/driver/nvidia")
    devices = [(f"nvidia{m}", NVIDIA_FRONTEND_MAJOR, m) for m in gpu_minors]
    devices += [("nvidiactl", NVIDIA_FRONTEND_MAJOR, NVIDIACTL_MINOR), ("nvidia-uvm", NVIDIA_UVM_MAJOR, 0),
                (f"nvidia-caps/nvidia-cap{FABRIC_IMEX_MGMT_MINOR}", NVIDIA_CAPS_MAJOR, FABRIC_IMEX_MGMT_MINOR)]
    missing = []
    for rel, major, minor in devices:
        path = dev / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        except PermissionError as exc:
            missing.append(f"/dev/{rel}: {exc.strerror}")
    caps = proc / "capabilities"
    caps.mkdir(parents=True, exist_ok=True)
    (caps / "fabric-imex-mgmt").write_text(
        f"DeviceFileMinor: {FABRIC_IMEX_MGMT_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {driver_version}  Release Build  (nvlfabric-sim)\n"
        "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")
    return missing


def node_env(state_dir: Path, node: SimNode) -> dict[str, str]:
    """The hardware identity of a node, for processes the simulated kubelet runs there."""
    return {
        "NVLFABRIC_NVML_TOPOLOGY": str(topology_path(state_dir)),
        "NVLFABRIC_NVML_NODE": node.name,
        "NVLFABRIC_NVML_FAULTS": str(fault_path(state_dir, node.name)),
    }


NODE_FILE = "nvlfabric-node.conf"
"""Beside the NVML stand-in in a node's driver root: the node's identity, which the stand-in reads
when its environment does not say (a process started with `env -i`, as a real driver's tools are)."""


def write_node_identity(state_dir: Path, node: SimNode) -> Path:
    """The node's own file saying which node it is (what `node_env` says, for a clean environment)."""
    env = node_env(state_dir, node)
    path = node.driver_root / DRIVER_ROOT_PATHS["libnvidia-ml.so.1"] / NODE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {node.name}: written by nvlfabric-sim\ntopology={env['NVLFABRIC_NVML_TOPOLOGY']}\n"
                    f"node={node.name}\nfaults={env['NVLFABRIC_NVML_FAULTS']}\n")
    return path
