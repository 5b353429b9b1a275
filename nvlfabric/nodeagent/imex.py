"""What the agent knows of IMEX on its node: the errors, the readiness query, the work directory.

The daemons are not the agent's: the node's IMEX keeper runs them (`nvlfabric-imex-keeper`, a C
program in nvlfabric/nodeagent/keeper/, its own DaemonSet), so an agent crash, OOM kill or upgrade
leaves every daemon and its imported NVLink mappings alone. The keeper writes each domain's files
(`config.cfg`, `nodes.cfg`, `imex.log`, `imex.pid` under `<workdir>/<domain_id>/`), runs
`nvidia-imex -c <config>` as its child, SIGUSR1s it on a membership or credentials change and
adopts the daemons an earlier keeper left. The agent decides which domains run with which members
and asks the keeper (imexkeeper.py); it waits for READY itself, here, with `nvidia-imex-ctl -q`
against the config the keeper wrote.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ImexDaemonExited", "ImexError", "ImexNotReady", "QueryResult", "clean_workdir", "query"]


class ImexError(Exception):
    """Base of this module's errors (and of the keeper's refusals, imexkeeper.py)."""


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


def query(ctl_binary: Path, config_path: Path, timeout: float, env: Mapping[str, str] | None = None) -> QueryResult:
    """`nvidia-imex-ctl -c <config> -q` against the daemon of that config, bounded by `timeout` s."""
    argv = [str(ctl_binary), "-c", str(config_path), "-q"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL, env=None if env is None else dict(env))
    except subprocess.TimeoutExpired:
        return QueryResult(None, "", f"{ctl_binary} -q timed out after {timeout:g} s")
    except OSError as exc:
        return QueryResult(None, "", f"running {ctl_binary}: {exc}")
    return QueryResult(proc.returncode, proc.stdout, proc.stderr)


def clean_workdir(workdir: str | Path) -> list[Path]:
    """Remove the temporary files of interrupted writes under the domains' directories (the agent's
    TLS credentials, imexauth.py; the keeper cleans its own at its start); returns them.

    Running daemons are left alone: they serve prepared claims.
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
