"""The node's IMEX keeper: the process that owns this node's IMEX daemons, apart from the agent.

An IMEX daemon restart invalidates every NVLink mapping imported through it, so the daemons must
not share the agent's lifetime: the agent is restarted by crashes, OOM kills and every DaemonSet
rolling update, and in a container its children die with it. The keeper is a small process with
no API client, no gRPC and no pydantic (the standard library alone), run by its own DaemonSet
(`nvlfabric-imex`, update strategy OnDelete) that shares the IMEX work directory with the agent
(`<kubelet root>/plugins/<driver>/imex`). The agent stays the brain: it decides which domains run
with which members and waits for READY itself (`nvidia-imex-ctl`); the keeper only starts, signals
and stops daemons when asked, and says what runs. At its own start it adopts the daemons a killed
keeper left (`imex.adopt_all`), so even a keeper restart restarts nothing where daemons outlive it.

The protocol: one JSON object per line over a unix socket in the work directory (`keeper.sock`),
one request and one reply per connection. `Ensure` makes a domain's daemon run with the given
ports and members (start it, SIGUSR1 on a membership change, restart on a changed config: what
`ImexDomain.run` does); `Stop` stops it and removes its files; `Status` says what runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import socket
import socketserver
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nvlfabric.api import names
from nvlfabric.daemon import process
from nvlfabric.daemon.process import SettingsError
from nvlfabric.nodeagent import files, imex, imexconfig

log = logging.getLogger("nvlfabric.imexkeeper")

SOCKET_NAME = names.IMEX_KEEPER_SOCKET
CALL_TIMEOUT_S = 15.0
"""A stop waits up to the domain's stop timeout (5 s) for SIGTERM to work; other calls take ms."""
WATCH_S = 1.0
"""How often the keeper looks for daemons that exited on their own (to say so in its log)."""


# The protocol's messages are frozen dataclasses read by hand (`_decode`), not pydantic models:
# this process runs on every node, and pydantic costs a process 18 MB before its first model
# (docs/architecture.md, "Scale"). Four small messages do not need it.


@dataclass(frozen=True)
class Ensure:
    domain: str
    bind_address: str
    server_port: int
    cmd_port: int
    members: list[str]
    op: Literal["ensure"] = "ensure"
    tls_target: str = ""
    """A TLS domain's IMEX_SECURITY_TARGET_OVERRIDE (its credentials are the files under its tls/);
    left out of the message when empty, so a keeper of an earlier release (update strategy
    OnDelete: it outlives agent upgrades) still reads every other Ensure."""


@dataclass(frozen=True)
class Stop:
    domain: str
    op: Literal["stop"] = "stop"


@dataclass(frozen=True)
class Status:
    op: Literal["status"] = "status"


@dataclass(frozen=True)
class DomainState:
    domain: str
    pid: int | None
    exit: int | None
    """The exit status of a daemon that died on its own (255: an adopted one, status unknown)."""
    members: list[str]
    server_port: int
    adopted: bool


@dataclass(frozen=True)
class Reply:
    ok: bool = True
    error: str = ""
    done: str | None = None
    """For Ensure: "started", "members changed", or None (nothing to do)."""
    domains: list[DomainState] = field(default_factory=list)


_KINDS: dict[str, Any] = {"str": str, "int": int, "bool": bool, "int | None": (int, type(None)),
                          "str | None": (str, type(None))}


