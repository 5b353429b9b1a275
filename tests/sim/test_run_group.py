"""Commands the tests and benchmarks run (the Pulumi CLI) leave nothing behind: the plugins such a
command starts end with it, whether it exits, times out or its caller is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nvlfabric.sim.processes import run_owned

# A parent that starts a child which would outlive it, in a session of its own (as pulumi starts
# its plugins in process groups of their own), writes the child's pid, then exits with 3 or sleeps.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
print("started", flush=True)
if sys.argv[2] == "exit":
    sys.exit(3)
time.sleep(600)
"""


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if state[state.rindex(")") + 2] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_child_left_by_a_command_that_exited_is_ended(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    proc = run_owned([sys.executable, "-c", PARENT, str(pidfile), "exit"], timeout=60)
    assert proc.returncode == 3 and proc.stdout == "started\n"
    assert _gone(int(pidfile.read_text()))


def test_a_timeout_ends_the_command_and_its_children_and_raises(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    with pytest.raises(subprocess.TimeoutExpired):
        run_owned([sys.executable, "-c", PARENT, str(pidfile), "sleep"], timeout=3)
    assert _gone(int(pidfile.read_text()))


def test_a_caller_stopped_by_sigterm_takes_the_command_and_its_children_down(tmp_path: Path) -> None:
    """As bench/e2e.py is stopped: its SIGTERM handler raises SystemExit mid-command."""
    pidfile = tmp_path / "child"
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def stop_when_started() -> None:
        while not pidfile.exists() or not pidfile.read_text():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_started, daemon=True).start()
    try:
        with pytest.raises(SystemExit):
            run_owned([sys.executable, "-c", PARENT, str(pidfile), "sleep"], timeout=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _gone(int(pidfile.read_text()))
