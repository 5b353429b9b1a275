"""Scheduler and controller-manager settings (`ControlPlane.scheduler_config`, `extra_args`,
`extra_env`), and a simulated kubelet stopping many local processes at once (so `down` never leaves
agents behind)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml
from lightkube.models.core_v1 import Container

from nvlfabric.sim import processes
from nvlfabric.sim.kubelet.processes import launch, stop_all
from nvlfabric.testbed.controlplane import ControlPlane, free_ports

# Takes a second to exit after SIGTERM, as a node agent stopping its IMEX daemon does.
SLOW_EXIT = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n"
             "print('up', flush=True)\n"
             "time.sleep(120)\n")


def test_stop_all_stops_processes_together_not_one_after_another(tmp_path: Path) -> None:
    procs = [launch(pod_uid=f"uid-{i}", pod_name=f"p{i}", namespace="default", container=Container(name="c"),
                     argv=[sys.executable, "-c", SLOW_EXIT], env={}, cwd=tmp_path,
                     log_path=tmp_path / f"p{i}.log") for i in range(6)]
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"p{i}.log").read_text().strip() == "up" for i in range(6)):
        assert time.monotonic() < deadline, "the processes did not start"
        time.sleep(0.05)
    t0 = time.monotonic()
    stop_all(procs, timeout=10)
    took = time.monotonic() - t0
    assert all(p.proc.returncode == 0 for p in procs), [p.proc.returncode for p in procs]  # exited, not killed
    assert took < 4, f"6 processes that take 1 s each to stop took {took:.1f}s: stopped one after another?"


def test_stop_all_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n" \
               "time.sleep(120)\n"
    (proc,) = procs = [launch(pod_uid="uid", pod_name="p", namespace="default", container=Container(name="c"),
                               argv=[sys.executable, "-c", stubborn], env={}, cwd=tmp_path,
                               log_path=tmp_path / "p.log")]
    while (tmp_path / "p.log").read_text().strip() != "up":
        time.sleep(0.05)
    stop_all(procs, timeout=0.5)
    assert proc.proc.returncode == -9


@pytest.mark.cluster
def test_scheduler_config_and_extra_args_reach_the_components(tmp_path: Path) -> None:
    cp = ControlPlane(state_dir=tmp_path / "state", ports=free_ports(), progress=lambda m: None,
                      scheduler_config={"podMaxBackoffSeconds": 1, "clientConnection": {"qps": 500, "burst": 1000}},
                      extra_args={"kube-controller-manager": ["--kube-api-qps=200"]},
                      extra_env={"kube-apiserver": {"GOGC": "400"}})
    try:
        cp.up()  # waits for the scheduler's /healthz: it accepted the generated configuration
        config = yaml.safe_load((cp.state_dir / "kube-scheduler.yaml").read_text())
        assert config["kind"] == "KubeSchedulerConfiguration" and config["podMaxBackoffSeconds"] == 1
        assert config["clientConnection"] == {"kubeconfig": str(cp.kubeconfig), "qps": 500, "burst": 1000}
        assert config["leaderElection"] == {"leaderElect": False}
        state = cp.load_state()
        assert state is not None
        argv = {p.name: p.argv for p in state.processes}
        assert f"--config={cp.state_dir / 'kube-scheduler.yaml'}" in argv["kube-scheduler"]
        assert not any(a.startswith("--kubeconfig") for a in argv["kube-scheduler"])  # ignored with --config
        assert argv["kube-controller-manager"][-1] == "--kube-api-qps=200"
        assert all(processes.alive(p) for p in state.processes)
        environ = {p.name: (Path("/proc") / str(p.pid) / "environ").read_bytes().split(b"\0") for p in state.processes}
        assert b"GOGC=400" in environ["kube-apiserver"] and b"GOGC=400" not in environ["etcd"]
    finally:
        cp.down()


def test_free_ports_are_below_the_ephemeral_range_and_free_on_every_address() -> None:
    """Ports chosen at test collection are used minutes later: a kernel-picked (ephemeral) one was
    taken meanwhile by an outgoing connection (`bind: address already in use`, kube-apiserver)."""
    import socket

    for _ in range(20):
        ports = processes.free_loopback_ports(4)
        assert len(set(ports)) == 4
        assert all(processes.LISTEN_PORTS_FROM <= p < processes._ephemeral_low() for p in ports), ports
        assert not set(ports) & processes.RESERVED_PORTS
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("0.0.0.0", port))  # the API server listens on every address