def _decode(cls: Any, raw: Any) -> Any:
    """`cls` from a JSON object, each field of its declared type (extra keys refused): what a
    strict model would check, named by field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{cls.__name__}: not a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if unknown := raw.keys() - fields.keys():
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}.{name}: missing")
            continue
        value, kind = raw[name], str(f.type)
        if kind == "list[str]":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif kind == "list[DomainState]":
            value = [_decode(DomainState, v) for v in value] if isinstance(value, list) else value
            ok = isinstance(value, list)
        elif kind.startswith("Literal["):
            ok = value == f.default
        else:
            types = _KINDS[kind]
            ok = isinstance(value, types) and not (isinstance(value, bool) and types in (int, (int, type(None))))
        if not ok:
            raise ValueError(f"{cls.__name__}.{name}: {value!r} is not a {kind}")
        values[name] = value
    return cls(**values)


def decode_request(line: bytes) -> Ensure | Stop | Status:
    """A request line; ValueError naming what is wrong with it."""
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    kind = {"ensure": Ensure, "stop": Stop, "status": Status}.get(str(raw.get("op")) if isinstance(raw, dict) else "")
    if kind is None:
        raise ValueError("op: must be one of ensure, stop, status")
    result: Ensure | Stop | Status = _decode(kind, raw)
    return result


def decode_reply(line: bytes) -> Reply:
    """A reply line; ValueError naming what is wrong with it."""
    reply: Reply = _decode(Reply, json.loads(line))
    return reply


def encode(message: Any) -> bytes:
    raw = dataclasses.asdict(message)
    if isinstance(message, Ensure) and not message.tls_target:
        del raw["tls_target"]
    return json.dumps(raw, separators=(",", ":")).encode() + b"\n"


# -- the keeper ---------------------------------------------------------------------------------


class Keeper:
    """Every IMEX daemon of this node, behind one lock (ImexDomain is not thread-safe)."""

    def __init__(self, workdir: Path, driver_root: Path) -> None:
        self.workdir = workdir
        self.driver_root = driver_root
        self.lock = threading.Lock()
        workdir.mkdir(parents=True, exist_ok=True)
        imex.clean_workdir(workdir)
        self.domains, stopped = imex.adopt_all(workdir, driver_root)
        self._reported: set[tuple[str, int]] = set()
        for d in self.domains.values():
            log.info("IMEX domain %s: adopted the running daemon (pid %s, members %s)", d.domain_id, d.pid,
                     ", ".join(d.members))
        if stopped:
            log.warning("stopped %d IMEX daemon(s) whose domain could not be adopted (pids %s)", len(stopped),
                        ", ".join(map(str, stopped)))

    def handle(self, req: Ensure | Stop | Status) -> Reply:
        with self.lock:
            if isinstance(req, Ensure):
                return Reply(done=self._ensure(req))
            if isinstance(req, Stop):
                self._stop(req.domain)
                return Reply()
            return Reply(domains=[self._state(d) for d in sorted(self.domains.values(), key=lambda d: d.domain_id)])

    def _ensure(self, req: Ensure) -> str | None:
        d = self.domains.get(req.domain)
        if d is not None and (d.config.SERVER_PORT, d.config.IMEX_CMD_PORT, d.bind_address, d.tls_target) != (
                req.server_port, req.cmd_port, req.bind_address, req.tls_target):
            log.info("IMEX domain %s: ports, address or authentication changed, restarting it", req.domain)
            d.stop()
            d = None
        new = d is None
        if d is None:
            d = imex.ImexDomain(domain_id=req.domain, workdir=self.workdir, driver_root=self.driver_root,
                                bind_address=req.bind_address, server_port=req.server_port, cmd_port=req.cmd_port,
                                tls_target=req.tls_target)
        before = d.poll()
        try:
            done = d.run(req.members)
        except (imex.ImexError, OSError, ValueError):
            if new and d.pid is None:
                d.stop()  # nothing of it runs: it is not kept as a domain of this node
            else:
                self.domains[req.domain] = d
            raise
        self.domains[req.domain] = d
        if done == "started":
            log.info("IMEX domain %s: started the daemon (pid %s%s), members %s", req.domain, d.pid,
                     f", the last one exited with {before}" if before is not None else "", ", ".join(d.members))
        elif done == "credentials changed":
            log.info("IMEX domain %s: new credentials (SIGUSR1 to pid %s)", req.domain, d.pid)
        elif done:
            log.info("IMEX domain %s: members now %s (SIGUSR1 to pid %s)", req.domain, ", ".join(d.members), d.pid)
        return done

    def _stop(self, domain_id: str) -> None:
        d = self.domains.pop(domain_id, None)
        if d is not None:
            code = d.stop()
            log.info("IMEX domain %s: stopped the daemon (status %s)", domain_id, code)
        elif (self.workdir / domain_id / "config.cfg").exists():
            # Not known here, yet it may run: a keeper killed between spawning and recording it.
            with contextlib.suppress(ValueError):
                imex.ImexDomain(domain_id=domain_id, workdir=self.workdir, driver_root=self.driver_root,
                                bind_address="127.0.0.1")._kill_stale()
        if imexconfig.is_domain_id(domain_id):
            files.remove_tree(self.workdir / domain_id)

    def _state(self, d: imex.ImexDomain) -> DomainState:
        return DomainState(domain=d.domain_id, pid=d.pid, exit=d.poll(), members=d.members,
                           server_port=d.config.SERVER_PORT, adopted=d.adopted)

    def watch(self) -> None:
        """Say once in the log when a daemon exits on its own (the agent restarts it)."""
        with self.lock:
            for d in self.domains.values():
                code, pid = d.poll(), d.pid
                if code is not None and pid is not None and (d.domain_id, pid) not in self._reported:
                    self._reported.add((d.domain_id, pid))
                    log.warning("IMEX domain %s: the daemon (pid %s) exited with status %s; log: %s",
                                d.domain_id, pid, code, d.log_tail())

    def stop_all(self) -> None:
        with self.lock:
            for domain_id in sorted(self.domains):
                self._stop_daemon_only(domain_id)

    def _stop_daemon_only(self, domain_id: str) -> None:
        d = self.domains.pop(domain_id)
        log.info("IMEX domain %s: stopping the daemon (pid %s): the keeper stops", domain_id, d.pid)
        d.stop()


class _Handler(socketserver.StreamRequestHandler):
    server: Server

    def handle(self) -> None:
        line = self.rfile.readline(1 << 20)
        try:
            request = decode_request(line)
        except ValueError as exc:
            self.wfile.write(encode(Reply(ok=False, error=f"bad request: {exc}")))
            return
        try:
            reply = self.server.keeper.handle(request)
        except (imex.ImexError, OSError, ValueError) as exc:
            reply = Reply(ok=False, error=str(exc))
        except Exception as exc:  # one bad call must not end the keeper: it holds every daemon
            log.exception("internal error")
            reply = Reply(ok=False, error=f"internal error: {type(exc).__name__}: {exc}")
        self.wfile.write(encode(reply))


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, keeper: Keeper) -> None:
        self.keeper = keeper
        self.path = path
        super().__init__(str(path), _Handler)

    def close(self) -> None:
        """Stop serving and remove the socket file (the daemons run on)."""
        self.shutdown()
        self.server_close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def serve(keeper: Keeper, path: Path) -> Server:
    """Listen on `path` (replacing a socket file a killed keeper left) in a background thread."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = Server(path, keeper)
    threading.Thread(target=server.serve_forever, name="imex-keeper", daemon=True).start()
    return server


