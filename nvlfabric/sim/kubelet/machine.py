"""A simulated node as a machine: its own PID namespace, which its containers enter.

`unshare --pid --fork` and a first process that only sleeps: the namespace lives as long as it
does, and orphans of the node's containers are re-parented to it, so the node's /proc is its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

from nvlfabric.sim.kubelet import rootfs
from nvlfabric.sim.kubelet.state import NodeState

__all__ = ["start_machine", "stop_machine"]


def start_machine(state: NodeState) -> None:
    """Start the node's PID namespace; its host pid (the forked child of unshare) goes to the node's
    machine pid file, `/proc/<it>/ns/pid` to `state.pidns`."""
    unshare = shutil.which("unshare") or "unshare"
    # The machine dies with this process, however it ends (setpriv --pdeathsig): were this
    # kubelet killed, its nodes' namespaces (and whatever runs in them) would live on.
    # (No pipe of ours inherited: a reader of our output must see its end when we exit.)
    state.machine = subprocess.Popen([shutil.which("setpriv") or "setpriv", "--pdeathsig", "KILL", unshare,
                                      "--pid", "--fork", "--kill-child", "sleep", "infinity"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
    init = rootfs.namespace_init(state.machine.pid)
    if init is not None:
        state.pidns = f"/proc/{init}/ns/pid"
        state.node.dir.mkdir(parents=True, exist_ok=True)
        state.node.machine_pid_file.write_text(f"{init}\n")
        return
    raise RuntimeError(f"node {state.node.name}: its PID namespace did not start (unshare --pid): simulated "
                       "nodes need root (CAP_SYS_ADMIN) for their PID and mount namespaces")


def stop_machine(state: NodeState) -> None:
    """SIGKILL the namespace's first process (the only signal it takes: unshare, waiting for it,
    ignores SIGTERM), which takes whatever still runs in the namespace with it."""
    if state.machine is None:
        return
    if state.pidns is not None:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(state.pidns.split("/")[2]), signal.SIGKILL)
    try:
        state.machine.wait(timeout=5)
    except subprocess.TimeoutExpired:
        state.machine.kill()
        state.machine.wait()
