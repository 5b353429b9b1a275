"""Supervision of one IMEX daemon per IMEX domain: start, follow its members, stop, adopt, READY.

`ImexDomain` runs `nvidia-imex -c <config>` as a foreground child (`DAEMONIZE=0`, as NVIDIA's DRA
driver does) of the process that holds it, one per IMEX domain this node is a member of: in
clique-scoped mode (the default) one domain per NVLink clique, so normally one per node; in dedicated
mode one per ComputeDomain placed here. The files it writes and their formats are imexconfig.py's.

Who holds it: the node's IMEX keeper (`imexkeeper.py`, its own DaemonSet), never the agent process,
so an agent crash, OOM kill or upgrade leaves every daemon and its imported NVLink mappings alone.
The agent drives the keeper's daemons through `imexkeeper.KeeperDomain` (this class's files and
readiness query, the keeper's processes); only tests hold an `ImexDomain` directly. A keeper that
starts where daemons of an earlier keeper still run (host processes, a shared pid namespace) adopts
each of them instead of restarting it (`adopt_all`): the daemon runs from the files this module
wrote, so the files say what it runs with.

On a membership change the nodes file is rewritten atomically and the daemon gets SIGUSR1 (re-read
the peer mapping and reconnect, no restart). Caveat: the real daemon reportedly re-reads only the
name->address mapping on SIGUSR1 and the nodes file only at start (dra-driver #1245); a caller facing
such a daemon uses DNS-name entries that stay fixed, or `restart()`. The config is read only at
start, so a changed config restarts the daemon. Before starting, `ImexDomain` checks the ports are
free on its address and says which one is taken.

Not thread-safe: the caller serialises calls per domain.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvlfabric.nodeagent import files
from nvlfabric.nodeagent.imexconfig import (
    DEFAULT_CMD_PORT,
    DEFAULT_SERVER_PORT,
    TLS_CA,
    TLS_CERT,
    TLS_KEY,
    ImexConfig,
    WaitForQuorum,
    canonical_members,
    is_domain_id,
    render_nodes,
    tls_fingerprint,
)

__all__ = ["ImexDaemonExited", "ImexDomain", "ImexError", "ImexNotReady", "PortInUse", "QueryResult", "adopt_all",
           "clean_workdir", "daemons_using"]


class ImexError(Exception):
    """Base of this module's errors."""


class PortInUse(ImexError):
    pass


class ImexDaemonExited(ImexError):
    def __init__(self, message: str, returncode: int) -> None:
        self.returncode = returncode
        super().__init__(message)


class ImexNotReady(ImexError):
    def __init__(self, message: str, last: QueryResult | None) -> None:
        self.last = last
        super().__init__(message)


@dataclass(frozen=True)
class QueryResult:
    """One `nvidia-imex-ctl -q`: READY only when the output is exactly `READY\\n` and the exit is 0."""

    returncode: int | None
    """None when the ctl timed out or could not be run."""
    stdout: str
    stderr: str

    @property
    def ready(self) -> bool:
        return self.returncode == 0 and self.stdout == "READY\n"

    def describe(self) -> str:
        if self.returncode is None:
            return f"no answer ({self.stderr.strip()})"
        text = self.stdout.strip() or "(no output)"
        extra = f", {self.stderr.strip().splitlines()[-1]}" if self.stderr.strip() else ""
        return f"{text} (exit {self.returncode}{extra})"


def _atomic_write(path: Path, text: str) -> bool:
    """Write `text` to `path` atomically unless it already holds exactly that; True if written."""
    data = text.encode()
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes() == data:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    files.atomic_write(path, data)
    return True


def _check_port_free(address: str, port: int, what: str) -> None:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon: TIME_WAIT is no conflict
        try:
            probe.bind((address, port))
        except OSError as exc:
            raise PortInUse(f"{what} {address}:{port} is not free ({exc.strerror}); another IMEX domain on this "
                            f"node uses the same port slot, or another program holds the port") from exc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie that init has not reaped yet is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def daemons_using(config_path: str | os.PathLike[str]) -> list[int]:
    """Live `nvidia-imex` processes whose command line names `config_path` as their config (`-c <path>`)."""
    wanted = str(config_path).encode()
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (os.path.basename(argv[0]) == b"nvidia-imex" and _pid_alive(int(entry.name))
                    and any(a == b"-c" and b == wanted for a, b in itertools.pairwise(argv))):
                found.append(int(entry.name))
    return found


