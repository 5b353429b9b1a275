"""The node's IMEX keeper, from the agent's side: its protocol, a handle on one of its domains, and
`python -m nvlfabric imex`, which replaces itself with the keeper's program.

An IMEX daemon restart invalidates every NVLink mapping imported through it, so the daemons must
not share the agent's lifetime: the agent is restarted by crashes, OOM kills and every DaemonSet
rolling update, and in a container its children die with it. The keeper is a small C program
(nvlfabric/nodeagent/keeper/, `nvlfabric-imex-keeper`, libc only: one runs on every node, ~1.8 MB
resident where a Python process took 16) with no API client, run by its own DaemonSet (`nvlfabric-imex`,
update strategy OnDelete) that shares the IMEX work directory with the agent
(`<kubelet root>/plugins/<driver>/imex`). The agent stays the brain: it decides which domains run
with which members and waits for READY itself (`nvidia-imex-ctl`); the keeper only writes a
domain's config and nodes file, starts, signals and stops daemons when asked, and says what runs.
At its own start it adopts the daemons a killed keeper left, so even a keeper restart (or an
upgrade from the Python keeper of release 0.1) restarts nothing.

The protocol: one JSON object per line over a unix socket in the work directory (`keeper.sock`),
one request and one reply per connection. `Ensure` makes a domain's daemon run with the given
ports and members (start it, SIGUSR1 on a membership or credentials change, restart on a changed
config); `Stop` stops it and removes its files; `Status` says what runs. Keepers of every release
speak it: the keeper's DaemonSet is OnDelete, so a node runs an older keeper under a newer agent
until the node is drained.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nvlfabric.api import names
from nvlfabric.nodeagent import imex, imexconfig

SOCKET_NAME = names.IMEX_KEEPER_SOCKET
CALL_TIMEOUT_S = 15.0
"""A stop waits up to the domain's stop timeout (5 s) for SIGTERM to work; other calls take ms."""
CTL_TIMEOUT_S = 5.0
"""How long one `nvidia-imex-ctl -q` may take."""


# The protocol's messages, read by hand (`_decode`) and strictly: a field of the wrong type or one
# this release does not know is an error naming it.


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
    """For Ensure: "started", "members changed", "credentials changed", or None (nothing to do)."""
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


def decode_reply(line: bytes) -> Reply:
    """A reply line; ValueError naming what is wrong with it."""
    reply: Reply = _decode(Reply, json.loads(line))
    return reply


def encode(message: Ensure | Stop | Status) -> bytes:
    raw = dataclasses.asdict(message)
    if isinstance(message, Ensure) and not message.tls_target:
        del raw["tls_target"]
    return json.dumps(raw, separators=(",", ":")).encode() + b"\n"


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


