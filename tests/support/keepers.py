"""The node's IMEX keeper (the C program, nvlfabric/nodeagent/keeper) run by tests: built once per
session, started on a work directory, asked through its socket as the agent asks it."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import socket as sockets
import subprocess
import time
from pathlib import Path

from nvlfabric.api import names
from nvlfabric.nodeagent import imex, imexkeeper
from nvlfabric.sim import nodeimage

START_TIMEOUT_S = 15.0
"""The ASan build takes a while to load; a plain one answers within milliseconds."""

_sockets = itertools.count()


@functools.cache
def _build(asan: bool) -> Path:
    plain = nodeimage.build_keeper()
    if not asan:
        return plain
    res = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(nodeimage.KEEPER_SOURCE),
                          f"OUT={plain.parent}", "asan"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise nodeimage.KeeperBuildFailed(f"building the IMEX keeper's asan build failed:\n{res.stderr[-2000:]}")
    return plain.parent / "asan" / names.IMEX_KEEPER_BINARY


def program(asan: bool = False) -> Path:
    """The keeper's program, built once per session: the plain build the node image runs, or the
    AddressSanitizer + UBSan one (`make ... asan`) beside it."""
    return _build(asan)


def short_socket_path(workdir: Path) -> Path:
    """`<workdir>/keeper.sock` when that fits a unix socket path, else a short one in /tmp."""
    default = workdir / names.IMEX_KEEPER_SOCKET
    if len(str(default).encode()) <= names.MAX_UNIX_SOCKET_PATH:
        return default
    return Path(f"/tmp/nvlk-{os.getpid()}-{next(_sockets)}.sock")


class Keeper:
    """One run of the keeper's program. Its stderr (the log, text unless $LOG_FORMAT says json) goes
    to `log`."""

    def __init__(self, proc: subprocess.Popen[bytes], socket: Path, log: Path, workdir: Path) -> None:
        self.proc = proc
        self.socket = socket
        self.log = log
        self.workdir = workdir

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, workdir: Path, driver_root: Path, *, socket: Path | None = None, log: Path | None = None,
              program: Path | None = None, env: dict[str, str] | None = None) -> Keeper:
        """Start the keeper on `workdir` (its daemons: `<driver_root>/usr/bin/nvidia-imex`) and wait
        until it answers a Status."""
        socket = socket or short_socket_path(workdir)
        log = log or workdir.parent / f"{workdir.name}-keeper.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(program or _build(False)), "--workdir", str(workdir), "--driver-root", str(driver_root),
                "--socket", str(socket)]
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env={**os.environ, "LOG_FORMAT": "text", **(env or {})})
        keeper = cls(proc, socket, log, workdir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not keeper.answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                keeper.kill()
                raise AssertionError(f"the IMEX keeper did not serve on {socket} (exit {proc.returncode}); log:\n"
                                     f"{keeper.tail()}")
            time.sleep(0.01)
        return keeper

    def answers(self) -> bool:
        try:
            imexkeeper.call(self.socket, imexkeeper.Status(), timeout=2.0)
        except imex.ImexError:
            return False
        return True

    def call(self, req: imexkeeper.Ensure | imexkeeper.Stop | imexkeeper.Status) -> imexkeeper.Reply:
        """One request; `ImexError` with the keeper's message if it refuses."""
        return imexkeeper.call(self.socket, req)

    def status(self) -> list[imexkeeper.DomainState]:
        return self.call(imexkeeper.Status()).domains

    def raw(self, line: bytes, *, timeout: float = 15.0, half_close: bool = False) -> bytes:
        """Send `line` as it is; the reply line (b"" if the keeper closes without one)."""
        with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.socket))
            s.sendall(line)
            if half_close:
                s.shutdown(sockets.SHUT_WR)
            with s.makefile("rb") as f:
                return f.readline(1 << 22)

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, as the kubelet stops its pod (it stops every daemon first); the exit status, or
        None if it did not exit in time (then it is killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL, as an OOM kill would: the keeper is gone, its daemons run on."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        """Stop it if it still runs, and remove a socket file a killed one left."""
        self.terminate()
        if not str(self.socket).startswith(str(self.workdir)):
            with contextlib.suppress(OSError):
                self.socket.unlink()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
