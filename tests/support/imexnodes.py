"""Simulated members of an IMEX domain for the agent's IMEX tests: each its own loopback address
(127.0.30.x) and work directory, sharing the domain's ports as real members do, run from the
simulator's stand-in binaries."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path
from typing import Any

from nvlfabric.nodeagent.imex import ImexDomain

SUBNET = "127.0.30"


def free_port(hosts: list[str], avoid: set[int]) -> int:
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




def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


class Nodes:
    """Makes ImexDomain instances standing for the members of one domain on simulated nodes."""

    def __init__(self, root: Path, driver_root: Path) -> None:
        self.root = root
        self.driver_root = driver_root
        hosts = [ip(i) for i in range(1, 7)]
        self.server_port = free_port(hosts, set())
        self.cmd_port = free_port(hosts, {self.server_port})
        self.made: list[ImexDomain] = []

    def domain(self, i: int, *, domain_id: str = "clique-a", **kwargs: Any) -> ImexDomain:
        kwargs.setdefault("server_port", self.server_port)
        kwargs.setdefault("cmd_port", self.cmd_port)
        d = ImexDomain(domain_id=domain_id, workdir=self.root / f"node{i}", driver_root=self.driver_root,
                       bind_address=ip(i), grace_time=0, stop_timeout=3.0, **kwargs)
        self.made.append(d)
        return d

    def close(self) -> None:
        for d in self.made:
            with contextlib.suppress(Exception):
                d.stop()
        for pid in _pids_mentioning(str(self.root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