# -- the agent's side ---------------------------------------------------------------------------


class KeeperUnavailable(imex.ImexError):
    pass


def call(path: Path, req: Ensure | Stop | Status, *, timeout: float = CALL_TIMEOUT_S) -> Reply:
    """One request to the keeper at `path`; `KeeperUnavailable` if it does not answer, `ImexError`
    with its message if it refuses."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(encode(req))
            with s.makefile("rb") as f:
                line = f.readline(1 << 22)
    except OSError as exc:
        raise KeeperUnavailable(f"the IMEX keeper at {path} does not answer ({exc.strerror or exc}); is the "
                                "nvlfabric-imex DaemonSet's pod running on this node?") from exc
    try:
        reply = decode_reply(line)
    except ValueError as exc:
        raise KeeperUnavailable(f"the IMEX keeper at {path} answered {line[:200]!r}: not a reply") from exc
    if not reply.ok:
        raise imex.ImexError(f"the IMEX keeper refused: {reply.error}")
    return reply


class KeeperDomain(imex.ImexDomain):
    """An IMEX domain as the agent sees it: the same files and readiness query as `ImexDomain`, its
    daemon run by the keeper."""

    def __init__(self, keeper_socket: Path, *, domain_id: str, workdir: Path, driver_root: Path,
                 bind_address: str, server_port: int, cmd_port: int, tls_target: str = "") -> None:
        super().__init__(domain_id=domain_id, workdir=workdir, driver_root=driver_root, bind_address=bind_address,
                         server_port=server_port, cmd_port=cmd_port, tls_target=tls_target)
        self.keeper_socket = keeper_socket
        self._state: DomainState | None = None

    def __repr__(self) -> str:
        return f"KeeperDomain({self.domain_id!r} on {self.bind_address} via {self.keeper_socket})"

    def _refresh(self) -> DomainState | None:
        reply = call(self.keeper_socket, Status())
        self._state = next((d for d in reply.domains if d.domain == self.domain_id), None)
        return self._state

    @property
    def pid(self) -> int | None:
        state = self._refresh()
        return state.pid if state is not None else None

    @property
    def adopted(self) -> bool:
        return bool(self._state and self._state.adopted)

    @property
    def members(self) -> list[str]:
        return list(self._state.members) if self._state is not None else []

    def poll(self) -> int | None:
        state = self._refresh()
        return state.exit if state is not None else None

    def run(self, members: Sequence[str]) -> str | None:
        ordered = self._canonical(members)
        reply = call(self.keeper_socket, Ensure(domain=self.domain_id, bind_address=self.bind_address,
                                                server_port=self.config.SERVER_PORT,
                                                cmd_port=self.config.IMEX_CMD_PORT, members=ordered,
                                                tls_target=self.tls_target))
        self._refresh()
        return reply.done

    def ensure_running(self, members: Sequence[str]) -> None:
        self.run(members)

    def update_members(self, members: Sequence[str]) -> bool:
        return self.run(members) == "members changed"

    def restart(self) -> None:
        raise imex.ImexError("restart goes through the keeper: stop, then run")

    def stop(self) -> int | None:
        state = self._state
        call(self.keeper_socket, Stop(domain=self.domain_id))
        self._state = None
        return state.exit if state is not None else None


# -- `python -m nvlfabric imex` -----------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    workdir: Path
    """The IMEX work directory the agent shares (`<kubelet root>/plugins/<driver>/imex`)."""
    driver_root: Path
    log_format: process.LogFormat

    @property
    def socket(self) -> Path:
        return self.workdir / SOCKET_NAME


def default_workdir(kubelet_root: Path) -> Path:
    return Path(names.imex_workdir(str(kubelet_root)))


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    ap = argparse.ArgumentParser(prog="python -m nvlfabric imex",
                                 description="The nvlfabric IMEX keeper: runs this node's IMEX daemons.")
    ap.add_argument("--kubelet-root", default=env.get("KUBELET_ROOT", "/var/lib/kubelet"), help="($KUBELET_ROOT)")
    ap.add_argument("--driver-root", default=env.get("DRIVER_ROOT", "/run/nvidia/driver"),
                    help="where nvidia-imex is ($DRIVER_ROOT)")
    ap.add_argument("--log-format", default=env.get("LOG_FORMAT", "json"), choices=["json", "text"],
                    help="($LOG_FORMAT)")
    a = ap.parse_args(list(argv))
    workdir = default_workdir(Path(a.kubelet_root))
    if len(str(workdir / SOCKET_NAME).encode()) > names.MAX_UNIX_SOCKET_PATH:
        raise SettingsError(f"--kubelet-root / $KUBELET_ROOT: the keeper's socket {workdir / SOCKET_NAME} is longer "
                            f"than a unix socket path may be ({names.MAX_UNIX_SOCKET_PATH} bytes); use a shorter "
                            "kubelet root")
    return Settings(workdir=workdir, driver_root=Path(a.driver_root), log_format=a.log_format)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse(sys.argv[1:] if argv is None else argv)
    except SettingsError as exc:
        print(f"nvlfabric imex: {exc}", file=sys.stderr)
        return 2
    process.setup_logging(cfg.log_format)
    stop = process.stop_on_signals()
    keeper = Keeper(cfg.workdir, cfg.driver_root)
    server = serve(keeper, cfg.socket)
    log.info("IMEX keeper serving on %s (%d daemon(s) adopted)", cfg.socket, len(keeper.domains))
    try:
        while not stop.wait(WATCH_S):
            keeper.watch()
    finally:
        server.close()
        keeper.stop_all()
    return 0

