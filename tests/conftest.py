"""Suite-wide fixtures: one real control plane for the whole session.

The control plane is the real etcd/kube-apiserver/kube-scheduler/kube-controller-manager that
`make tools` builds. If one is already running in the test state directory (e.g. a developer's
`NVLFABRIC_TEST_SIM_DIR`), the suite uses it and leaves it running; otherwise it starts one on
ports of its own (so a `make demo` cluster is never disturbed) and stops it at the end.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

from nvlfabric.sim import processes
from nvlfabric.sim.controlplane import ControlPlane, Ports
from nvlfabric.sim.paths import REPO

TEST_PORTS = Ports(etcd_client=33790, etcd_peer=33800, apiserver=36443, scheduler=30259)


@dataclass(frozen=True)
class Cluster:
    controlplane: ControlPlane
    kubeconfig: Path
    client: Client


def _progress(msg: str) -> None:
    print(f"[control plane] {msg}", file=sys.stderr, flush=True)


def free_ports() -> Ports:
    """Four distinct free loopback ports (held open together while chosen), for tests that start a
    control plane of their own."""
    socks = [socket.socket() for _ in range(4)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        etcd, peer, api, sched = (int(sock.getsockname()[1]) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    return Ports(etcd_client=etcd, etcd_peer=peer, apiserver=api, scheduler=sched)


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
