"""The nodes the real kubelet runs: each a machine of its own (a PID namespace whose first process
reaps orphans), in it a container runtime (nvlfabric's CRI stand-in, or containerd and runc
running images built for real: testbed/nodeimages.py) and the real kubelet
(nvlfabric/sim/realnode.py), then its GPUs in the Node's capacity.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvlfabric.sim import hardware, podnetwork, realnode
from nvlfabric.sim.containerdnode import PodNetworkBlock
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.kubelet import rootfs
from nvlfabric.sim.nodes import GPUS_PER_NODE
from nvlfabric.sim.paths import Tools
from nvlfabric.testbed import nodeimages
from nvlfabric.testbed.launcher import Launcher
from nvlfabric.testbed.runstate import ControlPlaneError

RUNTIMES = ("standin", "containerd")
CONTAINERD_TOOLS = ("containerd", "ctr", "containerd-shim-runc-v2", "runc")


def check(count: int, candidates: int, tools: Tools, *, runtime: str = "standin",
          pod_network: str = "namespaced") -> None:
    """Before anything starts: `count` nodes fit in the `candidates` that are not hollow, the kubelet
    binary (and containerd's tools) are built and there are loopback addresses for them."""
    if count > candidates:
        raise ControlPlaneError(f"--real-kubelets {count} is more than the "
                                f"{candidates} node(s) of --racks/--nodes-per-rack that are not hollow")
    if runtime not in RUNTIMES:
        raise ControlPlaneError(f"--runtime {runtime!r}: give one of {', '.join(RUNTIMES)}")
    tools.binary("kubelet")
    if runtime == "containerd":
        for name in CONTAINERD_TOOLS:
            tools.binary(name)
        if tools.cni_dir is None or not tools.cni_dir.is_dir():
            raise ControlPlaneError("--runtime containerd needs the CNI plugins: run `make tools`")
        if pod_network != "namespaced":
            raise ControlPlaneError("--runtime containerd puts its pods on the pod network: leave --pod-network "
                                    "namespaced (the default)")
    realnode.node_addresses(count)


@dataclass(frozen=True)
class NodeImages:
    node: nodeimages.BuiltImage
    workload: nodeimages.BuiltImage
    pause: nodeimages.BuiltImage


def build_images(progress: Callable[[str], None]) -> NodeImages:
    """What containerd nodes run, built (or found cached) before any of them starts."""
    try:
        return NodeImages(node=nodeimages.node_image(progress), workload=nodeimages.workload_image(progress),
                          pause=nodeimages.pause_image(progress))
    except nodeimages.ImageBuildError as exc:
        raise ControlPlaneError(str(exc)) from None


def _containerd(run: Launcher, tools: Tools, real: realnode.RealNode, images: NodeImages) -> realnode.Containerd:
    if run.state.pod_network is None or tools.cni_dir is None:
        raise ControlPlaneError("a containerd node needs the pod network and the CNI plugins")
    net = podnetwork.PodNetwork(run.state.pod_network)
    addresses = net.node_addresses(real.node.rack, real.node.index)
    return realnode.Containerd(
        containerd=tools.binary("containerd"), ctr=tools.binary("ctr"), runc=tools.binary("runc"),
        cni_bin=tools.cni_dir, images=[images.node.archive, images.workload.archive, images.pause.archive],
        pause_image=images.pause.reference, dns=net.gateway,
        network=PodNetworkBlock(bridge=net.bridge, subnet=str(net.subnet), gateway=net.gateway,
                                first=addresses[0], last=addresses[-1]))


def start(run: Launcher, tools: Tools, real: realnode.RealNode, *, shim: Path,
          images: dict[str, ImageProgram], gpus_by_dra: bool = False,
          containerd_images: NodeImages | None = None) -> None:
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
                            hardware_env=hardware.node_env(run.state_dir, real.node), pidns=f"/proc/{init}/ns/pid",
                            containerd=_containerd(run, tools, real, containerd_images) if containerd_images else None)
    run.launch(f"kubelet-{name}", [sys.executable, "-m", "nvlfabric.sim.kubelet.rootfs", str(spec)])
    run.wait(f"the real kubelet of {name} to register its Node (log: {real.kubelet_log})",
             lambda: admin.ok(f"/api/v1/nodes/{name}"))
    if not gpus_by_dra:
        admin.patch_node_status(name, realnode.gpu_capacity_patch(GPUS_PER_NODE))
