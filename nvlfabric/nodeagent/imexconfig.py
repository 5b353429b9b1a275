"""The IMEX domains' shared facts: port slots, member order, domain ids, a TLS domain's credential
paths. The files themselves (config.cfg, nodes.cfg) are the keeper's to write
(nvlfabric/nodeagent/keeper/imexconfig.c, members.c); the agent orders the members the same way before it asks.

Files, per domain, under `<workdir>/<domain_id>/`: `config.cfg` (the real IMEX config keys),
`nodes.cfg` (one member address per line), `imex.log` (the daemon's stdout/stderr; the previous run's
is kept as `imex.log.1`) and `imex.pid`; a TLS domain's key, certificate and authorities under `tls/`.

Membership: every member must write the byte-identical nodes file (IMEX compares a hash of the map
and refuses peers whose map differs), so members are written in one canonical order whatever order
the caller learned them in: IPv4 addresses numerically, then IPv6, then host names
(`canonical_members`; the keeper's C orders them the same way, and a test holds the two together).

Ports: every member of a domain uses the same peer port (`SERVER_PORT`) and command port
(`IMEX_CMD_PORT`), and two domains on one node must not share them. `ports_for_slot(slot)` gives
slot 0 the IMEX defaults and slot k the pair shifted by a stride of k (k <= names.MAX_IMEX_PORT_SLOT;
the numbers are names.IMEX_SERVER_PORT, IMEX_CMD_PORT and IMEX_PORT_STRIDE). The clique-scoped
domain uses slot 0; a dedicated domain gets a slot allocated by the controller, unique among the live
dedicated domains of its clique and recorded on the ComputeDomain, so all members agree without
talking to each other and no node (a node is in exactly one clique) sees two domains on one slot.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from nvlfabric.api import names

__all__ = [
    "CLIQUE_DOMAIN_PREFIX",
    "DEDICATED_DOMAIN_PREFIX",
    "TLS_CA",
    "TLS_CERT",
    "TLS_KEY",
    "DomainPorts",
    "canonical_members",
    "check_domain",
    "clique_domain_id",
    "clique_of_domain",
    "dedicated_domain_id",
    "is_dedicated",
    "is_domain_id",
    "ports_for_slot",
    "render_nodes",
]

_DOMAIN_ID = re.compile(r"[a-z0-9](?:[a-z0-9.\-]{0,61}[a-z0-9])?")
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,252})")
_ZONE = re.compile(r"[!-~]+")
"""An IPv6 zone (`fe80::1%eth0`) the files can hold: printable ASCII, no blank (one line each)."""


TLS_KEY = "tls/node.key"
TLS_CERT = "tls/node.crt"
TLS_CA = "tls/ca.crt"
"""A TLS domain's credentials, relative to its directory (written by the agent, nodeagent/imexauth.py)."""


CLIQUE_DOMAIN_PREFIX = "clique-"
DEDICATED_DOMAIN_PREFIX = "cd-"
"""A clique's persistent domain is `clique-<clique>`, a Dedicated ComputeDomain's own `cd-<its uid>`:
the ids the checkpoint records and the keeper names its directories by (so they never change)."""


def clique_domain_id(clique: str) -> str:
    """The id of clique `clique`'s persistent (clique-scoped) IMEX domain."""
    return f"{CLIQUE_DOMAIN_PREFIX}{clique}"


def dedicated_domain_id(cd_uid: str) -> str:
    """The id of the Dedicated ComputeDomain `cd_uid`'s own IMEX domain."""
    return f"{DEDICATED_DOMAIN_PREFIX}{cd_uid}"


def is_dedicated(domain_id: str) -> bool:
    """Whether `domain_id` is a Dedicated ComputeDomain's own domain (else a clique's)."""
    return domain_id.startswith(DEDICATED_DOMAIN_PREFIX)


def clique_of_domain(domain_id: str) -> str:
    """The clique of a clique-scoped domain id (the inverse of `clique_domain_id`)."""
    return domain_id.removeprefix(CLIQUE_DOMAIN_PREFIX)


def is_domain_id(value: str) -> bool:
    """A name the keeper accepts as a domain id (and so as a directory name under the work dir)."""
    return bool(_DOMAIN_ID.fullmatch(value))


def check_domain(domain_id: str, bind_address: str, server_port: int, cmd_port: int) -> None:
    """What the keeper would refuse of a domain, refused here first: ValueError naming it."""
    if not is_domain_id(domain_id):
        raise ValueError(f"IMEX domain id {domain_id!r} must be a DNS label-like name (a-z, 0-9, '-', '.')")
    _address(bind_address)  # raises ValueError for a malformed address
    for what, port in (("SERVER_PORT", server_port), ("IMEX_CMD_PORT", cmd_port)):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"{what}: {port!r} is not a whole number in 1..65535")
    if cmd_port == server_port:
        raise ValueError(f"IMEX command and peer ports must differ, both are {cmd_port}")


@dataclass(frozen=True)
class DomainPorts:
    server: int
    cmd: int


def ports_for_slot(slot: int, *, base_server: int = names.IMEX_SERVER_PORT,
                   base_cmd: int = names.IMEX_CMD_PORT) -> DomainPorts:
    """The peer and command ports of port slot `slot` (0 = the IMEX defaults)."""
    if not 0 <= slot <= names.MAX_IMEX_PORT_SLOT:
        raise ValueError(f"IMEX port slot must be in 0..{names.MAX_IMEX_PORT_SLOT}, got {slot}")
    stride = names.IMEX_PORT_STRIDE * slot
    return DomainPorts(server=base_server + stride, cmd=base_cmd + stride)


def _address(entry: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address as the keeper reads one (ValueError otherwise): a zone, if any, of one word."""
    addr = ipaddress.ip_address(entry)
    if "%" in entry and not _ZONE.fullmatch(entry.partition("%")[2].replace("%", " ").replace("/", " ")):
        raise ValueError(f"{entry!r}: an IPv6 zone is printable ASCII without blanks, '%' or '/'")
    return addr


def _member_key(entry: str) -> tuple[int, int, str]:
    try:
        addr = _address(entry)
    except ValueError:
        return (2, 0, entry)
    return (0 if addr.version == 4 else 1, int(addr), entry)


def canonical_members(members: Iterable[str]) -> list[str]:
    """Members in the order every node writes them; rejects duplicates and malformed entries."""
    seen: set[str] = set()
    for entry in members:
        try:
            _address(entry)
        except ValueError:
            if not _HOSTNAME.fullmatch(entry):
                raise ValueError(f"IMEX member {entry!r} is neither an IP address nor a host name") from None
        if entry in seen:
            raise ValueError(f"IMEX member {entry!r} is listed twice")
        seen.add(entry)
    return sorted(seen, key=_member_key)


def render_nodes(members: Iterable[str]) -> str:
    """The nodes file every member writes for these members (the keeper writes it; tests compare)."""
    return "".join(f"{m}\n" for m in canonical_members(members))
