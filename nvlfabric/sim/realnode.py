"""Simulated nodes run by the real kubelet (`nvlfabric-sim up --real-kubelets N`).

The hardware is simulated as on every node (NVML stand-in, IMEX stand-ins, the node's GPU
files); the kubelet is the real one, built from the pinned Kubernetes module (tools/build.py),
and the container runtime is ours (nvlfabric/sim/cri), speaking CRI. Each such node is a machine
of its own:

- a PID namespace, whose first process (`nvlfabric-shim --pause`) reaps orphans;
- a mount namespace whose root is the host's file system, with the node's own directories at
  the paths a GB200 node has them: /var/lib/kubelet (the kubelet's root, DRA and device-plugin
  sockets included), /etc/cdi and /var/run/cdi, /run/nvidia/driver, /proc/devices, the GPU
  device nodes in /dev, and files standing in for the six kernel tunables the kubelet's
  container manager writes (`vm/overcommit_memory`, `kernel/panic`, ...): the host's sysctls and
  /var/lib/kubelet are never touched;
- the machine's non-loopback address as the node IP (the kubelet refuses loopback ones), so each
  real-kubelet node needs an address of its own: pods there listen on it (the agent's health
  and metrics ports), and two nodes on one address would collide.

The runtime is nvlfabric's CRI stand-in, or with `--runtime containerd` containerd and runc
(sim/containerdnode.py), which run the images built for real (testbed/nodeimages.py) with the
node's pods on the simulator's pod network (CNI) and its cluster DNS (`clusterDNS`). Such a
node's containers have roots of their own, so what its NVML stand-in reads (the topology and the
node's fault file) is bound into its driver root (hardware.NVML_FILES_IN_DRIVER_ROOT) and its
identity file names them there.

The kubelet authenticates as `system:node:<name>` with a certificate of the cluster CA (Node
authorization and NodeRestriction apply to it, as on a cluster), serves its API with one the API
server trusts, and runs from an empty scratch directory. Its node advertises the 4 GPUs as
`nvidia.com/gpu` by a status patch, what NVIDIA's device plugin would do there.
"""

from __future__ import annotations

import base64
import fcntl
import ipaddress
import json
import os
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nvlfabric.api import names
from nvlfabric.sim import containerdnode, hardware, pki
from nvlfabric.sim.cri.machine import ContainerdSettings, MachineSettings
from nvlfabric.sim.cri.runtime import RuntimeSettings
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.nodes import SimNode, node_labels

