"""Starting, identifying and stopping the simulator's background processes.

A process is recorded as (pid, start time from /proc/<pid>/stat), so a later `down` never signals
an unrelated process that happens to reuse a recorded pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel


class ProcessRecord(BaseModel):
    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    log: str


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def alive(rec: ProcessRecord) -> bool:
    ticks = start_ticks(rec.pid)
    if ticks is None or ticks != rec.start_ticks:
        return False
    state = Path(f"/proc/{rec.pid}/stat").read_text()
    return state[state.rindex(")") + 2] != "Z"


def spawn(name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> ProcessRecord:
    """Start a detached process (own session, so it outlives the CLI) logging to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, env=dict(env) if env is not None else None, cwd=cwd)
    ticks = start_ticks(proc.pid)
    # The Popen object is dropped on purpose: the process belongs to the simulator, not to us.
    proc.returncode = 0
    return ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks or 0, argv=list(argv), log=str(log))


def reap(pid: int) -> None:
    """Collect a child's exit status if it is ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(rec: ProcessRecord, *, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; a no-op for a process that is already gone."""
    if not alive(rec):
        reap(rec.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(rec.pid)
        if not alive(rec):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(rec.pid, signal.SIGKILL)
    while alive(rec):
        reap(rec.pid)
        time.sleep(0.05)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
