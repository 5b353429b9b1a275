"""The simulated GB200 racks: each node's driver root with the NVML and IMEX stand-ins, its identity
and host files, then one process of simulated kubelets for the nodes the real kubelet does not run,
and the wait until every node is Ready and schedulable.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from nvlfabric.sim import hardware, nodeimage
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.nodes import SimNode, runtime_root
from nvlfabric.testbed.launcher import Launcher


def prepare(state_dir: Path, nodes: list[SimNode], progress: Callable[[str], None]) -> dict[str, Path]:
    """Every node's directories afresh, and for each that is not hollow its driver root, identity and
    host files; the stand-ins built (by name), which real-kubelet nodes need too."""
    built = hardware.build_standins()
    nodeimage.build_keeper()  # the node image's IMEX keeper, which its `imex` containers run
    # Hollow nodes read no NVML (their stand-in agent knows its clique): the topology holds the
    # others, so what a real agent's NVML reads does not grow with the cluster.
    topo = hardware.write_topology(state_dir, [n for n in nodes if not n.hollow] or nodes)
    minors = {n.name: [g.minor for g in n.gpus] for n in topo.nodes}
    shutil.rmtree(runtime_root(state_dir), ignore_errors=True)
    for node in nodes:
        shutil.rmtree(node.dir, ignore_errors=True)
        node.prepare_dirs()
        if node.hollow:
            continue
        hardware.install_driver_root(node, built, topo.driver_version)
        hardware.write_node_identity(state_dir, node)
        for problem in hardware.install_host_files(node, minors[node.name], topo.driver_version):
            progress(f"{node.name}: not made: {problem}")  # once per node: no CAP_MKNOD here
    return built


def start_kubelets(run: Launcher, *, kubeconfig: Path, racks: int, nodes_per_rack: int, first_rack: int,
                   hollow_racks: int, images: dict[str, ImageProgram], exclude: Sequence[SimNode],
                   gpus_by_dra: bool = False) -> None:
    """One process of simulated kubelets (`python -m nvlfabric.sim.kubelet`) for every node but `exclude`."""
    pod_network = run.state.pod_network
    run.launch("sim-kubelet", [
        sys.executable, "-m", "nvlfabric.sim.kubelet", f"--state-dir={run.state_dir}",
        f"--kubeconfig={kubeconfig}",
        f"--racks={racks}", f"--nodes-per-rack={nodes_per_rack}", f"--first-rack={first_rack}",
        f"--hollow-racks={hollow_racks}",
        f"--images={json.dumps({k: v.model_dump() for k, v in images.items()})}",
        f"--pki-dir={run.state_dir / 'pki'}",
        *(f"--exclude={n.name}" for n in exclude),
        *([f"--pod-network={pod_network}"] if pod_network is not None else []),
        *(["--gpus-by-dra"] if gpus_by_dra else []),
    ])


def wait_ready(run: Launcher, names: set[str]) -> None:
    """Until every one of `names` is Ready and schedulable, saying how many are as that changes."""
    admin, last = run.admin, [-1]

    def all_ready() -> bool:
        ready = admin.ready_nodes() & names
        if len(ready) != last[0]:
            last[0] = len(ready)
            run.progress(f"{len(ready)}/{len(names)} nodes Ready")
        return ready == names

    run.wait(f"{len(names)} simulated nodes to be Ready and schedulable", all_ready)
