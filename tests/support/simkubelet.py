"""A simulated-kubelet process of its own beside the test cluster: a rack of a few nodes that a
test owns (its rack number keeps its names and addresses apart), with the images it maps."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from nvlfabric.sim.nodes import SimNode, rack_nodes, runtime_root
from tests.conftest import Cluster


def state_dir(prefix: str) -> Path:
    """A fresh state directory under /tmp: Unix socket paths are limited to 107 bytes, as on a
    real node, so it is kept short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@contextlib.contextmanager
def standalone_kubelet(cluster: Cluster, state: Path, *, rack: int, nodes: int = 1, images: dict[str, Any],
                       args: Sequence[str] = ()) -> Iterator[tuple[list[SimNode], subprocess.Popen[str]]]:
    """Run `python -m nvlfabric.sim.kubelet` for `nodes` nodes of rack `rack` in `state` until
    the block ends; then stop it, show its log's tail (pytest prints it when a test failed),
    and remove its Nodes, their Leases and `state`."""
    sim = rack_nodes(state, 1, nodes, first_rack=rack)
    log = (state / "kubelet.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "nvlfabric.sim.kubelet", "--state-dir", str(state), "--kubeconfig",
                             str(cluster.kubeconfig), "--racks", "1", "--nodes-per-rack", str(nodes), "--first-rack",
                             str(rack), "--images", json.dumps(images), *args],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", (state / "kubelet.log").read_text()
        yield sim, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
        log.close()
        print((state / "kubelet.log").read_text()[-4000:])
        for n in sim:
            with contextlib.suppress(ApiError):
                cluster.client.delete(Node, n.name)
            with contextlib.suppress(ApiError):
                cluster.client.delete(Lease, n.name, namespace="kube-node-lease")
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(runtime_root(state), ignore_errors=True)
