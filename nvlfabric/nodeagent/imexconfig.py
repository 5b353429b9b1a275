"""The IMEX daemon's files, as every member of a domain must write them: the config, the nodes
file, the port slots and a TLS domain's credential paths (standard library only: the IMEX keeper
loads this module, see imexkeeper.py).

Files, per domain, under `<workdir>/<domain_id>/`: `config.cfg` (the real IMEX config keys),
`nodes.cfg` (one member address per line), `imex.log` (the daemon's stdout/stderr; the previous run's
is kept as `imex.log.1`) and `imex.pid`; a TLS domain's key, certificate and authorities under `tls/`.

Membership: every member must write the byte-identical nodes file (IMEX compares a hash of the map
and refuses peers whose map differs), so members are written in one canonical order whatever order
the caller learned them in: IPv4 addresses numerically, then IPv6, then host names
(`canonical_members`).

Ports: every member of a domain uses the same peer port (`SERVER_PORT`) and command port
(`IMEX_CMD_PORT`), and two domains on one node must not share them. `ports_for_slot(slot)` gives
slot 0 the IMEX defaults (50000/50005) and slot k the pair shifted by 10*k (k < 100). The clique-scoped
domain uses slot 0; a dedicated domain gets a slot allocated by the controller, unique among the live
dedicated domains of its clique and recorded on the ComputeDomain, so all members agree without
talking to each other and no node (a node is in exactly one clique) sees two domains on one slot.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_CMD_PORT",
    "DEFAULT_SERVER_PORT",
    "MAX_DOMAIN_SLOTS",
    "PORT_STRIDE",
    "TLS_CA",
    "TLS_CERT",
    "TLS_KEY",
    "DomainPorts",
    "ImexConfig",
    "WaitForQuorum",
    "canonical_members",
    "is_domain_id",
    "ports_for_slot",
    "render_nodes",
    "tls_fingerprint",
]

DEFAULT_SERVER_PORT = 50000
DEFAULT_CMD_PORT = 50005
PORT_STRIDE = 10
"""Slots are 10 ports apart: room for both ports of a slot (0 and +5) and none shared with a neighbour."""
MAX_DOMAIN_SLOTS = 100
"""Slots 0..99 keep every port below 51000."""

_DOMAIN_ID = re.compile(r"^[a-z0-9](?:[a-z0-9.\-]{0,61}[a-z0-9])?$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,252})$")


TLS_KEY = "tls/node.key"
TLS_CERT = "tls/node.crt"
TLS_CA = "tls/ca.crt"
"""A TLS domain's credentials, relative to its directory (written by the agent, nodeagent/imexauth.py)."""


def tls_fingerprint(domain_dir: Path) -> bytes:
    """A TLS domain's three credential files, as they are now (b"" while one is missing): what a
    daemon that loaded them runs with, so a difference means "SIGUSR1 to load the new ones". The
    contents themselves (a few KB), not a hash of them: exact, and hashlib would load OpenSSL's
    libcrypto into the keeper, +3.7 MB of its ~17 MB (docs/architecture.md "Scale")."""
    try:
        return b"\0".join((domain_dir / rel).read_bytes() for rel in (TLS_KEY, TLS_CERT, TLS_CA))
    except FileNotFoundError:
        return b""


def is_domain_id(value: str) -> bool:
    """A name `ImexDomain` accepts as a domain id (and so as a directory name under the work dir)."""
    return bool(_DOMAIN_ID.match(value))


@dataclass(frozen=True)
class DomainPorts:
    server: int
    cmd: int


def ports_for_slot(slot: int, *, base_server: int = DEFAULT_SERVER_PORT,
                   base_cmd: int = DEFAULT_CMD_PORT) -> DomainPorts:
    """The peer and command ports of port slot `slot` (0 = the IMEX defaults)."""
    if not 0 <= slot < MAX_DOMAIN_SLOTS:
        raise ValueError(f"IMEX port slot must be in 0..{MAX_DOMAIN_SLOTS - 1}, got {slot}")
    return DomainPorts(server=base_server + PORT_STRIDE * slot, cmd=base_cmd + PORT_STRIDE * slot)


class WaitForQuorum(enum.StrEnum):
    NONE = "NONE"
    RECOVERY = "RECOVERY"


_LIMITS: dict[str, tuple[int, int]] = {
    "LOG_LEVEL": (0, 5), "LOG_APPEND_TO_LOG": (0, 1), "DAEMONIZE": (0, 1), "SERVER_PORT": (1, 65535),
    "IMEX_ENABLE_AUTH_ENCRYPTION": (0, 1), "IMEX_CMD_ENABLED": (0, 1), "IMEX_CMD_PORT": (1, 65535),
    "IMEX_NODE_DISCONNECTED_GRACE_TIME": (-1, 2**31 - 1),
}