def _terminate(pids: Iterable[int], timeout: float) -> None:
    """SIGTERM, and SIGKILL whatever is still alive after `timeout` s."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def clean_workdir(workdir: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files of interrupted writes under the domains' directories; returns them.

    Running daemons are left alone: they serve prepared claims (see `adopt_all`).
    """
    root = Path(workdir)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for tmp in d.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def adopt_all(workdir: str | os.PathLike[str], driver_root: str | os.PathLike[str], *,
              stop_timeout: float = 5.0) -> tuple[dict[str, ImexDomain], list[int]]:
    """At keeper start: take over the daemons an earlier keeper process left running.

    A domain directory with exactly one live daemon of its config, and a config file this module
    can read, becomes an `ImexDomain` holding that daemon (no restart: its NVLink imports survive).
    Anything else that runs (two daemons of one config, a config that does not parse) is stopped,
    since it would hold the domain's ports and nobody could say what it runs with. Returns (the
    adopted domains by id, the pids stopped).
    """
    root = Path(workdir)
    adopted: dict[str, ImexDomain] = {}
    stopped: list[int] = []
    if not root.is_dir():
        return adopted, stopped
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        pids = daemons_using(d / "config.cfg")
        if not pids:
            (d / "imex.pid").unlink(missing_ok=True)
            continue
        domain: ImexDomain | None = None
        if len(pids) == 1 and is_domain_id(d.name):
            try:
                cfg = ImexConfig.parse((d / "config.cfg").read_text())
                members = canonical_members((d / "nodes.cfg").read_text().split())
                domain = ImexDomain(domain_id=d.name, workdir=root, driver_root=driver_root,
                                    bind_address=cfg.BIND_INTERFACE_IP, server_port=cfg.SERVER_PORT,
                                    cmd_port=cfg.IMEX_CMD_PORT, log_level=cfg.LOG_LEVEL,
                                    grace_time=cfg.IMEX_NODE_DISCONNECTED_GRACE_TIME,
                                    wait_for_quorum=cfg.IMEX_WAIT_FOR_QUORUM, stop_timeout=stop_timeout,
                                    tls_target=cfg.IMEX_SECURITY_TARGET_OVERRIDE
                                    if cfg.IMEX_ENABLE_AUTH_ENCRYPTION else "")
                domain._adopt(pids[0], members)
            except (OSError, ValueError):
                domain = None
        if domain is None:
            _terminate(pids, stop_timeout)
            stopped += pids
            (d / "imex.pid").unlink(missing_ok=True)
        else:
            adopted[d.name] = domain
    return adopted, stopped


