"""How nvlfabric's long-running processes (the node agent, the controller) log and stop.

Shared by both so that `kubectl logs` reads the same on every pod of the driver: one JSON object per
line (what log collectors expect from a DaemonSet) or plain text, and SIGTERM/SIGINT setting one
stop event the process's loop waits on.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from nvlfabric.api.computedomain import IMEXMode

LogFormat = Literal["json", "text"]
#: Client libraries that log every request at INFO.
_NOISY = ("httpx", "httpx2", "httpcore")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts`, `level`, `logger`, `msg`, and `error` with a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(log_format: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM (the kubelet stopping the pod) or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


class SettingsError(ValueError):
    """A setting is unusable; the message names the flag, its environment twin and what is allowed."""


def whole_number(value: str, *, flag: str, env: str, low: int, high: int, why: str = "") -> int:
    """`value` (a flag's or its environment twin's text) as an int in low..high, or a SettingsError."""
    try:
        n = int(value)
    except ValueError:
        n = low - 1
    if not low <= n <= high:
        raise SettingsError(f"{flag} / ${env}: {value!r} is not a whole number in {low}..{high}{why}")
    return n


def seconds(value: str, *, flag: str, env: str) -> float:
    """`value` as a positive number of seconds, or a SettingsError."""
    try:
        s = float(value)
    except ValueError:
        s = 0.0
    if not 0 < s < float("inf"):
        raise SettingsError(f"{flag} / ${env}: {value!r} is not a positive number of seconds")
    return s


def imex_modes(value: str, *, flag: str = "--imex-modes", env: str = "IMEX_MODES") -> frozenset[IMEXMode]:
    """The IMEX modes the driver allows (NvlfabricDriver imex_modes), from a comma-separated list,
    or a SettingsError. The agents refuse to prepare a claim of another mode; the controller fails
    such a domain before any of its pods is let through."""
    # Imported here: the IMEX keeper uses this module and needs none of the models (its memory).
    from nvlfabric.api.computedomain import IMEXMode

    modes = {m.strip() for m in value.split(",") if m.strip()}
    known = {m.value for m in IMEXMode}
    if not modes or modes - known:
        raise SettingsError(f"{flag} / ${env}: {value!r} is not a comma-separated list of "
                            f"{' and '.join(sorted(known))}")
    return frozenset(IMEXMode(m) for m in modes)
