"""What the simulated kubelet knows: its configuration, and per node what it holds of its pods.

Every other module of the kubelet reads and writes a node's `NodeState`: one plain object per
node, owned by the one asyncio loop that runs all nodes (no locks: nothing else touches it).
"""

from __future__ import annotations

import asyncio
import datetime
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.kubelet.devicehealth import HealthCache
from nvlfabric.sim.kubelet.hollow import HollowAgent
from nvlfabric.sim.kubelet.plugins import Plugin
from nvlfabric.sim.kubelet.processes import PodProcess
from nvlfabric.sim.nodes import SimNode
from nvlfabric.sim.podnetwork import PodNetwork

PROCESS_STOP_TIMEOUT_S = 10.0  # at stop, for all local processes together (testbed/controlplane.py waits longer)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def rfc3339(t: datetime.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeState:
    node: SimNode
    dra_gpus: bool = False
    """Its GPUs are a DRA driver's (NvlfabricDriver gpu_devices DRA): no device plugin's nvidia.com/gpu."""
    uid: str = ""
    plugins: dict[Path, Plugin | HollowAgent] = field(default_factory=dict)  # registry socket → plugin
    driver_gone_since: dict[str, float] = field(default_factory=dict)
    prepared: dict[str, dict[str, list[ClaimRef]]] = field(default_factory=dict)  # pod uid → driver → claims
    processes: dict[tuple[str, str], PodProcess] = field(default_factory=dict)
    """(pod uid, container) → its local process: every container of a pod whose image maps to one."""
    terminated: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(pod uid, container) → the `lastState.terminated` of its previous instance."""
    started: set[str] = field(default_factory=set)  # pod uids reported Running
    init_done: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(pod uid, init container) → the `state.terminated` of its run that succeeded."""
    init_failures: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(pod uid, init container) → its last failed run (`lastState.terminated`), its restarts counted."""
    init_running: dict[str, PodProcess] = field(default_factory=dict)  # pod uid → its running init container
    health: HealthCache = field(default_factory=HealthCache)
    health_watches: dict[Path, asyncio.Task[None]] = field(default_factory=dict)  # registry socket → stream
    devices: dict[str, dict[str, dict[str, list[PreparedDevice]]]] = field(default_factory=dict)
    """pod uid → ResourceClaim name → driver → its prepared devices (the kubelet's claim info cache)."""
    pod_names: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod uid → (namespace, name)
    ready: dict[tuple[str, str], bool] = field(default_factory=dict)
    """(pod uid, container) → its readiness, for the containers whose probes say it (others: ready)."""
    probers: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)  # (uid, container) → probes
    machine: subprocess.Popen[bytes] | None = None
    """The first process of the node's PID namespace (the node is a machine: its /proc is its own)."""
    pidns: str | None = None
    """/proc/<that process>/ns/pid, which the node's containers enter."""
    pod_pidns: dict[str, tuple[subprocess.Popen[bytes], str]] = field(default_factory=dict)
    """pod uid → the PID namespace its containers share (`shareProcessNamespace`: machine.py): the
    process holding it, and its /proc/<first process>/ns/pid."""
    hollow_agent_pod: str | None = None
    """On a hollow node: the uid of the agent pod its HollowAgent stands in for (hollow.py)."""
    pod_ips: dict[str, str] = field(default_factory=dict)
    """pod uid → its own address (a pod that is not hostNetwork, on a pod network: podnetwork.py)."""
    netns: dict[str, Path] = field(default_factory=dict)
    """pod uid → its network namespace, for a pod that runs processes (the others listen nowhere)."""

    def pod_ip(self, uid: str) -> str:
        """The pod's IP: its own, else its node's (hostNetwork, or no pod network)."""
        return self.pod_ips.get(uid, self.node.address)

    def plugin_for(self, driver: str) -> Plugin | HollowAgent | None:
        return next((p for p in self.plugins.values() if p.driver == driver), None)


@dataclass
class KubeletConfig:
    """How the simulated kubelets behave; the defaults are the real kubelet's where it has one."""

    images: dict[str, ImageProgram] = field(default_factory=dict)
    """Container image (without tag) → what it runs; pods with such an image run as processes."""
    api_server: str = ""
    """https://host:port of the API server, for KUBERNETES_SERVICE_HOST/PORT in local processes."""
    hardware_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node name → environment giving a local process that node's hardware identity (NVML)."""
    shim: Path | None = None
    """The containers' shim (nvlfabric/sim/shim; hardware.build_standins builds it); None: built here."""
    pki_dir: Path | None = None
    """The cluster's CA (ca.crt, ca.key): each node's kubelet API is served with a certificate it
    signs, for `kubectl logs`. None: no kubelet API."""
    dra_gpus: bool = False
    """The nodes advertise no device plugin's nvidia.com/gpu: the agents publish the GPUs as DRA
    devices, which serve nvidia.com/gpu requests (ControlPlane gpu_devices "DRA")."""
    pod_network: PodNetwork | None = None
    """Pods that are not hostNetwork get a network namespace and an address of their own
    (podnetwork.py); None: every pod shares its node's network and address."""


class PodFailed(Exception):
    """The pod failed for good (an init container failed under `restartPolicy: Never`)."""


class PodNotReady(Exception):
    """The pod cannot start yet; the message is what it waits for (shown as a pod event)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def record_path(node: SimNode, namespace: str, pod: str, container: str) -> Path:
    """Where a started container's record is (what it was given: CDI edits, env, command)."""
    return node.containers_dir / f"{namespace}_{pod}_{container}.json"