#: What the kubelet's container manager sets when protectKernelDefaults is false (each is a
#: /proc/sys path): written into files of the node's, bound over these paths in its machine.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
#: The kubelet's OOM watcher reads the kernel log: /dev/kmsg (char 1:11) in the machine's /dev.
KMSG = {"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11, "fileMode": 0o644}
REAL_KUBELET_LABEL = "nvlfabric.io/kubelet"
SIOCGIFADDR = 0x8915
DRIVER_ROOT = Path("/run/nvidia/driver")
CLUSTER_DOMAIN = "cluster.local"


class RealKubeletError(ValueError):
    """A real-kubelet node cannot be set up here; the message says why and what to do."""


def machine_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses, one per interface, in interface order (read
    with the SIOCGIFADDR ioctl: no iproute2 needed)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                ifreq = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            address = ipaddress.ip_address(ifreq[20:24])
            if not (address.is_loopback or address.is_link_local):
                found.append(str(address))
    return found


def node_addresses(count: int) -> list[str]:
    found = machine_addresses()
    if len(found) < count:
        raise RealKubeletError(
            f"--real-kubelets {count} needs {count} non-loopback IPv4 address(es) on this machine, one per node "
            f"(the kubelet refuses a loopback node IP, and pods of two nodes on one address would share ports); "
            f"found {len(found)}: {', '.join(found) or 'none'}. Use --real-kubelets {len(found)} or fewer")
    return found[:count]


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class RealNode:
    node: SimNode
    address: str

    @property
    def dir(self) -> Path:
        return self.node.real_kubelet_dir

    @property
    def cri_socket(self) -> Path:
        return self.node.runtime_dir / "cri.sock"

    @property
    def machine_spec(self) -> Path:
        return self.dir / "machine.json"

    @property
    def kubelet_log(self) -> Path:
        return self.dir / "kubelet.log"

    @property
    def containerd(self) -> containerdnode.ContainerdDirs:
        return containerdnode.ContainerdDirs(self.dir / "containerd")


@dataclass(frozen=True)
class Containerd:
    """What a containerd node runs: the tools by path, the image archives, its pod network."""

    containerd: Path
    ctr: Path
    runc: Path
    cni_bin: Path
    images: list[Path]
    pause_image: str
    network: containerdnode.PodNetworkBlock
    dns: str
    """The cluster DNS's address (sim/clusterdns.py, at the pod network's gateway)."""

    @property
    def bin_dir(self) -> Path:
        """Where containerd finds containerd-shim-runc-v2 (beside itself)."""
        return self.containerd.parent


def kubelet_config(real: RealNode, pki_dir: Path, serving: tuple[Path, Path],
                   containerd: Containerd | None = None) -> dict[str, Any]:
    """The KubeletConfiguration: what this host needs (cgroup v1 allowed, no QoS cgroups, no swap
    check, the kernel tunables left to their stand-in files) and ports of its own; on a containerd
    node, containerd's socket and the cluster DNS (the stand-in writes pods' resolv.conf itself)."""
    endpoint = f"unix://{real.containerd.socket if containerd else real.cri_socket}"
    dns = {"clusterDNS": [containerd.dns], "clusterDomain": CLUSTER_DOMAIN} if containerd else {}
    return {**dns,
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
        "address": real.address, "port": free_port(real.address), "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": free_port("127.0.0.1"),
        "tlsCertFile": str(serving[0]), "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {"x509": {"clientCAFile": str(pki_dir / "ca.crt")}, "webhook": {"enabled": False},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False, "protectKernelDefaults": False,
        "podLogsDir": str(real.dir / "pod-logs"), "volumePluginDir": str(real.dir / "volume-plugins"),
        "containerLogMaxSize": "1Gi",
        "serializeImagePulls": False, "registerNode": True, "rotateCertificates": False,
        # The simulator's disk is shared by many nodes: pressure there is not this node's.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "10s", "syncFrequency": "10s",
    }


def kubeconfig(server: str, ca: Path, client: tuple[Path, Path], node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": node,
        "clusters": [{"name": "nvlfabric-sim", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": f"system:node:{node}", "user": {
            "client-certificate": str(client[0]), "client-key": str(client[1])}}],
        "contexts": [{"name": node, "context": {"cluster": "nvlfabric-sim", "user": f"system:node:{node}"}}],
    }


def _gpu_devices(node: SimNode) -> list[dict[str, Any]]:
    """The node's GPU device nodes (made by hardware.install_host_files) for its machine's /dev."""
    dev = node.host_dir("/dev")
    out = []
    for path in sorted(p for p in dev.rglob("*") if p.is_char_device()):
        rdev = path.stat().st_rdev
        out.append({"path": "/dev/" + str(path.relative_to(dev)), "type": "c", "major": os.major(rdev),
                    "minor": os.minor(rdev), "fileMode": 0o666})
    return out


