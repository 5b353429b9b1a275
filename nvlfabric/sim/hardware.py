"""What each simulated node has instead of hardware: the NVML and IMEX stand-ins in its driver root.

A real GB200 node carries the NVIDIA driver under its driver root (`/run/nvidia/driver` with the
GPU operator): `usr/lib64/libnvidia-ml.so.1`, `usr/bin/nvidia-imex`, `usr/bin/nvidia-imex-ctl`. The
simulator puts the stand-ins at the same places in each node's driver root, so the node agent finds
them exactly as it would on a real node. Which node a process "is" comes from the environment the
simulated kubelet gives the processes it runs on that node (see `node_env`), like a machine's
identity comes from its hardware.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from nvlfabric.sim import paths
from nvlfabric.sim.nodes import SimNode
from nvlfabric.sim.nvml import faults, topology

#: Stand-in → the files its Makefile builds; the C sources ship inside the package (package data).
STANDINS = {"nvml": ["libnvidia-ml.so.1"], "imex": ["nvidia-imex", "nvidia-imex-ctl"]}
SOURCES = Path(__file__).resolve().parent
DRIVER_ROOT_PATHS = {"libnvidia-ml.so.1": "usr/lib64", "nvidia-imex": "usr/bin", "nvidia-imex-ctl": "usr/bin"}


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


def write_topology(state_dir: Path, nodes: list[SimNode]) -> topology.Topology:
    """One NVML topology for the whole simulated cluster: each rack is one NVLink domain."""
    racks = sorted({n.rack for n in nodes})
    topo = topology.Topology(
        racks=tuple(topology.Rack(name=topology.rack_name(r), cluster_uuid=topology.cluster_uuid_for(
            topology.rack_name(r))) for r in racks),
        nodes=tuple(topology.Node(name=n.name, rack=topology.rack_name(n.rack),
                                  gpus=tuple(topology.gb200_gpu(n.name, i) for i in range(4))) for n in nodes),
    )
    path = topology_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    topo.write(path)
    return topo


def fault_path(state_dir: Path, node: str) -> Path:
    return faults.default_fault_path(topology_path(state_dir), node)


def install_driver_root(node: SimNode, built: dict[str, Path]) -> None:
    for name, rel in DRIVER_ROOT_PATHS.items():
        target = node.driver_root / rel / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(built[name])


def node_env(state_dir: Path, node: SimNode) -> dict[str, str]:
    """The hardware identity of a node, for processes the simulated kubelet runs there."""
    return {
        "NVLFABRIC_NVML_TOPOLOGY": str(topology_path(state_dir)),
        "NVLFABRIC_NVML_NODE": node.name,
        "NVLFABRIC_NVML_FAULTS": str(fault_path(state_dir, node.name)),
    }
