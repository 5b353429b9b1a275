"""What each simulated node has instead of hardware: the NVML and IMEX stand-ins in its driver root.

A real GB200 node carries the NVIDIA driver under its driver root (`/run/nvidia/driver` with the
GPU operator): `usr/lib64/libnvidia-ml.so.1`, `usr/bin/nvidia-imex`, `usr/bin/nvidia-imex-ctl`,
`usr/bin/nvidia-smi`, `usr/lib64/libcuda.so.<driver version>` (and `libcuda.so.1`). The simulator
puts the stand-ins at the same places in each node's driver root, so the node agent (and other GPU
software) finds them exactly as it would on a real node. The node's host file system has what GPU
components probe there too (`install_host_files`): the character devices `/dev/nvidia<minor>` of
its GPUs (the minors NVML reports), `/dev/nvidiactl`, `/dev/nvidia-uvm`, the IMEX management
capability `/dev/nvidia-caps/nvidia-cap<minor>` and its `/proc/driver/nvidia/capabilities/
fabric-imex-mgmt`, and `/proc/driver/nvidia/version`, with the majors of the node's
`/proc/devices` (the device nodes also in the driver root's `dev/`). The driver root is laid out
as a real driver's: regular files, the libraries named after the driver version with `.so.1`
links to them.
Which node a process "is" comes from the environment the simulated kubelet gives the processes it
runs on that node (see `node_env`), or else from the node's own file beside its NVML library
(`write_node_identity`), like a machine's identity comes from its hardware.
"""

from __future__ import annotations

import os
import shutil
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
                                  gpus=tuple(topology.gb200_gpu(n.name, i) for i in range(topology.GPUS_PER_NODE)))
                    for n in nodes),
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


def _place(target: Path, built: Path) -> None:
    """`built` at `target` as a regular file, as a driver's files are (software that looks for
    them with `find -type f`, or resolves a library's real name, sees what it sees on a node): a
    hard link, which costs nothing per node; a copy where the two are on different file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    try:
        os.link(built, target)
    except OSError:
        shutil.copy2(built, target)


VERSIONED_LIBRARIES = ("libnvidia-ml.so", "libcuda.so")
"""Libraries a driver ships as `<name>.<driver version>` with `<name>.1` and `<name>` linking to it."""


def install_driver_root(node: SimNode, built: dict[str, Path],
                        driver_version: str = topology.DEFAULT_DRIVER_VERSION) -> None:
    """The stand-ins at their paths in the node's driver root, laid out as a real driver's: regular
    files; `libcuda.so.<driver version>` and `libnvidia-ml.so.<driver version>` the libraries
    themselves (what nvmlSystemGetDriverVersion says), `.so.1` and `.so` symbolic links to them."""
    lib64 = node.driver_root / "usr" / "lib64"
    for name, rel in DRIVER_ROOT_PATHS.items():
        if rel != "usr/lib64":
            _place(node.driver_root / rel / name, built[name])
    for lib in VERSIONED_LIBRARIES:
        _place(lib64 / f"{lib}.{driver_version}", built[f"{lib}.1"])
        _link(lib64 / f"{lib}.1", f"{lib}.{driver_version}")
        _link(lib64 / lib, f"{lib}.1")


def install_host_files(node: SimNode, gpu_minors: list[int], driver_version: str = topology.DEFAULT_DRIVER_VERSION,
                       ) -> list[str]:
    """The node's GPU device files and /proc/driver/nvidia; what could not be made (a character
    device needs CAP_MKNOD), one line each."""
    dev, proc = node.host_dir("/dev"), node.host_dir("/proc/driver/nvidia")
    devices = [(f"nvidia{m}", NVIDIA_FRONTEND_MAJOR, m) for m in gpu_minors]
    devices += [("nvidiactl", NVIDIA_FRONTEND_MAJOR, NVIDIACTL_MINOR), ("nvidia-uvm", NVIDIA_UVM_MAJOR, 0),
                (f"nvidia-caps/nvidia-cap{FABRIC_IMEX_MGMT_MINOR}", NVIDIA_CAPS_MAJOR, FABRIC_IMEX_MGMT_MINOR)]
    missing = []
    # In the node's /dev and in the driver root's dev/, as a driver container's root has them
    # (software that looks under the driver root finds its device nodes there).
    for where, base in ((dev, "/dev"), (node.driver_root / "dev", f"{node.driver_root}/dev")):
        for rel, major, minor in devices:
            path = where / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()
            try:
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            except PermissionError as exc:
                missing.append(f"{base}/{rel}: {exc.strerror}")
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


#: Where a node whose containers have their own root (a containerd node) sees the simulator's NVML
#: files: bound from the state directory's nvml/ under its driver root (`/run/nvidia/driver` on
#: the node, hostPath-mounted, recursively, into the containers that read NVML).
NVML_FILES_IN_DRIVER_ROOT = "var/lib/nvlfabric-sim/nvml"


def write_node_identity(state_dir: Path, node: SimNode, *, seen_under: Path | None = None) -> Path:
    """The node's own file saying which node it is (what `node_env` says, for a clean environment).
    With `seen_under` (the driver root's path on the node), the files it names are given as the
    node's containers see them there (NVML_FILES_IN_DRIVER_ROOT), not as paths of this machine."""
    env = node_env(state_dir, node)
    if seen_under is not None:
        nvml_dir = topology_path(state_dir).parent
        (node.driver_root / NVML_FILES_IN_DRIVER_ROOT).mkdir(parents=True, exist_ok=True)
        env = {k: str(seen_under / NVML_FILES_IN_DRIVER_ROOT / Path(v).relative_to(nvml_dir))
               if k != "NVLFABRIC_NVML_NODE" else v for k, v in env.items()}
    path = node.driver_root / DRIVER_ROOT_PATHS["libnvidia-ml.so.1"] / NODE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {node.name}: written by nvlfabric-sim\ntopology={env['NVLFABRIC_NVML_TOPOLOGY']}\n"
                    f"node={node.name}\nfaults={env['NVLFABRIC_NVML_FAULTS']}\n")
    return path
