"""A real-kubelet node whose runtime is containerd and runc (`--runtime containerd`), not the stand-in.

Everything of the node is real but for its GPUs: the kubelet (built from the pinned Kubernetes
module), containerd with its CRI plugin, the containerd-shim-runc-v2 shim, runc and the CNI
plugins (tools/build.py builds them from their Go modules), and the images (nvlfabric's node image
built from deploy/Dockerfile, a busybox workload image and a pause image: testbed/nodeimages.py).
NVML, the IMEX daemon and the GPU device nodes stay simulated, in the node's driver root and /dev.

This module writes what such a node's containerd needs, in containerd's own formats, under the
node's directory, and nothing outside it:

- `config.toml` (config version 3): root, state, socket and runc's own root of the node's (two
  nodes on one machine share nothing); the CRI plugin with CDI on over the node's /etc/cdi and
  /var/run/cdi (the machine's paths), runc by path, cgroupfs (the kubelet's driver here), the
  pinned pause image, the CNI plugins' directory and this node's network config; NRI off (its
  socket would be the machine's, shared by every node);
- the CNI network (`cni/10-nvlfabric-sim.conflist`): the bridge plugin on the simulator's pod
  bridge (sim/podnetwork.py: the gateway, the API server and the cluster DNS are on it), and
  host-local addresses from the node's own block of the simulator's subnet, kept in the node's
  directory: a pod here is reachable at its IP like a pod of a simulated node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NETWORK_NAME = "nvlfabric-sim"
CNI_CONF = "10-nvlfabric-sim.conflist"
CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class ContainerdDirs:
    dir: Path
    """The node's containerd directory (under its real-kubelet directory)."""

    @property
    def config(self) -> Path:
        return self.dir / "config.toml"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def runc_root(self) -> Path:
        return self.dir / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def ipam_dir(self) -> Path:
        return self.dir / "ipam"

    @property
    def log(self) -> Path:
        return self.dir / "containerd.log"


@dataclass(frozen=True)
class PodNetworkBlock:
    """Where this node's pods sit on the simulator's pod network."""

    bridge: str
    subnet: str
    gateway: str
    first: str
    last: str


def may_lower_oom_score_adj() -> bool:
    """Whether this machine lets root lower a process's oom_score_adj (CAP_SYS_RESOURCE): sandbox
    and Guaranteed containers get -998 and -997, which runc writes into /proc/self/oom_score_adj.
    Where it may not (a machine run without CAP_SYS_RESOURCE, as these are: runc fails with
    `failed to update /proc/self/oom_score_adj: Permission denied`), containerd's own
    `restrict_oom_score_adj` keeps them at containerd's."""
    try:
        with open("/proc/self/status") as status:
            effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(effective >> CAP_SYS_RESOURCE & 1)


def config_toml(dirs: ContainerdDirs, *, runc: Path, cni_bin: Path, pause_image: str,
                restrict_oom: bool | None = None) -> str:
    """containerd's config (version 3) for this node."""
    if restrict_oom is None:
        restrict_oom = not may_lower_oom_score_adj()
    return f'''version = 3
root = "{dirs.root}"
state = "{dirs.state}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{dirs.socket}"

[ttrpc]
  address = "{dirs.socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dirs.dir / 'opt'}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause_image}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  # Only where root may not lower oom_score_adj (see may_lower_oom_score_adj).
  restrict_oom_score_adj = {str(restrict_oom).lower()}

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{dirs.runc_root}"
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{dirs.cni_conf_dir}"
  max_conf_num = 1
'''


def cni_conflist(dirs: ContainerdDirs, block: PodNetworkBlock) -> dict[str, Any]:
    """The node's CNI network: the simulator's bridge, the node's block of addresses, the gateway as
    the default route (no masquerade: pods reach the gateway and each other, as on the simulated
    nodes)."""
    return {
        "cniVersion": "1.0.0", "name": NETWORK_NAME,
        "plugins": [{
            "type": "bridge", "bridge": block.bridge, "isGateway": False, "isDefaultGateway": False,
            "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(dirs.ipam_dir),
                     "ranges": [[{"subnet": block.subnet, "rangeStart": block.first, "rangeEnd": block.last,
                                  "gateway": block.gateway}]],
                     "routes": [{"dst": "0.0.0.0/0", "gw": block.gateway}]},
        }],
    }


def write(dirs: ContainerdDirs, *, runc: Path, cni_bin: Path, pause_image: str, block: PodNetworkBlock) -> None:
    dirs.dir.mkdir(parents=True, exist_ok=True)
    dirs.cni_conf_dir.mkdir(exist_ok=True)
    dirs.config.write_text(config_toml(dirs, runc=runc, cni_bin=cni_bin, pause_image=pause_image))
    (dirs.cni_conf_dir / CNI_CONF).write_text(json.dumps(cni_conflist(dirs, block), indent=1))
