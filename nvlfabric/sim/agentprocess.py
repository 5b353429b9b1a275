"""The node agent and the node's IMEX keeper as processes on a simulated host, started through
their real entry points (`python -m nvlfabric agent`, `python -m nvlfabric imex`) and stopped
the way the kubelet's container runtime stops containers: SIGTERM, or SIGKILL as an OOM kill would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from nvlfabric.api import names
from nvlfabric.api.kubelet import pluginregistration_pb2, pluginregistration_pb2_grpc
from nvlfabric.sim import hardware, nodeimage
from nvlfabric.sim.agenthost import Host


class ChildProcess:
    """What the agent and the keeper share: a child process with its log, killed or terminated as
    a container is."""

    def __init__(self, log: Path) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = log

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node problem would; waits for the process to be gone."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, as the kubelet stops a container, then SIGKILL after `timeout` s; the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class AgentProcess(ChildProcess):
    """`python -m nvlfabric agent` for `host`, started and killed like the kubelet's container runtime.

    The host's IMEX keeper (`python -m nvlfabric imex`, its own DaemonSet in a cluster) is started
    with the agent's first start and lives on when the agent is killed or stopped, as its pod would:
    `close()` ends both.
    """

    def __init__(self, host: Host, kubeconfig: Path, *, resync_seconds: float = 30.0,
                 in_cluster: tuple[str, Path] | None = None, health_port: int = 0, metrics_port: int = 0,
                 registration_timeout: float = 0.0) -> None:
        """`in_cluster`: (API server host:port, service-account dir with token and ca.crt): the agent
        configured as in its DaemonSet, instead of from `kubeconfig`. `registration_timeout`: the
        agent's --registration-timeout (0 here: tests often play the kubelet's part without
        registering the plugin)."""
        super().__init__(host.node.dir / "agent.log")
        self.registration_timeout = registration_timeout
        self.host = host
        self.kubeconfig = kubeconfig
        self.resync_seconds = resync_seconds
        self.in_cluster = in_cluster
        self.ports = (health_port, metrics_port)
        self.starts = 0
        self.keeper = KeeperProcess(host)

    def argv(self) -> list[str]:
        n = self.host.node
        creds = ["--kubeconfig", str(self.kubeconfig)] if self.in_cluster is None else \
            ["--service-account-dir", str(self.in_cluster[1])]
        return [sys.executable, "-m", "nvlfabric", "agent", *creds, "--node-name", n.name, "--node-ip", n.address,
                "--kubelet-root", str(n.kubelet_root),
                "--cdi-root", str(self.host.cdi_dir), "--driver-root", str(n.driver_root),
                "--proc-devices", str(n.proc_devices), "--boot-id", str(self.host.boot_id),
                "--resync-seconds", str(self.resync_seconds), "--log-format", "text",
                "--health-port", str(self.ports[0]), "--metrics-port", str(self.ports[1]),
                "--listen-address", "127.0.0.1", "--registration-timeout", str(self.registration_timeout)]

    def spawn(self) -> subprocess.Popen[bytes]:
        assert not self.alive, "the agent is already running"
        if not self.keeper.alive:
            self.keeper.start()
        env = {**os.environ, **hardware.node_env(self.host.state, self.host.node)}
        if self.in_cluster is not None:
            host, _, port = self.in_cluster[0].rpartition(":")
            env = {k: v for k, v in env.items() if k != "KUBECONFIG"}
            env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            self.proc = subprocess.Popen(self.argv(), cwd=self.host.state, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        return self.proc

    def start(self, timeout: float = 30.0) -> None:
        self.spawn()
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Until the registration socket answers GetInfo, as the kubelet's plugin watcher would see it."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                raise AssertionError(f"the agent exited with {self.returncode} while starting; log:\n{self.tail()}")
            if self.host.registration.exists() and self.host.endpoint.exists():
                try:
                    with grpc.insecure_channel(f"unix:{self.host.registration}") as ch:
                        pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                            pluginregistration_pb2.InfoRequest(), timeout=1)
                    return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the agent did not serve within {timeout} s; log:\n{self.tail()}")
            time.sleep(0.02)

    def close(self) -> None:
        """The agent and its keeper stopped (SIGTERM; the keeper stops its IMEX daemons)."""
        self.terminate()
        self.keeper.terminate()


class KeeperProcess(ChildProcess):
    """`python -m nvlfabric imex` for `host` (which replaces itself with the keeper's program, as in
    the node image): the IMEX daemons' owner, apart from the agent."""

    def __init__(self, host: Host) -> None:
        super().__init__(host.node.dir / "imex-keeper.log")
        self.host = host

    @property
    def socket(self) -> Path:
        return self.host.imex_workdir / names.IMEX_KEEPER_SOCKET

    def start(self, timeout: float = 20.0) -> None:
        n = self.host.node
        env = {**os.environ, **nodeimage.image_env(), **hardware.node_env(self.host.state, n)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nvlfabric", "imex", "--kubelet-root", str(n.kubelet_root),
                 "--driver-root", str(n.driver_root), "--log-format", "text"],
                cwd=self.host.state, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if not self.alive or time.monotonic() > deadline:
                raise AssertionError(f"the IMEX keeper did not serve on {self.socket}; log:\n{self.tail()}")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect(str(self.socket))
                s.sendall(b'{"op": "status"}\n')
                return s.recv(1).startswith(b"{")
        except OSError:
            return False
