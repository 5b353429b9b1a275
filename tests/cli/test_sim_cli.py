"""`nvlfabric-sim` as a user drives it: idempotent up, busy ports, env, status, clean down."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.sim import processes
from nvlfabric.testbed.controlplane import ControlPlane, Ports, free_ports
from tests.conftest import Cluster

CLI = [sys.executable, "-m", "nvlfabric.cli.sim"]


def sim(*args: str, state_dir: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--state-dir", str(state_dir), *args], capture_output=True, text=True,
                          timeout=timeout)


def port_flags(ports: Ports) -> list[str]:
    return ["--apiserver-port", str(ports.apiserver), "--etcd-port", str(ports.etcd_client),
            "--etcd-peer-port", str(ports.etcd_peer), "--scheduler-port", str(ports.scheduler)]


@pytest.mark.cluster
def test_second_up_while_running_says_so_and_changes_nothing(cluster: Cluster) -> None:
    cp = cluster.controlplane
    before = cp.load_state()
    assert before is not None
    result = sim("up", *port_flags(cp.ports), state_dir=cp.state_dir)
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stdout
    after = cp.load_state()
    assert after is not None
    assert [(p.name, p.pid) for p in after.processes] == [(p.name, p.pid) for p in before.processes]
    assert after.token == before.token


@pytest.mark.cluster
def test_status_lists_every_component_running(cluster: Cluster) -> None:
    result = sim("status", state_dir=cluster.controlplane.state_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "cluster-dns"):
        assert any(line.startswith(name) and "running" in line for line in result.stdout.splitlines()), name


@pytest.mark.cluster
def test_env_prepares_a_shell_for_pulumi_and_the_cluster(cluster: Cluster) -> None:
    env_out = sim("env", state_dir=cluster.controlplane.state_dir)
    assert env_out.returncode == 0, env_out.stderr
    script = "set -e\n" + env_out.stdout + "\npulumi version\nkube-apiserver --version\necho \"$PULUMI_BACKEND_URL\"\n"
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"HOME": os.environ["HOME"],
                           "PATH": "/usr/bin:/bin"}, timeout=60)
    assert shell.returncode == 0, shell.stderr
    lines = shell.stdout.splitlines()
    assert lines[0] == "v3.260.0"
    assert lines[1] == "Kubernetes v1.37.2"
    assert lines[2] == f"file://{cluster.controlplane.backend_dir}"
    for var in ("KUBECONFIG=", "PULUMI_HOME=", "PULUMI_CONFIG_PASSPHRASE=", "PULUMI_SKIP_UPDATE_CHECK=true",
                "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true"):
        assert f"export {var}" in env_out.stdout


def test_a_busy_port_is_a_clear_error_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        # The others free ones: fixed numbers were flaky (a client connection's ephemeral port, seen
        # 43800 held by the suite's kube-apiserver talking to its etcd, is "in use" too).
        free = free_ports()
        result = sim("up", "--apiserver-port", str(busy), "--etcd-port", str(free.etcd_client),
                     "--etcd-peer-port", str(free.etcd_peer), "--scheduler-port", str(free.scheduler),
                     state_dir=tmp_path)
    assert result.returncode == 1
    assert f"port {busy} on 127.0.0.1 (apiserver) is already in use" in result.stderr
    assert "--apiserver-port" in result.stderr
    assert not (tmp_path / "controlplane.json").exists()


def test_status_and_down_when_nothing_runs(tmp_path: Path) -> None:
    status = sim("status", state_dir=tmp_path)
    assert status.returncode == 3 and "not running" in status.stdout
    down = sim("down", state_dir=tmp_path)
    assert down.returncode == 0 and "was not running" in down.stdout


@pytest.fixture
def own_controlplane(tmp_path: Path) -> Iterator[tuple[Path, Ports]]:
    ports = free_ports()
    yield tmp_path / "state", ports
    ControlPlane(state_dir=tmp_path / "state", ports=ports).down()


@pytest.mark.cluster
def test_up_then_down_leaves_no_process_and_no_lock(own_controlplane: tuple[Path, Ports]) -> None:
    state_dir, ports = own_controlplane
    up = sim("up", *port_flags(ports), state_dir=state_dir)
    assert up.returncode == 0, up.stderr
    assert "control plane ready" in up.stderr
    state = ControlPlane(state_dir=state_dir, ports=ports).load_state()
    assert state is not None and sorted(p.name for p in state.processes) == [
        "cluster-dns", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    assert all(processes.alive(p) for p in state.processes)

    down = sim("down", state_dir=state_dir)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not any(processes.alive(p) for p in state.processes)
    assert not (state_dir / "controlplane.lock").exists()
    assert not (state_dir / "controlplane.json").exists()
    assert not (state_dir / "etcd").exists()
    assert (state_dir / "logs" / "kube-apiserver.log").exists()  # kept for post-mortems
    for port in (ports.apiserver, ports.etcd_client, ports.scheduler):
        assert not processes.port_in_use(port)


@pytest.mark.cluster
def test_up_with_racks_brings_ready_gb200_nodes_and_faults_reach_them(tmp_path: Path) -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="nvlr-", dir="/tmp"))  # short: node sockets live below it
    ports = free_ports()
    try:
        up = sim("up", *port_flags(ports), "--racks", "2", "--nodes-per-rack", "2", "--first-rack", "0",
                 state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        assert "4/4 nodes Ready" in up.stderr
        status = sim("status", state_dir=state_dir)
        assert "sim-kubelet" in status.stdout and status.returncode == 0
        node = state_dir / "nodes" / "rack-1-node-01"
        assert (node / "driver-root" / "usr" / "lib64" / "libnvidia-ml.so.1").resolve().exists()
        assert (node / "driver-root" / "usr" / "bin" / "nvidia-imex").resolve().exists()
        assert "nvidia-caps-imex-channels" in (node / "proc-devices").read_text()

        degraded = sim("fault", "fabric-degraded", "rack-1-node-01", "--gpu", "2", state_dir=state_dir)
        assert degraded.returncode == 0, degraded.stderr
        assert "gpu.2.health_mask" in (state_dir / "nvml" / "faults" / "rack-1-node-01.faults").read_text()
        unknown = sim("fault", "node-down", "rack-7-node-00", state_dir=state_dir)
        assert unknown.returncode == 1 and "no simulated node 'rack-7-node-00'" in unknown.stderr
        assert sim("fault", "clear", "rack-1-node-01", state_dir=state_dir).returncode == 0
        assert not (state_dir / "nvml" / "faults" / "rack-1-node-01.faults").exists()
    finally:
        sim("down", state_dir=state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_racks_out_of_range_name_the_flag(tmp_path: Path) -> None:
    result = sim("up", "--racks", "1", "--nodes-per-rack", "19", state_dir=tmp_path)
    assert result.returncode == 1
    assert "--nodes-per-rack must be between 1 and 18" in result.stderr
