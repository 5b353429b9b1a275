"""What a running simulator records in its state directory, and who may change it: the ports, the
admin token and the processes in `controlplane.json`, and `controlplane.lock`, which `up` and
`down` hold while they work.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from nvlfabric.sim import processes
from nvlfabric.sim.nodes import NODES_PER_RACK
from nvlfabric.sim.processes import ProcessRecord

STATE_FILE = "controlplane.json"
LOCK_FILE = "controlplane.lock"


class ControlPlaneError(RuntimeError):
    """Something the user must act on; the message says what and how."""


class Ports(BaseModel):
    """Loopback ports; the defaults sit away from a real cluster's (2379, 6443, 10259)."""

    etcd_client: int = 23790
    etcd_peer: int = 23800
    apiserver: int = 26443
    scheduler: int = 20259

    def flags(self) -> dict[str, str]:
        return {"etcd_client": "--etcd-port", "etcd_peer": "--etcd-peer-port",
                "apiserver": "--apiserver-port", "scheduler": "--scheduler-port"}


def free_ports() -> Ports:
    """Four distinct free loopback ports (held open together while chosen), for a control plane of
    its own beside any other on this machine: a test's, a benchmark's, another checkout's."""
    etcd, peer, api, sched = processes.free_loopback_ports(4)
    return Ports(etcd_client=etcd, etcd_peer=peer, apiserver=api, scheduler=sched)


def check_free(ports: Ports) -> None:
    """Each port free on 127.0.0.1, or an error naming the flag that chooses another."""
    for attr, flag in ports.flags().items():
        port = getattr(ports, attr)
        if processes.port_in_use(port):
            raise ControlPlaneError(
                f"port {port} on 127.0.0.1 ({attr.replace('_', ' ')}) is already in use by another "
                f"process; stop it, or choose another port with `nvlfabric-sim up {flag} PORT`"
            )


class State(BaseModel):
    ports: Ports
    token: str
    processes: list[ProcessRecord]
    started_at: float
    ready_s: float | None = None
    racks: int = 0
    nodes_per_rack: int = NODES_PER_RACK
    first_rack: int = 0
    nodes_ready_s: float | None = None
    workload_scheduling: bool = False
    real_kubelets: int = 0
    runtime: str = "standin"
    hollow_racks: int = 0
    addons: list[str] = []
    pod_network: int | None = None
    """The pod network this simulator holds (nvlfabric/sim/podnetwork.py); None: pods share their node's."""


def load(state_dir: Path) -> State | None:
    try:
        return State.model_validate_json((state_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        # A torn or foreign file: treat as "nothing recorded"; `down` still cleans the dir.
        return None


def save(state_dir: Path, state: State) -> None:
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(path)


def component_status(state_dir: Path) -> dict[str, bool]:
    """Each recorded process: whether it still runs (the same pid and start time)."""
    state = load(state_dir)
    if state is None:
        return {}
    return {rec.name: processes.alive(rec) for rec in state.processes}


def running(state_dir: Path) -> bool:
    status = component_status(state_dir)
    return bool(status) and all(status.values())


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = state_dir / LOCK_FILE
    with lock.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ControlPlaneError(
                f"another nvlfabric-sim command is working on {state_dir}; wait for it to finish"
            ) from None
        yield


def locked_elsewhere(state_dir: Path) -> bool:
    """Whether another process holds the state dir's lock (an `nvlfabric-sim up` or `down` at work)."""
    try:
        with (state_dir / LOCK_FILE).open("r") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except OSError:
        return False
