"""Starting, identifying and stopping the simulator's background processes.

A process is recorded as (pid, start time from /proc/<pid>/stat), so a later `down` never signals
an unrelated process that happens to reuse a recorded pid.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from nvlfabric.api import names


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
    return start_ticks(rec.pid) == rec.start_ticks and _running(rec.pid)


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
    _end([rec.pid], lambda _: alive(rec), grace_s=timeout)


def _end(pids: list[int], running: Callable[[int], bool], *, grace_s: float) -> None:
    """SIGTERM `pids`, SIGKILL those still `running` after `grace_s`, and wait until none is."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, math.inf)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            for pid in pids:
                reap(pid)
            pids = [p for p in pids if running(p)]
            if pids:
                time.sleep(0.05)
        if not pids:
            return


RUN_TOKEN_VAR = "NVLFABRIC_RUN_TOKEN"
"""Set in the environment of a command run by `run_owned`, and so in every process it starts."""


def tagged(token: str) -> list[int]:
    """The processes whose environment carries `token` as RUN_TOKEN_VAR (unreadable ones are not ours)."""
    needle = f"{RUN_TOKEN_VAR}={token}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            out.append(int(entry.name))
    return out


def end_tagged(token: str, *, grace_s: float = 5.0) -> None:
    """SIGTERM every process carrying `token`, SIGKILL those still there after `grace_s`; again
    for any that one of them started meanwhile."""
    while pids := tagged(token):
        _end(pids, _running, grace_s=grace_s)


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def run_owned(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end with its output captured, then end every process it started that is
    still running. The Pulumi CLI starts its language host and plugins in process groups of their
    own; a YAML project's component plugin host outlives even a clean exit, and when pulumi is
    killed (a timeout, a benchmark stopped by SIGTERM, an interrupted test) they all do, reparented
    to init where no process tree finds them. What finds them is the environment they inherit: a
    token of this run's (RUN_TOKEN_VAR). Output goes to files, not pipes: a child left holding a
    pipe would keep the read from ending. A timeout raises TimeoutExpired as subprocess.run does."""
    token = uuid.uuid4().hex
    run_env = {**(os.environ if env is None else env), RUN_TOKEN_VAR: token}
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True,
                                start_new_session=True, env=run_env, cwd=cwd)
        try:
            proc.wait(timeout=timeout)
        finally:  # exited, timed out, or the caller stopped: whatever it left goes
            end_tagged(token)
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


LISTEN_PORTS_FROM = 20000
"""The lowest port `free_loopback_ports` picks: above the kubelet's and the control plane's own
(10248-10259), which simulated and real kubelets serve on their node addresses."""
RESERVED_PORTS = frozenset({20259, 23790, 23800, 26443, names.DEFAULT_MASTER_PORT})
"""Never picked: the default simulator's ports (`make demo` beside a test run) and torch's master port."""


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (net.ipv4.ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct ports free on every address (held open together while chosen), below the
    kernel's ephemeral range. A port the kernel picks for `bind(0)` is an ephemeral one, and a
    control plane chosen at test collection and started minutes later found its API server's
    port taken by some outgoing connection meanwhile (`bind: address already in use`); outgoing
    connections never take a port below the range. Free on every address, since the API server
    listens on all of them."""
    high = _ephemeral_low()
    if high - LISTEN_PORTS_FROM < 4 * count:  # a machine whose ephemeral range starts low
        return _kernel_picked_ports(count)
    socks: list[socket.socket] = []
    try:
        for port in random.sample(range(LISTEN_PORTS_FROM, high), min(high - LISTEN_PORTS_FROM, 64 * count)):
            if port in RESERVED_PORTS:
                continue
            sock = socket.socket()
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            if len(socks) == count:
                return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()
    return _kernel_picked_ports(count)


def _kernel_picked_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
