"""One training job over two racks, end to end on the simulator with real agents and the
controller: a MultiClique ComputeDomain of two cliques, a BoundJob of 4 pods x 4 GPUs as two
groups; each group lands whole in a rack of its own with that rack's own channel, the pods get the
ranks 0..3 of the whole job (the controller's, as it lifts their gates) and one rank-0 address,
and the domain reports Ready with its groups."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric import manifests
from nvlfabric.api.names import CLIQUE_LABEL, RANK_ANNOTATION
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane
from tests.conftest import free_ports, simulated_rack
from tests.support.onsim import multi_clique_domain

pytestmark = pytest.mark.cluster
PORTS = free_ports()
RACK = 182  # racks 182 and 183: numbers no other test uses


@pytest.fixture(scope="module")
def racks() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, racks=2, nodes=2, field_manager="multiclique-test",
                        prefix="nvlmulti-") as (cp, client):
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, force=True)
        yield cp, client


def test_a_job_over_two_racks_gets_a_rack_and_a_channel_per_group_and_global_ranks(
        racks: tuple[ControlPlane, Client]) -> None:
    cp, client = racks
    name = f"big-{uuid.uuid4().hex[:5]}"
    claims = multi_clique_domain(client, name, cliques=2, num_nodes=4)
    args = BoundJobArgs(name=name, parallelism=4, gpus_per_pod=4, clique_groups=2, pod_template={"spec": {
        "containers": [{"name": "worker", "image": "registry.invalid/train:1", "command": [
            "torchrun", "--nnodes=$(NVLFABRIC_WORLD_SIZE)", "--node-rank=$(NVLFABRIC_RANK)"]}]}})
    objs = workload_manifests(args, namespace="default", claim_name=claims[0], domain=name, claims=claims)
    assert [o["kind"] for o in objs] == ["Service", "Job", "Job"]
    for obj in objs:
        client.create(codecs.from_dict(obj))

    def running() -> list[Pod] | None:
        ps = [p for p in client.list(Pod, namespace="default", labels={"nvlfabric.io/workload": name})
              if p.status and p.status.phase == "Running"]
        return ps if len(ps) == 4 else None

    pods = eventually("the job's four pods to run", running, timeout=180)
    clique_of = {n.metadata.name: (n.metadata.labels or {}).get(CLIQUE_LABEL) for n in client.list(Node)}
    groups: dict[str, set[str]] = {}
    envs: dict[str, dict[str, Any]] = {}
    for p in pods:
        groups.setdefault(p.metadata.annotations["nvlfabric.io/clique-group"], set()).add(clique_of[p.spec.nodeName])
        envs[p.metadata.name] = json.loads((cp.state_dir / "nodes" / p.spec.nodeName / "containers"
                                            / f"default_{p.metadata.name}_worker.json").read_text())
    assert all(len(c) == 1 for c in groups.values()), f"a group split across racks: {groups}"
    assert groups["0"] != groups["1"], "both groups in one rack"
    ranks = {}
    for p in pods:
        env = envs[p.metadata.name]["containerEnv"]
        g, i = int(p.metadata.annotations["nvlfabric.io/clique-group"]), int(
            p.metadata.annotations["batch.kubernetes.io/job-completion-index"])
        assert env["NVLFABRIC_RANK"] == p.metadata.annotations[RANK_ANNOTATION] == str(2 * g + i)
        assert env["NVLFABRIC_WORLD_SIZE"] == "4" and env["NVLFABRIC_MASTER_ADDR"] == f"{name}-0-0.{name}.default.svc"
        assert envs[p.metadata.name]["command"] == ["torchrun", "--nnodes=4", f"--node-rank={2 * g + i}"]
        ranks[p.metadata.name] = int(env["NVLFABRIC_RANK"])
    assert sorted(ranks.values()) == [0, 1, 2, 3]

    status = eventually("the domain to be Ready with both groups", lambda: (
        s if (s := client.get(ComputeDomainResource, name, namespace="default").status or {}).get("phase") == "Ready"
        else None), timeout=60)
    assert status["placedCliques"] == 2 and status["readyNodes"] == 4
    by_claim = {g["claim"]: g for g in status["groups"]}
    assert set(by_claim) == set(claims)
    assert {g["clique"] for g in by_claim.values()} == {c for cs in groups.values() for c in cs}
    assert all(g["readyNodes"] == 2 and len(g["nodes"]) == 2 for g in by_claim.values())
    assert "clique" not in status and "channel" not in status  # a clique and a channel per group instead
