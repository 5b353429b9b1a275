"""`nvlfabric-sim fault ...`: break a running simulator the way real hardware and nodes break.

    node-down NODE             the node's kubelet stops heartbeats (NotReady after the grace period)
    node-up NODE               heartbeats resume
    fabric-degraded NODE       NVML reports degraded NVLink bandwidth (health mask) on its GPUs
    fabric-not-started NODE    NVML reports the fabric as not started
    gpu-missing NODE --gpu I   a GPU falls off the bus
    nvml-error NODE            every NVML call fails (the driver went away)
    agent-killed NODE          SIGKILL the node agent's process (the kubelet restarts it)
    clear NODE                 remove every fault of the node

NVML faults take effect in running processes at their next NVML call.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from nvlfabric.sim import hardware
from nvlfabric.sim.nodes import SimNode, rack_nodes
from nvlfabric.sim.nvml import faults as nvml_faults
from nvlfabric.sim.nvml.constants import NvmlReturn

FAULTS = ("node-down", "node-up", "fabric-degraded", "fabric-not-started", "gpu-missing", "nvml-error",
          "agent-killed", "clear")


class FaultError(ValueError):
    pass


def find_node(state_dir: Path, racks: int, nodes_per_rack: int, name: str, *, first_rack: int = 0) -> SimNode:
    nodes = {n.name: n for n in rack_nodes(state_dir, racks, nodes_per_rack, first_rack=first_rack)} if racks else {}
    if name not in nodes:
        known = ", ".join(sorted(nodes)[:3]) + (" …" if len(nodes) > 3 else "")
        raise FaultError(f"no simulated node {name!r} (known: {known or 'none; start with up --racks N'})")
    return nodes[name]


def inject(state_dir: Path, node: SimNode, fault: str, gpus: list[int] | None = None) -> str:
    """Apply one fault; returns what was done, for the user."""
    path = hardware.fault_path(state_dir, node.name)
    if fault in ("node-down", "node-up"):
        node.control_file.write_text(json.dumps({"down": fault == "node-down"}) + "\n")
        return f"{node.name}: kubelet heartbeats {'stopped' if fault == 'node-down' else 'resumed'}"
    if fault == "fabric-degraded":
        nvml_faults.write_faults(path, nvml_faults.fabric_degraded(gpus))
    elif fault == "fabric-not-started":
        nvml_faults.write_faults(path, nvml_faults.fabric_not_started(gpus))
    elif fault == "gpu-missing":
        if not gpus:
            raise FaultError("gpu-missing needs --gpu INDEX (0-3)")
        nvml_faults.write_faults(path, nvml_faults.gpu_missing(*gpus))
    elif fault == "nvml-error":
        nvml_faults.write_faults(path, nvml_faults.driver_gone(NvmlReturn.DRIVER_NOT_LOADED))
    elif fault == "agent-killed":
        return _kill_agents(node)
    elif fault == "clear":
        nvml_faults.clear_faults(path)
        node.control_file.unlink(missing_ok=True)
        return f"{node.name}: all faults cleared"
    else:
        raise FaultError(f"unknown fault {fault!r}; one of: {', '.join(FAULTS)}")
    return f"{node.name}: NVML fault {fault} written to {path}"


def _agent_pids(node: SimNode) -> list[int]:
    """Host pids of the node's agent containers: from the simulated kubelet's pid files, or, on
    a real-kubelet node, from its runtime's (numbered in the node's PID namespace), or on a
    containerd node the node's processes that run the agent's command (the image's entrypoint)."""
    if (node.real_kubelet_dir / "containerd").is_dir():
        return [pid for pid in processes_running(AGENT_COMMAND) if node.runs(pid)]
    pids = []
    for pid_file in sorted((node.dir / "pods").glob("*/agent.pid")):
        with contextlib.suppress(ValueError, OSError):
            pids.append(int(pid_file.read_text()))
    for record in sorted(node.containers_dir.glob("*_agent.json")):
        with contextlib.suppress(ValueError, OSError, KeyError):
            cid = json.loads(record.read_text())["container_id"]
            ns_pid = int((node.real_kubelet_dir / "runtime" / cid / "container.pid").read_text())
            if (pid := node.host_pid(ns_pid)) is not None:
                pids.append(pid)
    return pids


#: The node image's ENTRYPOINT and the agent DaemonSet's args (deploy/Dockerfile, the driver manifest).
AGENT_COMMAND = [b"python", b"-m", b"nvlfabric", b"agent"]


def processes_running(argv: list[bytes]) -> list[int]:
    """Host pids whose command line is `argv` (its program by base name)."""
    found = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmd = Path(entry.path, "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
                if len(cmd) == len(argv) and os.path.basename(cmd[0]) == argv[0] and cmd[1:] == argv[1:]:
                    found.append(int(entry.name))
    return found


def _kill_agents(node: SimNode) -> str:
    killed = []
    # The agent container only: the IMEX keeper's pod (container "imex") runs on, as it would.
    for pid in _agent_pids(node):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            continue
    if not killed:
        raise FaultError(f"{node.name}: no agent process is running there")
    return f"{node.name}: killed pid(s) {', '.join(map(str, killed))}"
