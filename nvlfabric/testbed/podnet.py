"""Which pod network a simulator takes at `up` (nvlfabric/sim/podnetwork.py: a bridge and a subnet
per simulator, so pods that are not hostNetwork get addresses of their own), or none for "host"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nvlfabric.sim import podnetwork
from nvlfabric.testbed import runstate
from nvlfabric.testbed.runstate import ControlPlaneError


def claim(state_dir: Path, mode: str, progress: Callable[[str], None]) -> podnetwork.PodNetwork | None:
    # Also without racks: kubelets started beside the control plane (the tests') may use it.
    if mode == "host":
        return None
    if mode != "namespaced":
        raise ControlPlaneError(f"--pod-network {mode!r}: give namespaced or host")

    def held(other: Path) -> bool:  # its simulator runs, or an up/down works on it now
        return runstate.running(other) or runstate.locked_elsewhere(other)

    try:
        net = podnetwork.claim(state_dir, held)
    except podnetwork.PodNetworkError as exc:
        raise ControlPlaneError(str(exc)) from None
    progress(f"pod network {net.subnet} on bridge {net.bridge} (pods that are not hostNetwork)")
    return net
