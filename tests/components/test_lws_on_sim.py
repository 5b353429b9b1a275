"""BoundJob(kind="LeaderWorkerSet") run by the real LeaderWorkerSet controller (the simulator's
`lws` addon), end to end with nvlfabric's agents and controller on a simulated rack: the group's
pods Running with the domain's channel, ranks 0..n-1 from LWS's worker index, and the leader's
address as LWS itself gives it (its pod webhook's LWS_LEADER_ADDRESS, expanded in ours); a
worker's failure makes LWS recreate the whole group (RecreateGroupOnPodRestart), and the new pods
get the same claim, clique and channel; deleting it all leaves no claim behind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from lightkube import Client, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod, Service
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric import manifests
from nvlfabric.api.names import WORKLOAD_LABEL
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import eventually, install_crd, ready_domain_status
from nvlfabric.testbed.controlplane import ControlPlane
from tests.conftest import free_ports, simulated_rack
from tests.support.onsim import container_record, running, single_clique_domain

pytestmark = pytest.mark.cluster
PORTS = free_ports()
RACK = 188  # addresses 127.10.188.x: a rack number no other test uses
LeaderWorkerSet = create_namespaced_resource("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet",
                                             "leaderworkersets")
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, nodes=3, field_manager="lws-test", prefix="nvllws-",
                        addons=("lws",)) as (cp, client):
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, force=True)
        yield cp, client


def test_a_leaderworkerset_group_runs_with_its_channel_and_a_group_restart_keeps_it(
        rack: tuple[ControlPlane, Client]) -> None:
    cp, client = rack
    name = f"lws-{uuid.uuid4().hex[:5]}"
    single_clique_domain(client, name)
    args = BoundJobArgs(name=name, kind="LeaderWorkerSet", parallelism=3, pod_template={"spec": {"containers": [
        {"name": "worker", "image": "registry.invalid/serve:1",
         "command": ["serve", "--rank=$(NVLFABRIC_RANK)", "--leader=$(NVLFABRIC_MASTER_ADDR)"]}]}})
    (lws,) = workload_manifests(args, namespace="default", claim_name=f"{name}-channel", domain=name)
    client.create(codecs.from_dict(lws))

    pods = eventually("the group's three pods to run", lambda: running(client, name, 3), timeout=120)
    status = ready_domain_status(client, name)
    channel = status["channel"]
    leader = f"{name}-0.{name}.default"  # LWS's own address of the group's leader
    for pod in pods:
        rec = container_record(cp, pod, "worker")
        env = rec["containerEnv"]
        rank = pod.metadata.labels[WORKER_INDEX]
        assert env["LWS_LEADER_ADDRESS"] == leader
        assert env["NVLFABRIC_RANK"] == env["RANK"] == rank and env["WORLD_SIZE"] == "3"
        assert env["NVLFABRIC_MASTER_ADDR"] == env["MASTER_ADDR"] == leader  # our $(LWS_LEADER_ADDRESS), expanded
        assert rec["command"] == ["serve", f"--rank={rank}", f"--leader={leader}"]
        assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c",
                                       "major": 507, "minor": channel}]
    assert sorted(p.metadata.labels[WORKER_INDEX] for p in pods) == ["0", "1", "2"]
    assert client.get(Service, name, namespace="default").spec.clusterIP == "None"
    claim = client.get(ResourceClaim, f"{name}-channel", namespace="default")
    allocation = claim.status.allocation

    # A worker fails (deleted): LWS recreates its whole group, leader and all.
    old = {p.metadata.uid for p in pods}
    worker = next(p for p in pods if p.metadata.labels[WORKER_INDEX] == "1")
    client.delete(Pod, worker.metadata.name, namespace="default")
    again = eventually("the recreated group's three pods to run", lambda: (
        ps if (ps := running(client, name, 3)) and not {p.metadata.uid for p in ps} & old else None), timeout=180)
    after = ready_domain_status(client, name)
    assert (after["clique"], after["channel"]) == (status["clique"], channel), "the group restart moved the domain"
    now = client.get(ResourceClaim, f"{name}-channel", namespace="default")
    assert (now.metadata.uid, now.status.allocation) == (claim.metadata.uid, allocation)
    for pod in again:
        assert container_record(cp, pod, "worker")["deviceNodes"][0]["minor"] == channel

    client.delete(LeaderWorkerSet, name, namespace="default")
    eventually("the group's pods to go", lambda: not list(client.list(Pod, namespace="default",
                                                                       labels={WORKLOAD_LABEL: name})), timeout=120)
    client.delete(ComputeDomainResource, name, namespace="default")  # its claim goes with it (owner)
    eventually("the claim to go, its domain's hold released", lambda: not list(client.list(
        ResourceClaim, namespace="default", fields={"metadata.name": f"{name}-channel"})), timeout=60)
