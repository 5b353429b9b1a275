"""The nodes the real kubelet runs: each a machine of its own (a PID namespace whose first process
reaps orphans), in it nvlfabric's CRI stand-in and the real kubelet (nvlfabric/sim/realnode.py),
then its GPUs in the Node's capacity.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from nvlfabric.sim import hardware, realnode
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.kubelet import rootfs
from nvlfabric.sim.nodes import GPUS_PER_NODE
from nvlfabric.sim.paths import Tools
from nvlfabric.testbed.launcher import Launcher
from nvlfabric.testbed.runstate import ControlPlaneError


def check(count: int, candidates: int, tools: Tools) -> None:
    """Before anything starts: `count` nodes fit in the `candidates` that are not hollow, the kubelet
    binary is built and there are loopback addresses for them."""
    if count > candidates:
        raise ControlPlaneError(f"--real-kubelets {count} is more than the "
                                f"{candidates} node(s) of --racks/--nodes-per-rack that are not hollow")
    tools.binary("kubelet")
    realnode.node_addresses(count)


def start(run: Launcher, tools: Tools, real: realnode.RealNode, *, shim: Path,
          images: dict[str, ImageProgram], gpus_by_dra: bool = False) -> None:
    """The node's machine, then the node itself in it; returns once its Node is registered (and,
    unless its GPUs are DRA devices, advertises them as a device plugin would)."""
    name = real.node.name
    machine = run.launch(f"machine-{name}", [
        shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child", str(shim), "--pause"])
    init = rootfs.namespace_init(machine.pid)
    if init is None:
        raise ControlPlaneError(f"node {name}: its PID namespace did not start (unshare --pid): a real-kubelet "
                                "node needs root (CAP_SYS_ADMIN) for its PID and mount namespaces")
    real.node.machine_pid_file.write_text(f"{init}\n")
    admin = run.admin
    spec = realnode.prepare(real, pki_dir=run.state_dir / "pki", kubelet=tools.binary("kubelet"), shim=shim,
                            server=admin.server, images=images, labels=realnode.labels(real.node),
                            hardware_env=hardware.node_env(run.state_dir, real.node), pidns=f"/proc/{init}/ns/pid")
    run.launch(f"kubelet-{name}", [sys.executable, "-m", "nvlfabric.sim.kubelet.rootfs", str(spec)])
    run.wait(f"the real kubelet of {name} to register its Node (log: {real.kubelet_log})",
             lambda: admin.ok(f"/api/v1/nodes/{name}"))
    if not gpus_by_dra:
        admin.patch_node_status(name, realnode.gpu_capacity_patch(GPUS_PER_NODE))