class ImexDomain:
    """This node's IMEX daemon for domain `domain_id`, a child of the process holding this object (the keeper)."""

    def __init__(
        self,
        *,
        domain_id: str,
        workdir: str | os.PathLike[str],
        driver_root: str | os.PathLike[str],
        bind_address: str,
        cmd_port: int = DEFAULT_CMD_PORT,
        server_port: int = DEFAULT_SERVER_PORT,
        imex_binary: str | os.PathLike[str] | None = None,
        ctl_binary: str | os.PathLike[str] | None = None,
        log_level: int = 4,
        grace_time: int = -1,
        wait_for_quorum: WaitForQuorum = WaitForQuorum.RECOVERY,
        ctl_timeout: float = 5.0,
        stop_timeout: float = 5.0,
        env: Mapping[str, str] | None = None,
        tls_target: str = "",
    ) -> None:
        if not is_domain_id(domain_id):
            raise ValueError(f"IMEX domain id {domain_id!r} must be a DNS label-like name (a-z, 0-9, '-', '.')")
        ipaddress.ip_address(bind_address)  # raises ValueError for a malformed address
        if cmd_port == server_port:
            raise ValueError(f"IMEX command and peer ports must differ, both are {cmd_port}")
        self.domain_id = domain_id
        self.bind_address = bind_address
        self.dir = Path(workdir) / domain_id
        self.config_path = self.dir / "config.cfg"
        self.nodes_path = self.dir / "nodes.cfg"
        self.log_path = self.dir / "imex.log"
        self.pid_path = self.dir / "imex.pid"
        root = Path(driver_root)
        self.imex_binary = Path(imex_binary) if imex_binary else root / "usr" / "bin" / "nvidia-imex"
        self.ctl_binary = Path(ctl_binary) if ctl_binary else root / "usr" / "bin" / "nvidia-imex-ctl"
        # With a TLS target the daemon authenticates its peers: its key and certificate serve both
        # sides of a link, and it trusts the domain's authority only.
        tls = {"IMEX_ENABLE_AUTH_ENCRYPTION": 1, "IMEX_SECURITY_TARGET_OVERRIDE": tls_target,
               "IMEX_SERVER_KEY": str(self.dir / TLS_KEY), "IMEX_SERVER_CERT": str(self.dir / TLS_CERT),
               "IMEX_SERVER_CERT_AUTH": str(self.dir / TLS_CA), "IMEX_CLIENT_KEY": str(self.dir / TLS_KEY),
               "IMEX_CLIENT_CERT": str(self.dir / TLS_CERT), "IMEX_CLIENT_CERT_AUTH": str(self.dir / TLS_CA),
               } if tls_target else {}
        self.config = ImexConfig(
            LOG_LEVEL=log_level, BIND_INTERFACE_IP=bind_address, SERVER_PORT=server_port,
            IMEX_NODE_CONFIG_FILE=str(self.nodes_path), IMEX_WAIT_FOR_QUORUM=wait_for_quorum,
            IMEX_CMD_BIND_INTERFACE_IP=bind_address, IMEX_CMD_PORT=cmd_port,
            IMEX_NODE_DISCONNECTED_GRACE_TIME=grace_time, **tls,  # type: ignore[arg-type]
        )
        self.tls_target = tls_target
        self._tls_loaded = b""
        """The credential files' fingerprint when the daemon last loaded them (start or SIGUSR1)."""
        self.ctl_timeout = ctl_timeout
        self.stop_timeout = stop_timeout
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._adopted: int | None = None
        """The pid of a daemon an earlier keeper started (not our child: no exit status to wait for)."""
        self._members: list[str] | None = None

    def __repr__(self) -> str:
        return f"ImexDomain({self.domain_id!r} on {self.bind_address}, pid {self.pid})"

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return self._adopted

    @property
    def adopted(self) -> bool:
        """The daemon was started by an earlier keeper process and taken over by this one."""
        return self._adopted is not None

    def _adopt(self, pid: int, members: list[str]) -> None:
        self._proc, self._adopted, self._members = None, pid, members
        self._tls_loaded = tls_fingerprint(self.dir) if self.tls_target else b""
        _atomic_write(self.pid_path, f"{pid}\n")

    def _running(self) -> bool:
        return self.poll() is None and self.pid is not None

    def _signal(self, sig: int) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    @property
    def members(self) -> list[str]:
        return list(self._members or [])

    def _canonical(self, members: Sequence[str]) -> list[str]:
        ordered = canonical_members(members)
        if self.bind_address not in ordered:
            raise ValueError(f"IMEX domain {self.domain_id}: this node's address {self.bind_address} is not among "
                             f"the members {ordered}")
        return ordered

    # -- lifecycle ------------------------------------------------------------------------------

    def ensure_running(self, members: Sequence[str]) -> None:
        """Make the daemon run with these members: start it, or SIGUSR1 it / restart it on changes.

        Returns once the process is spawned; `wait_ready` waits for READY. After a crash (`poll()` not
        None) this starts a new daemon.
        """
        ordered = self._canonical(members)
        config_changed = _atomic_write(self.config_path, self.config.render(
            header=f"nvlfabric node agent: IMEX domain {self.domain_id}; written by the agent, do not edit"))
        nodes_changed = _atomic_write(self.nodes_path, render_nodes(ordered))
        self._members = ordered
        if self._running():
            if config_changed:
                self.restart()
            elif nodes_changed:
                self._signal(signal.SIGUSR1)
            return
        self._start()

    def run(self, members: Sequence[str]) -> str | None:
        """Start the daemon if it is not running, else follow the members (SIGUSR1 on a change);
        says which ("started", "members changed") or None."""
        if not self._running():
            self.ensure_running(members)
            return "started"
        if self.update_members(members):
            return "members changed"
        return "credentials changed" if self.reload_credentials() else None

    def reload_credentials(self) -> bool:
        """SIGUSR1 a running TLS daemon whose credential files changed since it loaded them: it
        takes them for new links and keeps its established ones (renewal under running pods)."""
        if not self.tls_target or not self._running():
            return False
        now = tls_fingerprint(self.dir)
        if not now or now == self._tls_loaded:
            return False
        self._signal(signal.SIGUSR1)
        self._tls_loaded = now
        return True

    def update_members(self, members: Sequence[str]) -> bool:
        """Rewrite the nodes file atomically and, if it changed and the daemon runs, send SIGUSR1.

        Returns whether the membership changed. A stopped daemon picks the file up at its next start.
        """
        ordered = self._canonical(members)
        changed = _atomic_write(self.nodes_path, render_nodes(ordered))
        self._members = ordered
        if changed and self._running():
            self._signal(signal.SIGUSR1)
        return changed

    def restart(self) -> None:
        if self._members is None:
            raise ImexError(f"IMEX domain {self.domain_id}: restart before ensure_running")
        self.stop()
        self._start()

    def _start(self) -> None:
        if not os.access(self.imex_binary, os.X_OK):
            raise ImexError(f"IMEX domain {self.domain_id}: {self.imex_binary} is missing or not executable")
        self._reap()
        self._kill_stale()
        _check_port_free(self.bind_address, self.config.SERVER_PORT, "IMEX peer port (SERVER_PORT)")
        _check_port_free(self.bind_address, self.config.IMEX_CMD_PORT, "IMEX command port (IMEX_CMD_PORT)")
        if self.log_path.exists():
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
        self._tls_loaded = tls_fingerprint(self.dir) if self.tls_target else b""
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [str(self.imex_binary), "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env}, start_new_session=True, close_fds=True,
            )
        _atomic_write(self.pid_path, f"{self._proc.pid}\n")

    def _kill_stale(self) -> None:
        """A daemon of this domain nobody here holds (a keeper killed between spawning it and
        recording it) would hold the ports; found by its command line (`-c <this config>`), not
        through the pid file, which such a kill leaves unwritten."""
        own = self.pid
        _terminate([pid for pid in daemons_using(self.config_path) if pid != own], self.stop_timeout)
        self.pid_path.unlink(missing_ok=True)

    def _reap(self) -> None:
        if self.poll() is not None:
            self._proc = self._adopted = None

    def poll(self) -> int | None:
        """The exit status if the daemon died on its own (negative: killed by that signal), else None.

        None also when it was never started or was stopped with `stop()`. The caller decides whether
        to restart (`ensure_running`) and how to report it; the log is in `log_path`. An adopted
        daemon is not our child, so its status is unknown: 255 once it is gone.
        """
        if self._proc is not None:
            return self._proc.poll()
        if self._adopted is not None and not _pid_alive(self._adopted):
            return 255
        return None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after `stop_timeout`; waits for the process. Returns its exit status."""
        proc, self._proc = self._proc, None
        adopted, self._adopted = self._adopted, None
        code: int | None = None
        if adopted is not None:  # not our child: no status to collect
            _terminate([adopted], self.stop_timeout)
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            code = proc.returncode
        self.pid_path.unlink(missing_ok=True)
        return code

    # -- readiness ------------------------------------------------------------------------------

    def query(self) -> QueryResult:
        """`nvidia-imex-ctl -c <config> -q` against this node's daemon, bounded by `ctl_timeout`."""
        argv = [str(self.ctl_binary), "-c", str(self.config_path), "-q"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.ctl_timeout, check=False,
                                  stdin=subprocess.DEVNULL, env={**os.environ, **self.env})
        except subprocess.TimeoutExpired:
            return QueryResult(None, "", f"{self.ctl_binary} -q timed out after {self.ctl_timeout} s")
        except OSError as exc:
            return QueryResult(None, "", f"running {self.ctl_binary}: {exc}")
        return QueryResult(proc.returncode, proc.stdout, proc.stderr)

    def ready(self) -> bool:
        """The daemon runs and answers exactly `READY\\n` with exit 0."""
        if not self._running():
            return False
        return self.query().ready

    def wait_ready(self, timeout: float, *, interval: float = 0.1,
                   clock: Callable[[], float] = time.monotonic) -> None:
        """Poll readiness until READY; ImexDaemonExited if the daemon dies, ImexNotReady after `timeout` s."""
        deadline = clock() + timeout
        last: QueryResult | None = None
        while True:
            code = self.poll()
            if code is not None:
                raise ImexDaemonExited(f"IMEX domain {self.domain_id} on {self.bind_address}: the daemon exited "
                                       f"with status {code} before it was READY; log {self.log_path}: "
                                       f"{self.log_tail()}", code)
            if self.pid is None:
                raise ImexError(f"IMEX domain {self.domain_id}: wait_ready on a daemon that is not started")
            last = self.query()
            if last.ready:
                return
            if clock() >= deadline:
                raise ImexNotReady(f"IMEX domain {self.domain_id} on {self.bind_address}: not READY after "
                                   f"{timeout:g} s; last query: {last.describe()}", last)
            time.sleep(interval)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"
