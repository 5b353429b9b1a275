"""IMEX daemon configuration: a typed model of `config.cfg` and a writer for the nodes file.

The field names are the real IMEX keys, spelled exactly as NVIDIA's daemon reads them, and the
defaults are the IMEX defaults (NVIDIA's IMEX guide, "Service Config Options"; see
`/work/shared/reference/nvml-imex-gb200.md` section 6.2). `render()` writes the real file format
(`KEY=VALUE` lines, `#` comments), so the same model serves the real `nvidia-imex` and the
simulator's stand-in (`nvlfabric/sim/imex/`). With `IMEX_ENABLE_AUTH_ENCRYPTION=1` and the `SSL_TLS` mode the
model requires the six TLS credential keys (as both daemons do); the stand-in implements that mode as mutual TLS
with `IMEX_AUTH_SOURCE` `FILE` or `ENV_PATH` and additionally refuses the GSS modes, `ENV_VAL` and IPv6
addresses, which it does not implement (it also checks the credential files at start; the model cannot).

Both files are written atomically (temporary file + rename): a running daemon re-reads the nodes file
on SIGUSR1 and must never see half a file.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from nvlfabric.api import names

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_NODES_PATH",
    "ConfigSyntaxError",
    "ImexConfig",
    "WaitForQuorum",
    "render_nodes",
    "validate_node_entry",
    "write_config",
    "write_nodes_file",
]

DEFAULT_CONFIG_PATH = "/etc/nvidia-imex/config.cfg"
DEFAULT_NODES_PATH = "/etc/nvidia-imex/nodes_config.cfg"

_HOSTNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
_KEY = re.compile(r"[A-Za-z0-9_]+")
_INT = re.compile(r"[+-]?[0-9]+")
_CHOICE_KEYS = frozenset({"IMEX_WAIT_FOR_QUORUM", "IMEX_AUTH_ENCRYPTION_MODE", "IMEX_AUTH_SOURCE"})
# Required with IMEX_ENABLE_AUTH_ENCRYPTION=1 and SSL_TLS, checked in this order (the daemon's order too).
TLS_CREDENTIAL_KEYS = (
    "IMEX_SERVER_KEY",
    "IMEX_SERVER_CERT",
    "IMEX_SERVER_CERT_AUTH",
    "IMEX_CLIENT_KEY",
    "IMEX_CLIENT_CERT",
    "IMEX_CLIENT_CERT_AUTH",
)
_SINGLE_KEY = "nvlfabric-single-key"  # validation context of parse()'s per-line check


class WaitForQuorum(StrEnum):
    """`IMEX_WAIT_FOR_QUORUM`: NONE = don't wait; RECOVERY = after an unsafe stop, wait for importers."""

    NONE = "NONE"
    RECOVERY = "RECOVERY"


def _control_char(text: str) -> str | None:
    """The first control character other than TAB (the daemons refuse lines that hold one)."""
    return next((c for c in text if (c < " " and c != "\t") or c == "\x7f"), None)


def _single_line(value: str) -> str:
    if _control_char(value) is not None:
        raise ValueError("must be a single line without control characters (TAB is allowed)")
    if value != value.strip(" \t\v\f"):
        raise ValueError("must not start or end with blanks (the config format strips them)")
    return value


def _ipv4_or_empty(value: str) -> str:
    if value:
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 address (the simulator supports IPv4 only)") from None
    return value


def _fits_a_unix_socket(value: str) -> str:
    # Counted in bytes, as sun_path holds them (and as the daemons count): a path of 60 two-byte
    # characters does not fit.
    if len(value.encode()) > names.MAX_UNIX_SOCKET_PATH:
        raise ValueError(f"a unix socket path has at most {names.MAX_UNIX_SOCKET_PATH} bytes, "
                         f"this one {len(value.encode())}")
    return value


Text = Annotated[str, AfterValidator(_single_line)]
IPv4OrEmpty = Annotated[str, AfterValidator(_single_line), AfterValidator(_ipv4_or_empty)]
Flag = Literal[0, 1]
Port = Annotated[int, Field(ge=1, le=65535)]
NonNegative = Annotated[int, Field(ge=0, le=1_000_000_000)]
SecondsOrForever = Annotated[int, Field(ge=-1, le=1_000_000_000)]


class ConfigSyntaxError(ValueError):
    """A config file line that is not `KEY=VALUE`, or a value the model rejects; names the line."""

    def __init__(self, line: int, key: str | None, message: str) -> None:
        self.line = line
        self.key = key
        where = f"line {line}" + (f": {key}" if key else "")
        super().__init__(f"{where}: {message}")


