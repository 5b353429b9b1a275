"""Starting the simulator's processes one at a time and waiting for each to be ready.

Each process logs to logs/<name>.log and is recorded in controlplane.json the moment it starts, so
a failed `up` (or a later `down`) stops it; a wait fails at once, with the log's last lines, when
any recorded process has exited.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nvlfabric.sim import processes
from nvlfabric.sim.processes import ProcessRecord
from nvlfabric.testbed import runstate
from nvlfabric.testbed.apihttp import Admin
from nvlfabric.testbed.runstate import ControlPlaneError, State

START_TIMEOUT_S = 90.0  # contended 2-core CI machines take 30 s+ for RBAC bootstrap alone
POLL_INTERVAL_S = 0.2


@dataclass
class Launcher:
    state_dir: Path
    state: State
    progress: Callable[[str], None]
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    """Flags appended to a process's command line, by its name (ControlPlane.extra_args)."""
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def admin(self) -> Admin:
        return Admin(f"https://127.0.0.1:{self.state.ports.apiserver}", self.state.token,
                     self.state_dir / "pki" / "ca.crt")

    def launch(self, name: str, argv: list[str]) -> ProcessRecord:
        self.progress(f"starting {name}")
        argv = [*argv, *self.extra_args.get(name, [])]
        env = {**os.environ, **self.extra_env[name]} if name in self.extra_env else None
        rec = processes.spawn(name, argv, self.state_dir / "logs" / f"{name}.log", env=env)
        self.state.processes.append(rec)
        runstate.save(self.state_dir, self.state)
        return rec

    def wait(self, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for rec in self.state.processes:
                if not processes.alive(rec):
                    raise ControlPlaneError(
                        f"{rec.name} exited while waiting for {what}; last lines of {rec.log}:\n"
                        f"{processes.log_tail(rec.log)}"
                    )
            if check():
                return
            time.sleep(POLL_INTERVAL_S)
        raise ControlPlaneError(f"timed out after {START_TIMEOUT_S:.0f}s waiting for {what}; logs in "
                                f"{self.state_dir / 'logs'}")