class KeeperDomain:
    """One IMEX domain of this node as the agent sees it: its files (the keeper writes them), its
    daemon's state (the keeper's, asked at each read), its readiness (`nvidia-imex-ctl -q`)."""

    def __init__(self, keeper_socket: Path, *, domain_id: str, workdir: Path, driver_root: Path,
                 bind_address: str, server_port: int = names.IMEX_SERVER_PORT,
                 cmd_port: int = names.IMEX_CMD_PORT, tls_target: str = "",
                 ctl_timeout: float = CTL_TIMEOUT_S, env: Mapping[str, str] | None = None) -> None:
        imexconfig.check_domain(domain_id, bind_address, server_port, cmd_port)
        self.keeper_socket = keeper_socket
        self.domain_id = domain_id
        self.bind_address = bind_address
        self.server_port = server_port
        self.cmd_port = cmd_port
        self.tls_target = tls_target
        self.dir = Path(workdir) / domain_id
        self.config_path = self.dir / "config.cfg"
        self.nodes_path = self.dir / "nodes.cfg"
        self.log_path = self.dir / "imex.log"
        self.ctl_binary = Path(driver_root) / "usr" / "bin" / "nvidia-imex-ctl"
        self.ctl_timeout = ctl_timeout
        self.env = None if env is None else {**os.environ, **env}
        self._state: DomainState | None = None

    def __repr__(self) -> str:
        return f"KeeperDomain({self.domain_id!r} on {self.bind_address} via {self.keeper_socket})"

    # -- what the keeper says -------------------------------------------------------------------

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
        """The daemon was started by an earlier keeper process and taken over by the running one
        (as of this handle's last read: `pid`, `poll`, `ready` or `run`)."""
        return bool(self._state and self._state.adopted)

    @property
    def members(self) -> list[str]:
        """The members the daemon runs with, as of this handle's last read (`pid`, `poll`, `ready`, `run`)."""
        return list(self._state.members) if self._state is not None else []

    def poll(self) -> int | None:
        """The exit status if the daemon died on its own (negative: killed by that signal; 255: an
        adopted one, whose status the keeper cannot know), else None (running, or not started)."""
        state = self._refresh()
        return state.exit if state is not None else None

    # -- what the agent asks -------------------------------------------------------------------

    def run(self, members: Sequence[str]) -> str | None:
        """Make the daemon run with these members: "started", "members changed" (SIGUSR1),
        "credentials changed" (SIGUSR1: a TLS domain's files changed), or None (it already does)."""
        ordered = imexconfig.canonical_members(members)
        if self.bind_address not in ordered:
            raise ValueError(f"IMEX domain {self.domain_id}: this node's address {self.bind_address} is not among "
                             f"the members {ordered}")
        reply = call(self.keeper_socket, Ensure(domain=self.domain_id, bind_address=self.bind_address,
                                                server_port=self.server_port, cmd_port=self.cmd_port,
                                                members=ordered, tls_target=self.tls_target))
        self._refresh()
        return reply.done

    def stop(self) -> int | None:
        """Stop the daemon and remove the domain's files (the keeper does both); its last status."""
        state = self._state
        call(self.keeper_socket, Stop(domain=self.domain_id))
        self._state = None
        return state.exit if state is not None else None

    # -- readiness -----------------------------------------------------------------------------

    def query(self) -> imex.QueryResult:
        return imex.query(self.ctl_binary, self.config_path, self.ctl_timeout, self.env)

    def ready(self) -> bool:
        """The daemon runs and answers exactly `READY\\n` with exit 0."""
        state = self._refresh()
        return state is not None and state.pid is not None and state.exit is None and self.query().ready

    def wait_ready(self, timeout: float, *, interval: float = 0.1,
                   clock: Callable[[], float] = time.monotonic) -> None:
        """Poll readiness until READY; ImexDaemonExited if the daemon dies, ImexNotReady after `timeout` s."""
        deadline = clock() + timeout
        while True:
            code = self.poll()
            if code is not None:
                raise imex.ImexDaemonExited(f"IMEX domain {self.domain_id} on {self.bind_address}: the daemon exited "
                                            f"with status {code} before it was READY; log {self.log_path}: "
                                            f"{self.log_tail()}", code)
            if self._state is None or self._state.pid is None:
                raise imex.ImexError(f"IMEX domain {self.domain_id}: wait_ready on a daemon that is not started")
            last = self.query()
            if last.ready:
                return
            if clock() >= deadline:
                raise imex.ImexNotReady(f"IMEX domain {self.domain_id} on {self.bind_address}: not READY after "
                                        f"{timeout:g} s; last query: {last.describe()}", last)
            time.sleep(interval)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"


# -- `python -m nvlfabric imex` -----------------------------------------------------------------


def keeper_program(env: Mapping[str, str]) -> str | None:
    """The keeper's program: `$NVLFABRIC_IMEX_KEEPER`, else `nvlfabric-imex-keeper` on the PATH."""
    if explicit := env.get(names.IMEX_KEEPER_BINARY_ENV):
        return explicit
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", names.IMEX_KEEPER_BINARY)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def main(argv: list[str] | None = None) -> int:
    """Replace this process with the keeper's program, same pid and arguments (`--help` lists them):
    the DaemonSets of every release say `imex`, and the node keeps one ~1.8 MB process, not a Python one."""
    args = sys.argv[1:] if argv is None else argv
    program = keeper_program(os.environ)
    if program is None:
        print(f"nvlfabric imex: the IMEX keeper's program {names.IMEX_KEEPER_BINARY} is not on the PATH; the node "
              f"image installs it at /usr/local/bin (deploy/Dockerfile builds it from nvlfabric/nodeagent/keeper "
              f"with make), or set ${names.IMEX_KEEPER_BINARY_ENV} to where it is", file=sys.stderr)
        return 2
    try:
        os.execv(program, [program, *args])
    except OSError as exc:
        print(f"nvlfabric imex: cannot run the IMEX keeper's program {program} ({exc.strerror or exc}); "
              f"${names.IMEX_KEEPER_BINARY_ENV} or the PATH names it", file=sys.stderr)
        return 2
    return 0  # not reached: execv returns only by raising
