"""Suite-wide fixtures: one real control plane for the whole session (and `simulated_rack`, a
control plane of its own with a rack of simulated GB200 nodes, for the end-to-end tests).

The control plane is the real etcd/kube-apiserver/kube-scheduler/kube-controller-manager that
`make tools` builds. If one is already running in the test state directory (e.g. a developer's
`NVLFABRIC_TEST_SIM_DIR`), the suite uses it and leaves it running; otherwise it starts one on
ports of its own (so a `make demo` cluster is never disturbed) and stops it at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

from nvlfabric.sim import processes
from nvlfabric.sim.images import ImageProgram, default_images
from nvlfabric.sim.paths import REPO
from nvlfabric.testbed.controlplane import ControlPlane, Ports, free_ports  # free_ports: also imported from here

TEST_PORTS = Ports(etcd_client=33790, etcd_peer=33800, apiserver=36443, scheduler=30259)


@dataclass(frozen=True)
class Cluster:
    controlplane: ControlPlane
    kubeconfig: Path
    client: Client


def _progress(msg: str) -> None:
    print(f"[control plane] {msg}", file=sys.stderr, flush=True)


def session_ports() -> Ports:
    """The suite's usual ports, or free ones when another session (another checkout) holds them."""
    wanted = [TEST_PORTS.etcd_client, TEST_PORTS.etcd_peer, TEST_PORTS.apiserver, TEST_PORTS.scheduler]
    if not any(processes.port_in_use(p) for p in wanted):
        return TEST_PORTS
    return free_ports()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    state_dir = Path(os.environ.get("NVLFABRIC_TEST_SIM_DIR") or REPO / "build" / "test-sim")
    cp = ControlPlane(state_dir=state_dir, ports=TEST_PORTS, progress=_progress)
    saved = cp.load_state()
    if saved is None or not cp.running():
        cp.ports = session_ports()
    started = cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="nvlfabric-tests")
    try:
        yield Cluster(controlplane=cp, kubeconfig=cp.kubeconfig, client=client)
    finally:
        client.close()
        if started:
            cp.down()


@contextlib.contextmanager
def simulated_rack(*, ports: Ports, first_rack: int, nodes: int = 3, field_manager: str,
                   prefix: str, racks: int = 1, workload_scheduling: bool = False,
                   images: dict[str, ImageProgram] | None = None, addons: tuple[str, ...] = (),
                   pod_network: str = "namespaced", gpu_devices: str = "DevicePlugin",
                   extra_args: dict[str, list[str]] | None = None) -> Iterator[tuple[ControlPlane, Client]]:
    """A control plane of its own with one rack of `nodes` simulated GB200 nodes (rack number
    `first_rack`: addresses 127.10.<first_rack>.x, node names from it), and a client for it;
    `images` over the simulator's default ones (nvlfabric/sim/images.py). Stopped and removed
    afterwards; the agents' and the kubelet's last log lines are printed (pytest shows them when a
    test failed)."""
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=ports, racks=racks, nodes_per_rack=nodes, first_rack=first_rack,
                      progress=lambda m: None, workload_scheduling=workload_scheduling,
                      images={**default_images(), **(images or {})}, addons=addons, pod_network=pod_network,
                      gpu_devices=gpu_devices,
                      extra_args=extra_args or {})
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager=field_manager)
    try:
        yield cp, client
    finally:
        client.close()
        cp.down()
        print_simulator_logs(state)
        shutil.rmtree(state, ignore_errors=True)


def print_simulator_logs(state: Path) -> None:
    """The tail of what the agents and the simulated kubelets said (pytest shows it when a test failed)."""
    for log in [*sorted(state.glob("nodes/*/pods/*/*.log")), state / "logs" / "sim-kubelet.log"]:
        print(f"--- {log.relative_to(state)}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))


def stuck_deletions(cp: ControlPlane, client: Client, namespace: str = "default") -> str:
    """What a hung delete is waiting on: objects being deleted with their finalizers, and the
    simulated kubelet's last words."""
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Pod

    lines = []
    for res in (Job, Pod):
        for obj in client.list(res, namespace=namespace):
            meta = obj.metadata
            lines.append(f"{res.__name__} {meta.name}: deleting since {meta.deletionTimestamp}, finalizers "
                         f"{meta.finalizers}, node {getattr(obj.spec, 'nodeName', None)}, "
                         f"phase {getattr(obj.status, 'phase', None)}")
    log = cp.state_dir / "logs" / "sim-kubelet.log"
    tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
    return "\n".join([*lines, "--- sim-kubelet.log", *tail])


@pytest.fixture(autouse=True)
def _fresh_program() -> Iterator[None]:
    """Each test declares its components as a program of its own (names taken, drivers' modes)."""
    from nvlfabric.components import program

    program.reset()
    yield
    program.reset()