@dataclass(frozen=True)
class ImexConfig:
    """The IMEX config keys this agent sets (names as the daemon reads them; NVIDIA's IMEX guide).

    Keys not listed keep the daemon's defaults. Defaults here are the child-process settings NVIDIA's
    DRA driver uses: foreground, log to stderr (captured into imex.log), command service enabled.

    A dataclass checked in `__post_init__`, not a pydantic model: the IMEX keeper, one process on
    every node, loads this module, and pydantic costs a process 18 MB before its first model
    (docs/architecture.md, "Scale").
    """

    BIND_INTERFACE_IP: str
    IMEX_NODE_CONFIG_FILE: str
    IMEX_CMD_BIND_INTERFACE_IP: str
    LOG_LEVEL: int = 4
    LOG_FILE_NAME: str = ""
    LOG_APPEND_TO_LOG: int = 0
    DAEMONIZE: int = 0
    SERVER_PORT: int = DEFAULT_SERVER_PORT
    IMEX_WAIT_FOR_QUORUM: WaitForQuorum = WaitForQuorum.RECOVERY
    IMEX_ENABLE_AUTH_ENCRYPTION: int = 0
    IMEX_CMD_ENABLED: int = 1
    IMEX_CMD_PORT: int = DEFAULT_CMD_PORT
    IMEX_NODE_DISCONNECTED_GRACE_TIME: int = -1
    """Seconds a lost peer stays RECOVERING before its imports are cleaned up; -1 = wait forever."""
    IMEX_AUTH_ENCRYPTION_MODE: str = "SSL_TLS"
    IMEX_AUTH_SOURCE: str = "FILE"
    IMEX_SERVER_KEY: str = ""
    IMEX_SERVER_CERT: str = ""
    IMEX_SERVER_CERT_AUTH: str = ""
    IMEX_CLIENT_KEY: str = ""
    IMEX_CLIENT_CERT: str = ""
    IMEX_CLIENT_CERT_AUTH: str = ""
    IMEX_SECURITY_TARGET_OVERRIDE: str = ""
    """The TLS keys: written only with IMEX_ENABLE_AUTH_ENCRYPTION=1, so the config of a domain
    without authentication is byte for byte what earlier releases wrote (a changed config restarts
    the daemon)."""

    #: The order the keys are written in (the daemon reads them in any order).
    ORDER = ("LOG_LEVEL", "LOG_FILE_NAME", "LOG_APPEND_TO_LOG", "DAEMONIZE", "BIND_INTERFACE_IP", "SERVER_PORT",
             "IMEX_NODE_CONFIG_FILE", "IMEX_WAIT_FOR_QUORUM", "IMEX_ENABLE_AUTH_ENCRYPTION", "IMEX_CMD_ENABLED",
             "IMEX_CMD_BIND_INTERFACE_IP", "IMEX_CMD_PORT", "IMEX_NODE_DISCONNECTED_GRACE_TIME")
    AUTH_ORDER = ("IMEX_AUTH_ENCRYPTION_MODE", "IMEX_AUTH_SOURCE", "IMEX_SERVER_KEY", "IMEX_SERVER_CERT",
                  "IMEX_SERVER_CERT_AUTH", "IMEX_CLIENT_KEY", "IMEX_CLIENT_CERT", "IMEX_CLIENT_CERT_AUTH",
                  "IMEX_SECURITY_TARGET_OVERRIDE")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "IMEX_WAIT_FOR_QUORUM":
                try:
                    object.__setattr__(self, f.name, WaitForQuorum(value))
                except ValueError:
                    raise ValueError(f"{f.name}: {value!r} is not one of "
                                     f"{', '.join(m.value for m in WaitForQuorum)}") from None
            elif f.name in _LIMITS:
                low, high = _LIMITS[f.name]
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    raise ValueError(f"{f.name}: {value!r} is not a whole number in {low}..{high}")
            elif not isinstance(value, str):
                raise ValueError(f"{f.name}: {value!r} is not a string")
        if not self.IMEX_NODE_CONFIG_FILE:
            raise ValueError("IMEX_NODE_CONFIG_FILE: must not be empty")
        if self.IMEX_ENABLE_AUTH_ENCRYPTION:
            for key in self.AUTH_ORDER:
                if not getattr(self, key):
                    raise ValueError(f"{key}: must be set with IMEX_ENABLE_AUTH_ENCRYPTION=1")

    @classmethod
    def parse(cls, text: str) -> ImexConfig:
        """The keys of a config file this module rendered (comments and unknown keys ignored); a
        value out of its range is a ValueError naming the key."""
        values: dict[str, str | int] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            key = key.strip()
            if sep and not line.startswith("#") and (key in cls.ORDER or key in cls.AUTH_ORDER):
                # The file has no types: the numeric keys are those with limits.
                try:
                    values[key] = int(value) if key in _LIMITS else value.strip()
                except ValueError:
                    raise ValueError(f"{key}: {value.strip()!r} is not a whole number") from None
        try:
            return cls(**values)  # type: ignore[arg-type]
        except TypeError as exc:  # a required key missing
            raise ValueError(f"the config lacks a key: {exc}") from None

    def render(self, *, header: str = "") -> str:
        lines = [f"# {line}".rstrip() for line in header.splitlines()]
        for key in self.ORDER + (self.AUTH_ORDER if self.IMEX_ENABLE_AUTH_ENCRYPTION else ()):
            value = getattr(self, key)
            if "\n" in str(value) or "\r" in str(value):
                raise ValueError(f"{key}: value must be a single line")
            lines.append(f"{key}={value.value if isinstance(value, enum.Enum) else value}")
        return "\n".join(lines) + "\n"


def _member_key(entry: str) -> tuple[int, int, str]:
    try:
        addr = ipaddress.ip_address(entry)
    except ValueError:
        return (2, 0, entry)
    return (0 if addr.version == 4 else 1, int(addr), entry)


def canonical_members(members: Iterable[str]) -> list[str]:
    """Members in the order every node writes them; rejects duplicates and malformed entries."""
    seen: set[str] = set()
    for entry in members:
        try:
            ipaddress.ip_address(entry)
        except ValueError:
            if not _HOSTNAME.match(entry):
                raise ValueError(f"IMEX member {entry!r} is neither an IP address nor a host name") from None
        if entry in seen:
            raise ValueError(f"IMEX member {entry!r} is listed twice")
        seen.add(entry)
    return sorted(seen, key=_member_key)


def render_nodes(members: Iterable[str]) -> str:
    return "".join(f"{m}\n" for m in canonical_members(members))