class ImexConfig(BaseModel):
    """The keys of `nvidia-imex`'s config file, with IMEX's own defaults.

    Unknown keys are not modelled; the daemons accept and ignore them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    LOG_LEVEL: Annotated[int, Field(ge=0, le=5)] = 4
    LOG_FILE_NAME: Text = "/var/log/nvidia-imex.log"
    STATS_FILE_NAME: Text = "/var/log/nvidia-imex-stats.log"
    LOG_APPEND_TO_LOG: Flag = 1
    LOG_FILE_MAX_SIZE: NonNegative = 1024
    LOG_MAX_ROTATE_COUNT: NonNegative = 10
    LOG_USE_SYSLOG: Flag = 0
    DAEMONIZE: Flag = 1
    BIND_INTERFACE_IP: IPv4OrEmpty = ""
    SERVER_PORT: Port = names.IMEX_SERVER_PORT
    IMEX_NODE_CONFIG_FILE: Annotated[Text, Field(min_length=1)] = DEFAULT_NODES_PATH
    NETWORK_INTERFACE: Text = ""
    IMEX_WAIT_FOR_QUORUM: WaitForQuorum = WaitForQuorum.RECOVERY
    IMEX_ENABLE_AUTH_ENCRYPTION: Flag = 0
    IMEX_AUTH_ENCRYPTION_MODE: Literal["SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY"] = "SSL_TLS"
    IMEX_AUTH_SOURCE: Literal["", "FILE", "ENV_PATH", "ENV_VAL"] = ""
    IMEX_SERVER_KEY: Text = ""
    IMEX_SERVER_CERT: Text = ""
    IMEX_SERVER_CERT_AUTH: Text = ""
    IMEX_CLIENT_KEY: Text = ""
    IMEX_CLIENT_CERT: Text = ""
    IMEX_CLIENT_CERT_AUTH: Text = ""
    IMEX_SECURITY_TARGET_OVERRIDE: Text = ""
    IMEX_GSS_SERVICE_NAME: Text = "host"
    IMEX_GSS_TIMEOUT_SEC: SecondsOrForever = -1
    IMEX_GSS_RETRY_INTERVAL_SEC: NonNegative = 5
    IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC: SecondsOrForever = -1
    IMEX_GSS_SHUTDOWN_ON_FAILURE: Flag = 1
    IMEX_CMD_ENABLED: Flag = 1
    IMEX_CMD_BIND_INTERFACE_IP: IPv4OrEmpty = ""
    IMEX_CMD_PORT: Port = names.IMEX_CMD_PORT
    IMEX_CMD_UNIX_DOMAIN_PATH: Annotated[Text, AfterValidator(_fits_a_unix_socket)] = ""
    IMEX_NODE_DISCONNECTED_GRACE_TIME: SecondsOrForever = -1

    @model_validator(mode="after")
    def _tls_credentials_complete(self, info: ValidationInfo) -> Self:
        """SSL_TLS needs all six credential keys; the message starts with the first missing key."""
        if info.context == _SINGLE_KEY:  # parse() checks one line at a time; the whole file is checked last
            return self
        if self.IMEX_ENABLE_AUTH_ENCRYPTION == 1 and self.IMEX_AUTH_ENCRYPTION_MODE == "SSL_TLS":
            for key in TLS_CREDENTIAL_KEYS:
                if not getattr(self, key):
                    raise ValueError(
                        f"{key}: required when IMEX_ENABLE_AUTH_ENCRYPTION=1 with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS"
                    )
        return self

    @classmethod
    def for_child_process(
        cls,
        *,
        nodes_file: str | Path,
        cmd_bind_ip: str,
        bind_ip: str = "",
        server_port: int = names.IMEX_SERVER_PORT,
        cmd_port: int = names.IMEX_CMD_PORT,
        log_file: str = "",
        wait_for_quorum: WaitForQuorum = WaitForQuorum.RECOVERY,
        grace_time: int = -1,
    ) -> ImexConfig:
        """The settings of an IMEX run as a supervised child (as NVIDIA's DRA driver runs it).

        Foreground (`DAEMONIZE=0`), logging to stderr unless `log_file` is given, the command service
        on the node's own address so that peers can run `nvidia-imex-ctl -N` against it. With
        `bind_ip` empty the daemon picks the nodes-file entry that is its own address.
        """
        return cls(
            LOG_FILE_NAME=log_file,
            LOG_APPEND_TO_LOG=0,
            DAEMONIZE=0,
            BIND_INTERFACE_IP=bind_ip,
            SERVER_PORT=server_port,
            IMEX_NODE_CONFIG_FILE=str(nodes_file),
            IMEX_WAIT_FOR_QUORUM=wait_for_quorum,
            IMEX_CMD_ENABLED=1,
            IMEX_CMD_BIND_INTERFACE_IP=cmd_bind_ip,
            IMEX_CMD_PORT=cmd_port,
            IMEX_NODE_DISCONNECTED_GRACE_TIME=grace_time,
        )

    def render(self, *, header: str | None = None) -> str:
        """The file text: every key as `KEY=VALUE`, one per line, in the model's order."""
        lines = [f"# {line}".rstrip() for line in header.splitlines()] if header else []
        for key in type(self).model_fields:
            value = getattr(self, key)
            text = value.value if isinstance(value, StrEnum) else str(value)
            lines.append(f"{key}={text}")
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Self:
        """Reads the file format back; unknown keys are ignored, the last of a repeated key wins."""
        values: dict[str, object] = {}
        auth_line = 0  # like the daemon, a missing TLS key is reported at the line that enabled auth
        for number, raw in enumerate(text.split("\n"), start=1):
            if "\0" in raw:
                raise ConfigSyntaxError(number, None, "malformed line: contains a NUL byte")
            line = raw.strip(" \t\r\v\f")
            if not line or line.startswith("#"):
                continue
            if (bad := _control_char(line)) is not None:
                raise ConfigSyntaxError(number, None, f"malformed line: contains the control character {bad!r}")
            key, sep, value = line.partition("=")
            key = key.rstrip(" \t")
            if not sep:
                raise ConfigSyntaxError(number, None, f"malformed line {line!r}: expected KEY=VALUE")
            if not _KEY.fullmatch(key):
                raise ConfigSyntaxError(number, None, f"malformed key {key!r}")
            if key not in cls.model_fields:
                continue  # unknown keys are accepted and ignored, as by the daemon
            value = value.lstrip(" \t")
            numeric = isinstance(cls.model_fields[key].default, int)
            if value == "" and (numeric or key in _CHOICE_KEYS):
                continue  # an empty numeric or enumerated value keeps the default, as in the daemon
            typed: object = value
            if numeric:
                if not _INT.fullmatch(value):
                    raise ConfigSyntaxError(number, key, f"invalid value {value!r}: expected an integer")
                typed = int(value)
            try:  # every occurrence is checked, like the daemon does; the last one wins
                cls.model_validate({key: typed}, context=_SINGLE_KEY)
            except ValidationError as exc:
                raise ConfigSyntaxError(number, key, f"invalid value {value!r}: {exc.errors()[0]['msg']}") from None
            values[key] = typed
            if key == "IMEX_ENABLE_AUTH_ENCRYPTION":
                auth_line = number
        try:
            return cls.model_validate(values)
        except ValidationError as exc:  # only the cross-key check is left at this point
            message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            missing, _, why = message.partition(": ")
            raise ConfigSyntaxError(auth_line, missing, why) from None


def validate_node_entry(entry: str) -> str:
    """One nodes-file entry: an IPv4 address or a hostname (IPv6 is not supported by the stand-in)."""
    try:
        ipaddress.IPv4Address(entry)
        return entry
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(entry):
        raise ValueError(f"invalid IMEX node entry {entry!r}: expected an IPv4 address or a hostname")
    return entry


def render_nodes(entries: Iterable[str]) -> str:
    """The nodes file text: one entry per line, in order (the order defines the node indices)."""
    seen: set[str] = set()
    lines: list[str] = []
    for entry in entries:
        validate_node_entry(entry)
        if entry in seen:
            raise ValueError(f"duplicate IMEX node entry {entry!r}")
        seen.add(entry)
        lines.append(entry)
    return "".join(f"{line}\n" for line in lines)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_nodes_file(path: str | Path, entries: Sequence[str]) -> Path:
    """Writes the nodes file atomically; send the daemon SIGUSR1 afterwards to make it re-read it."""
    target = Path(path)
    _atomic_write(target, render_nodes(entries))
    return target


def write_config(path: str | Path, config: ImexConfig, *, header: str | None = None) -> Path:
    """Writes `config.render()` atomically."""
    target = Path(path)
    _atomic_write(target, config.render(header=header))
    return target
