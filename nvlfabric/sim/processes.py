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
import tempfile
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


def kill_group(pgid: int, *, grace_s: float = 5.0) -> None:
    """SIGTERM every process left in process group `pgid`, SIGKILL what is still there after `grace_s`.
    The kernel keeps a group's id from being reused while any member lives, so this never reaches an
    unrelated process; an empty group is a no-op."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_group(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end with its output captured, in a process group of its own, and then end
    whatever it left in that group. The Pulumi CLI starts its language host and resource plugins as
    children; when it is killed (a timeout, a benchmark stopped by SIGTERM, a test interrupted) they
    outlive it, and a YAML project's component plugin host is left behind even by a clean exit.
    A group of its own lets one signal reach them all. Output goes to files, not pipes: a child left
    holding a pipe would keep the read from ending. A timeout raises TimeoutExpired as
    subprocess.run does."""
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True,
                                start_new_session=True, env=dict(env) if env is not None else None, cwd=cwd)
        try:
            proc.wait(timeout=timeout)
        finally:  # exited, timed out, or the caller stopped: whatever is left of the group goes
            kill_group(proc.pid)
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(argv), proc.returncode, out.read(), err.read())


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
