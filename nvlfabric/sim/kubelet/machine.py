"""A simulated node as a machine: its own PID namespace, which its containers enter; and the PID
namespace of a pod that shares one among its containers (`shareProcessNamespace`), in the node's.

Each is `unshare --pid --fork` with a first process that only reaps (`nvlfabric-shim --pause`,
as a pod's pause container does): the namespace lives as long as it does, and the orphans
re-parented to it are reaped, not left as zombies. A container of neither kind has a namespace
of its own inside the node's (rootfs.py, `own_pidns`); one with `hostPID` is in the node's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from nvlfabric.sim.kubelet import rootfs
from nvlfabric.sim.kubelet.state import NodeState

__all__ = ["end_pid_namespace", "pid_namespace", "pod_pid_namespace", "start_machine", "stop_machine",
           "stop_pod_pid_namespace"]


def pid_namespace(shim: Path, parent: str | None) -> tuple[subprocess.Popen[bytes], int | None]:
    """A new PID namespace (inside `parent`'s, a /proc/<pid>/ns/pid, when given) whose first
    process is the reaping shim: the process holding it, and that first process's host pid."""
    unshare = [shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child", str(shim), "--pause"]
    # Inside the parent: nsenter forks there, and that child (unshare) makes the new namespace in it.
    enter = [shutil.which("nsenter") or "nsenter", f"--pid={parent}", "--"] if parent is not None else []
    # It dies with this process, however it ends (setpriv --pdeathsig): were this kubelet killed,
    # its nodes' namespaces (and whatever runs in them) would live on.
    # (No pipe of ours inherited: a reader of our output must see its end when we exit.)
    proc = subprocess.Popen([shutil.which("setpriv") or "setpriv", "--pdeathsig", "KILL", *enter, *unshare],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    holder: int | None = proc.pid if parent is None else rootfs.namespace_init(proc.pid)
    return proc, rootfs.namespace_init(holder) if holder is not None else None


def start_machine(state: NodeState, shim: Path) -> None:
    """Start the node's PID namespace; its host pid (the forked child of unshare) goes to the node's
    machine pid file, `/proc/<it>/ns/pid` to `state.pidns`."""
    state.machine, init = pid_namespace(shim, None)
    if init is not None:
        state.pidns = f"/proc/{init}/ns/pid"
        state.node.dir.mkdir(parents=True, exist_ok=True)
        state.node.machine_pid_file.write_text(f"{init}\n")
        return
    raise RuntimeError(f"node {state.node.name}: its PID namespace did not start (unshare --pid): simulated "
                       "nodes need root (CAP_SYS_ADMIN) for their PID and mount namespaces")


def pod_pid_namespace(state: NodeState, uid: str, shim: Path) -> str:
    """The PID namespace pod `uid`'s containers share (`shareProcessNamespace`), started in the
    node's at its first container, as its sandbox's pause container holds it on a node."""
    if uid not in state.pod_pidns:
        proc, init = pid_namespace(shim, state.pidns)
        if init is None:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"node {state.node.name}: pod {uid}'s PID namespace did not start (unshare --pid)")
        state.pod_pidns[uid] = (proc, f"/proc/{init}/ns/pid")
    return state.pod_pidns[uid][1]


def stop_pod_pid_namespace(state: NodeState, uid: str) -> None:
    """The pod is gone: SIGKILL its namespace's first process, and with it whatever still runs there."""
    held = state.pod_pidns.pop(uid, None)
    if held is not None:
        end_pid_namespace(*held)


def end_pid_namespace(proc: subprocess.Popen[bytes], path: str) -> None:
    """SIGKILL the first process of the namespace at `path` (its /proc/<pid>/ns/pid), which
    takes whatever still runs there with it, and wait for `proc`, which held it."""
    with contextlib.suppress(ProcessLookupError, ValueError):
        os.kill(int(path.split("/")[2]), signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_machine(state: NodeState) -> None:
    """SIGKILL the namespace's first process (the only signal it takes: unshare, waiting for it,
    ignores SIGTERM), which takes whatever still runs in the namespace with it."""
    if state.machine is None:
        return
    for uid in list(state.pod_pidns):
        stop_pod_pid_namespace(state, uid)
    if state.pidns is not None:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(state.pidns.split("/")[2]), signal.SIGKILL)
    try:
        state.machine.wait(timeout=5)
    except subprocess.TimeoutExpired:
        state.machine.kill()
        state.machine.wait()
