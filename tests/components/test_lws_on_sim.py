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
from lightkube.types import PatchType

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
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"


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


def test_an_elastic_leaderworkerset_grows_and_shrinks_by_whole_groups_leaving_the_others_running(
        rack: tuple[ControlPlane, Client]) -> None:
    """Issue 51 item 3 for LeaderWorkerSet: groups of lws_size pods; a new size is a new replicas
    (what `pulumi up` sends: the manifests differ in nothing else), so LWS adds or removes whole
    groups, the new ones join the running domain (same claim, channel) and the groups that stay
    keep their pods (same uids, no restart)."""
    cp, client = rack
    name = f"lwse-{uuid.uuid4().hex[:5]}"
    single_clique_domain(client, name)

    def manifest(pods: int) -> dict[str, object]:
        args = BoundJobArgs(name=name, kind="LeaderWorkerSet", parallelism=pods, lws_size=2, max_parallelism=6,
                            gpus_per_pod=2, pod_template={"spec": {"containers": [
                                {"name": "worker", "image": "registry.invalid/serve:1"}]}})
        (lws,) = workload_manifests(args, namespace="default", claim_name=f"{name}-channel", domain=name)
        return lws

    assert {k: v for k, v in manifest(4)["spec"].items() if k != "replicas"} == \
        {k: v for k, v in manifest(6)["spec"].items() if k != "replicas"}
    client.create(codecs.from_dict(manifest(4)))

    def groups() -> dict[str, set[str]]:
        pods = running(client, name, len(list(client.list(Pod, namespace="default", labels={WORKLOAD_LABEL: name}))))
        out: dict[str, set[str]] = {}
        for p in pods or []:
            out.setdefault(p.metadata.labels[GROUP_INDEX], set()).add(p.metadata.uid)
        return out

    try:
        first = eventually("two groups of two to run", lambda: (g if len(g := groups()) == 2
                                                                 and all(len(v) == 2 for v in g.values()) else None),
                           timeout=120)
        channel = ready_domain_status(client, name)["channel"]
        for pods, want in ((6, 3), (2, 1)):  # grown by a group, then shrunk below where it started
            client.patch(LeaderWorkerSet, name, {"spec": {"replicas": pods // 2}}, namespace="default",
                         patch_type=PatchType.MERGE)
            now = eventually(f"{want} groups to run", lambda want=want: (
                g if len(g := groups()) == want and all(len(v) == 2 for v in g.values()) else None), timeout=120)
            for index in set(now) & set(first):
                assert now[index] == first[index], f"group {index} was recreated"
            status = ready_domain_status(client, name)
            assert status["channel"] == channel
            for p in client.list(Pod, namespace="default", labels={WORKLOAD_LABEL: name}):
                if p.metadata.deletionTimestamp is None:
                    assert container_record(cp, p, "worker")["deviceNodes"][0]["minor"] == channel
                    assert [c.restartCount for c in p.status.containerStatuses] == [0]
        assert set(now) == {"0"}
        left = {p.spec.nodeName for p in client.list(Pod, namespace="default", labels={WORKLOAD_LABEL: name})}
        eventually("the domain's members to be the remaining group's nodes", lambda: {
            n["name"] for n in ready_domain_status(client, name).get("nodes", [])} == left, timeout=60)
    finally:
        client.delete(LeaderWorkerSet, name, namespace="default")
        eventually("the groups' pods to go", lambda: not list(client.list(Pod, namespace="default",
                                                                           labels={WORKLOAD_LABEL: name})), timeout=120)
        client.delete(ComputeDomainResource, name, namespace="default")
