"""Hollow nodes beside real ones: what the central components see of a hollow node (Node labels and
conditions, the agents' reports per ComputeDomain, the controller's summary) is what they see of a
node running nvlfabric's real agent, while a hollow node runs no agent or keeper process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric import manifests
from nvlfabric.api import names
from nvlfabric.api.nodereports import node_report_key
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import print_simulator_logs
from tests.support.agents import domain_with_pods

pytestmark = pytest.mark.cluster
RACK = 140  # racks 140 (real) and 141 (hollow): addresses of their own


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[ControlPlane, Client]]:
    state = Path(tempfile.mkdtemp(prefix="nvlh-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=2, nodes_per_rack=2, first_rack=RACK,
                      hollow_racks=1, progress=lambda m: None)
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="hollow-test")
    try:
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, field_manager="hollow-test", force=True)
        yield cp, client
    finally:
        client.close()
        cp.down()
        print_simulator_logs(state)
        shutil.rmtree(state, ignore_errors=True)


def _agent_processes(cp: ControlPlane) -> dict[str, int]:
    """Node → nvlfabric agent and keeper processes running on it (by the node's PID namespace)."""
    out: dict[str, int] = {n.name: 0 for n in cp.nodes()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            agent = b"nvlfabric" in argv and b"agent" in argv
            keeper = os.path.basename(argv[0]) == names.IMEX_KEEPER_BINARY.encode()  # `imex` execs it
            if agent or keeper:
                for n in cp.nodes():
                    if n.runs(int(entry.name)):
                        out[n.name] += 1
    return out


def _fabric(node: Node) -> tuple[str, str]:
    cond = next(c for c in node.status.conditions if c.type == names.FABRIC_CONDITION)
    return cond.status, cond.reason


def test_a_hollow_node_looks_like_a_real_one_to_the_cluster(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    real, hollow = [n for n in cp.nodes() if not n.hollow], [n for n in cp.nodes() if n.hollow]
    assert [n.rack for n in hollow] == [RACK + 1] * 2 and [n.rack for n in real] == [RACK] * 2

    def labelled() -> bool:
        return all(n.metadata.labels.get(names.CLIQUE_LABEL) for n in client.list(Node, labels={
            "nvlfabric.io/simulated": "true"}))

    eventually("every node, hollow or not, to be labelled with its clique", labelled, timeout=120)

    def daemonsets_available() -> bool:
        return all((ds.status.numberAvailable or 0) == 4
                   for ds in client.list(DaemonSet, namespace="nvlfabric-system"))

    eventually("the agent and keeper DaemonSets to be available on all 4 nodes", daemonsets_available, timeout=120)
    nodes = {n.metadata.name: n for n in client.list(Node, labels={"nvlfabric.io/simulated": "true"})}
    cliques = {name: n.metadata.labels[names.CLIQUE_LABEL] for name, n in nodes.items()}
    # One clique per rack, derived the same way as NVML's (cluster UUID . clique ID)
    assert cliques[real[0].name] == cliques[real[1].name] != cliques[hollow[0].name] == cliques[hollow[1].name]
    assert len(cliques[hollow[0].name].split(".")[0]) == 36 and cliques[hollow[0].name].split(".")[1].isdigit()
    for name, n in nodes.items():
        # GPU Feature Discovery's labels, as other drivers select GPU nodes by them: the clique
        # it reads from NVML is the one the agent (or its hollow stand-in) found there.
        assert n.metadata.labels["nvidia.com/gpu.clique"] == cliques[name]
        assert (n.metadata.labels["nvidia.com/gpu.present"], n.metadata.labels["nvidia.com/gpu.count"]) == ("true", "4")
        assert n.metadata.labels[names.FABRIC_READY_LABEL] == "true"
        assert _fabric(n) == ("True", "FabricRegistered"), n.metadata.name
    processes = _agent_processes(cp)
    assert all(processes[n.name] >= 2 for n in real), processes  # the agent and the keeper
    assert all(processes[n.name] == 0 for n in hollow), processes

    # A domain in each rack, a pod per node: reported by the real agents and by the hollow ones alike.
    a, b = f"r-{uuid.uuid4().hex[:5]}", f"h-{uuid.uuid4().hex[:5]}"
    domain_with_pods(client, a, [n.name for n in real])
    domain_with_pods(client, b, [n.name for n in hollow])
    try:
        statuses: dict[str, dict[str, Any]] = {}
        for cd in (a, b):
            statuses[cd] = eventually(f"domain {cd} to be Ready on both its nodes", lambda cd=cd: (
                s if (s := client.get(ComputeDomainResource, cd, namespace="default").status or {}).get("phase")
                == "Ready" and s.get("readyNodes") == 2 else None), timeout=120)
        assert statuses[a]["clique"] == cliques[real[0].name] and statuses[b]["clique"] == cliques[hollow[0].name]
        assert {n["name"] for n in statuses[b]["nodes"]} == {n.name for n in hollow}
        assert [sorted(n) for n in statuses[a]["nodes"]] == [sorted(n) for n in statuses[b]["nodes"]]

        def report(node: str, cd: str) -> dict[str, Any]:
            annotations = client.get(Node, node).metadata.annotations or {}
            return json.loads(annotations[node_report_key("default", cd)])

        mine, theirs = report(real[0].name, a), report(hollow[0].name, b)
        assert mine.keys() == theirs.keys() and mine["entry"].keys() == theirs["entry"].keys()
        assert theirs["entry"] == {"name": hollow[0].name, "address": hollow[0].address,
                                   "clique": cliques[hollow[0].name], "ready": True}
        assert mine["entry"]["ready"] is True
    finally:
        for cd in (a, b):
            for i in range(2):
                with contextlib.suppress(ApiError):
                    client.delete(Pod, f"{cd}-{i}", namespace="default")
    for cd, members in ((a, real), (b, hollow)):
        for n in members:
            eventually(f"{n.name} to withdraw its report of {cd} with its last pod", lambda n=n, cd=cd: (
                node_report_key("default", cd) not in (client.get(Node, n.name).metadata.annotations or {})),
                timeout=60)
