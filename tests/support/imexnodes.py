"""Simulated members of an IMEX domain for the node agent's IMEX tests: each node its own loopback
address (127.0.30.x), work directory and IMEX keeper (the C program), the members sharing the
domain's ports as real members do, the daemons the simulator's stand-ins."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from nvlfabric.nodeagent import imex
from nvlfabric.nodeagent.imexkeeper import KeeperDomain
from nvlfabric.sim.cluster import eventually
from tests.sim.imex_fixtures import TlsAuthority
from tests.support.keepers import Keeper

SUBNET = "127.0.30"


def free_port(hosts: list[str], avoid: set[int]) -> int:
    """A port free on every one of `hosts`, not in `avoid`."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        if port in avoid:
            continue
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def ip(i: int) -> str:
    return f"{SUBNET}.{i}"


def pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds `text` (a test's directory: its keepers and daemons)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def spawn_daemon(nodes: Nodes, config: Path) -> subprocess.Popen[bytes]:
    """A daemon the keeper did not start (as one a killed keeper started and never recorded), once it
    is READY (and so past installing its signal handlers: SIGTERM makes it exit 0)."""
    with (config.parent / "imex.log").open("ab") as log:
        proc = subprocess.Popen([str(nodes.driver_root / "usr" / "bin" / "nvidia-imex"), "-c", str(config)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    ctl = nodes.driver_root / "usr" / "bin" / "nvidia-imex-ctl"
    eventually("the daemon to be READY", lambda: imex.query(ctl, config, 5.0).ready, timeout=10, interval=0.02)
    return proc


def fake_driver_root(tmp_path: Path, imex_binary: bytes) -> Path:
    """A driver root whose usr/bin/nvidia-imex is `imex_binary` (a script, or bytes that do not run)."""
    root = tmp_path / "fake-driver"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "nvidia-imex").write_bytes(imex_binary)
    (root / "usr" / "bin" / "nvidia-imex").chmod(0o755)
    return root


def credentials(d: KeeperDomain, ca: TlsAuthority, target: str) -> None:
    """What the agent writes for a TLS domain (imexauth.py): the node's key and certificate, the CA."""
    (d.dir / "tls").mkdir(parents=True, exist_ok=True)
    ca.issue("node", dns=[target], key_path=d.dir / "tls" / "node.key", cert_path=d.dir / "tls" / "node.crt")
    (d.dir / "tls" / "ca.crt").write_bytes(ca.ca_file.read_bytes())


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie its parent has not reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return True
    return state == "Z"


class Nodes:
    """The members of one domain on simulated nodes 1..6: node i has address ip(i), work directory
    `<root>/node<i>` and, once asked for, its keeper; `domain(i)` is the agent's handle on node i's
    domain. `close()` stops the keepers and kills whatever still runs from `root`."""

    def __init__(self, root: Path, driver_root: Path) -> None:
        self.root = root
        self.driver_root = driver_root
        hosts = [ip(i) for i in range(1, 7)]
        self.server_port = free_port(hosts, set())
        self.cmd_port = free_port(hosts, {self.server_port})
        self.keepers: dict[int, Keeper] = {}
        self.started: list[Keeper] = []

    def workdir(self, i: int) -> Path:
        return self.root / f"node{i}"

    def keeper(self, i: int, **kwargs: Any) -> Keeper:
        """Node i's keeper, started on first use (or again after it was killed or stopped);
        `kwargs` go to `Keeper.start` (driver_root among them)."""
        k = self.keepers.get(i)
        if k is None or k.proc.poll() is not None:
            kwargs.setdefault("driver_root", self.driver_root)
            k = Keeper.start(self.workdir(i), **kwargs)
            self.keepers[i] = k
            self.started.append(k)
        return k

    def domain(self, i: int, domain_id: str = "clique-a", **kwargs: Any) -> KeeperDomain:
        """The agent's handle on node i's domain, through node i's keeper (`kwargs` for
        `KeeperDomain`: ports, tls_target...)."""
        kwargs.setdefault("server_port", self.server_port)
        kwargs.setdefault("cmd_port", self.cmd_port)
        return KeeperDomain(self.keeper(i).socket, domain_id=domain_id, workdir=self.workdir(i),
                            driver_root=self.driver_root, bind_address=ip(i), **kwargs)

    def close(self) -> None:
        for k in self.started:
            with contextlib.suppress(Exception):
                k.close()
        for _ in range(50):  # daemons a test started itself, keepers that would not stop
            pids = pids_mentioning(str(self.root))
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