def prepare(real: RealNode, *, pki_dir: Path, kubelet: Path, shim: Path, server: str, images: dict[str, ImageProgram],
            hardware_env: dict[str, str], labels: dict[str, str], pidns: str,
            containerd: Containerd | None = None) -> Path:
    """Write everything the node's machine needs; returns the machine's spec (for rootfs.py)."""
    node = real.node
    real.dir.mkdir(parents=True, exist_ok=True)
    serving = pki.node_serving(pki_dir, node.name, real.address, real.dir / "pki")
    client = pki.node_client(pki_dir, node.name, real.dir / "pki")
    (real.dir / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(server, pki_dir / "ca.crt", client, node.name)))
    (real.dir / "kubelet-config.yaml").write_text(yaml.safe_dump(kubelet_config(real, pki_dir, serving, containerd)))
    mounts = [
        {"source": str(node.kubelet_root), "target": "/var/lib/kubelet"},
        {"source": str(node.cdi_dirs[0]), "target": "/etc/cdi"},
        {"source": str(node.cdi_dirs[1]), "target": "/var/run/cdi"},
        {"source": str(node.driver_root), "target": str(DRIVER_ROOT)},
        {"source": str(node.proc_devices), "target": "/proc/devices"},
    ]
    if containerd is not None:
        # The NVML stand-in's files, where the node's containers see them (its identity file says so).
        nvml_dir = Path(hardware_env["NVLFABRIC_NVML_TOPOLOGY"]).parent
        hardware.write_node_identity(nvml_dir.parent, node, seen_under=DRIVER_ROOT)
        mounts.append({"source": str(nvml_dir), "target": str(DRIVER_ROOT / hardware.NVML_FILES_IN_DRIVER_ROOT)})
        containerdnode.write(real.containerd, runc=containerd.runc, cni_bin=containerd.cni_bin,
                             pause_image=containerd.pause_image, block=containerd.network)
    tunables = real.dir / "sysctl"
    for name in KERNEL_TUNABLES:
        stand_in = tunables / name.replace("/", ".")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        try:
            stand_in.write_text(Path("/proc/sys", name).read_text())
        except OSError:
            continue  # not on this kernel: the kubelet will not find it either
        mounts.append({"source": str(stand_in), "target": f"/proc/sys/{name}"})
    api = server.removeprefix("https://").rsplit(":", 1)
    dirs = real.containerd
    settings = MachineSettings(
        node=node.name,
        runtime=None if containerd else RuntimeSettings(
            socket=real.cri_socket, work_dir=real.dir / "runtime", records_dir=node.containers_dir,
            cdi_dirs=[Path("/etc/cdi"), Path("/var/run/cdi")], images=images, env=hardware_env, pod_ip=real.address,
            shim=shim, service_env={"KUBERNETES_SERVICE_HOST": api[0], "KUBERNETES_SERVICE_PORT": api[1]}),
        containerd=ContainerdSettings(
            argv=[str(containerd.containerd), "--config", str(dirs.config)], socket=dirs.socket, log=dirs.log,
            ctr=containerd.ctr, images=containerd.images,
            path=f"{containerd.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ) if containerd else None,
        kubelet_argv=[str(kubelet), f"--config={real.dir / 'kubelet-config.yaml'}",
                      f"--kubeconfig={real.dir / 'kubeconfig'}", "--root-dir=/var/lib/kubelet",
                      f"--cert-dir={real.dir / 'pki'}", f"--hostname-override={node.name}",
                      f"--node-ip={real.address}",
                      f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}", "--v=2"],
        kubelet_log=real.kubelet_log, kubelet_cwd=real.dir / "scratch")
    (real.dir / "machine-settings.json").write_text(settings.model_dump_json(indent=1))
    spec = {"root": str(real.dir / "root"), "mounts": mounts, "devices": [KMSG, *_gpu_devices(node)], "hosts": None,
            "cwd": "/", "argv": [sys.executable, "-m", "nvlfabric.sim.cri.machine",
                                 str(real.dir / "machine-settings.json")],
            "env": {**os.environ, "PYTHONUNBUFFERED": "1"}, "pidns": pidns, "pid_file": str(real.dir / "machine.pid"),
            "shim": str(shim)}
    (real.dir / "root").mkdir(exist_ok=True)
    real.machine_spec.write_text(json.dumps(spec, indent=1))
    return real.machine_spec


def labels(node: SimNode) -> dict[str, str]:
    """A simulated node's labels (`--node-labels`), and which kubelet runs it."""
    return {**node_labels(node), REAL_KUBELET_LABEL: "real"}


def gpu_capacity_patch(gpus: int) -> dict[str, Any]:
    """The node status patch advertising the GPUs as NVIDIA's device plugin would."""
    return {"status": {"capacity": {names.GPU_RESOURCE: str(gpus)}}}
