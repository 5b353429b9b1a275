"""BoundJob(kind="JobSet") run by the real JobSet controller (the simulator's `jobset` addon), end to
end with nvlfabric's agents and controller on two simulated racks:

- stacks/dev as `make demo ADDONS=jobset` runs it (`pulumi up`): its JobSet job over both racks is
  a replicated Job per clique group, each in a rack of its own with that rack's channel and the
  ranks of the whole job; a pod's failure makes JobSet recreate every Job (its failure policy),
  and the new pods get the same domain, claims and channels; `pulumi destroy` leaves nothing;
- beside it, on the stack's driver, a single-clique JobSet: its pods Running with their channel,
  ranks 0..n-1 from their completion indexes, and one rank-0 address, the host JobSet's own
  headless Service names; a member whose node turns sick is replaced on a healthy node of the
  clique by its own Job, with no JobSet restart and the other member untouched (issue 51).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod, Service
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api.names import CLIQUE_GROUP_ANNOTATION, CLIQUE_LABEL, WORKLOAD_LABEL
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim import faults
from nvlfabric.sim.cluster import eventually, ready_domain_status
from nvlfabric.testbed.controlplane import ControlPlane
from nvlfabric.testbed.pulumi_cli import PulumiProject
from tests.conftest import free_ports, simulated_rack, stuck_deletions
from tests.support import installed
from tests.support.installed import platform_project
from tests.support.onsim import container_record, running, single_clique_domain

pytestmark = pytest.mark.cluster
PORTS = free_ports()
RACK = 184  # racks 184 and 185: numbers no other test uses
NODES = 17  # per rack: stacks/dev's jobs with its JobSet take 27 nodes, at most 17 of one rack
JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")


@pytest.fixture(scope="module")
def racks() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, racks=2, nodes=NODES, field_manager="jobset-test",
                        prefix="nvljobset-", addons=("jobset",)) as (cp, client):
        yield cp, client


@pytest.fixture(scope="module")
def stack(racks: tuple[ControlPlane, Client], tmp_path_factory: pytest.TempPathFactory) -> PulumiProject:
    """stacks/dev up on the two racks, as `make demo ADDONS=jobset` brings it up (the last test
    destroys it)."""
    cp, _ = racks
    proj = platform_project(tmp_path_factory.mktemp("jobset") / "dev", Path(sys.prefix), cp.kubeconfig,
                            (installed.REPO / "stacks" / "dev" / "__main__.py").read_text())
    proj.run("stack", "init", "dev")
    for key, value in (("racks", "2"), ("nodesPerRack", str(NODES)), ("firstRack", str(RACK))):
        proj.run("config", "set", key, value)
    preview = proj.run("preview", "--diff").stdout
    # JobSet is served: the job is declared, and no warning says otherwise.
    assert "jobset.x-k8s.io/v1alpha2:JobSet" in preview and "serves no" not in preview, preview[-3000:]
    proj.run("up", "--yes", "--skip-preview", timeout=900)
    assert "jobset" in proj.json("stack", "output", "--json")["jobs"]
    return proj


def test_a_jobset_on_one_clique_runs_with_its_channel_ranks_and_rank_0s_address(
        racks: tuple[ControlPlane, Client], stack: PulumiProject) -> None:
    cp, client = racks
    name = f"js-{uuid.uuid4().hex[:5]}"
    single_clique_domain(client, name)
    # 2 GPUs a pod: both fit one node of the 7 stacks/dev leaves free.
    args = BoundJobArgs(name=name, kind="JobSet", parallelism=2, gpus_per_pod=2, pod_template={"spec": {"containers": [
        {"name": "worker", "image": "registry.invalid/train:1",
         "command": ["torchrun", "--node-rank=$(NVLFABRIC_RANK)", "--master-addr=$(NVLFABRIC_MASTER_ADDR)"]}]}})
    objs = workload_manifests(args, namespace="default", claim_name=f"{name}-channel", domain=name)
    assert [o["kind"] for o in objs] == ["JobSet"]  # JobSet makes its own headless Service
    client.create(codecs.from_dict(objs[0]))

    pods = eventually("the JobSet's two pods to run", lambda: running(client, name, 2), timeout=120)
    status = ready_domain_status(client, name)
    channel = status["channel"]
    master = f"{name}-workers-0-0.{name}.default.svc"
    for pod in pods:
        rec = container_record(cp, pod, "worker")
        env = rec["containerEnv"]
        rank = pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        assert env["NVLFABRIC_RANK"] == env["RANK"] == rank
        assert env["NVLFABRIC_WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == master
        assert rec["command"] == ["torchrun", f"--node-rank={rank}", f"--master-addr={master}"]
        # rank 0's address is this pod's own name under JobSet's Service
        assert (pod.spec.hostname, pod.spec.subdomain) == (f"{name}-workers-0-{rank}", name)
        assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c",
                                       "major": 507, "minor": channel}]
    assert sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert client.get(Service, name, namespace="default").spec.clusterIP == "None"
    claim = client.get(ResourceClaim, f"{name}-channel", namespace="default")
    # its pods, and the domain's hold that keeps its channel through a restart
    assert {(r.resource, r.name) for r in claim.status.reservedFor} == {
        *(("pods", p.metadata.name) for p in pods), ("computedomains", name)}

    # Issue 51: a member's node turns sick (fabric degraded) while a node of the clique is free.
    # The controller fails that pod as disrupted; its Job's podFailurePolicy ignores the failure
    # and recreates the index on a healthy node of the clique, on the same claim and channel.
    # JobSet restarts nothing (no Job failed) and the other member is untouched.
    nodes = {n.name: n for n in cp.nodes()}
    index = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    sick, stays = index["1"], index["0"]
    clique_of = {n.metadata.name: (n.metadata.labels or {}).get(CLIQUE_LABEL) for n in client.list(Node)}
    faults.inject(cp.state_dir, nodes[sick.spec.nodeName], "fabric-degraded")
    try:
        healed = eventually("the sick node's pod to be replaced and run on a healthy node", lambda: (
            ps if (ps := running(client, name, 2)) and sick.metadata.uid not in {p.metadata.uid for p in ps}
            else None), timeout=120)
        (new,) = [p for p in healed if p.metadata.uid != stays.metadata.uid]
        assert new.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1"
        assert new.spec.nodeName != sick.spec.nodeName
        assert clique_of[new.spec.nodeName] == clique_of[sick.spec.nodeName] == status["clique"]
        kept = client.get(Pod, stays.metadata.name, namespace="default")
        assert kept.metadata.uid == stays.metadata.uid
        assert [c.restartCount for c in kept.status.containerStatuses] == [0]
        assert (client.get(JobSet, name, namespace="default").get("status") or {}).get("restarts", 0) == 0
        assert container_record(cp, new, "worker")["deviceNodes"] == [
            {"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c", "major": 507, "minor": channel}]
        after = ready_domain_status(client, name)
        assert (after["clique"], after["channel"]) == (status["clique"], channel)
    finally:
        faults.inject(cp.state_dir, nodes[sick.spec.nodeName], "clear")

    # Out of the way of the stack's jobs: the JobSet, then the domain once its pods are gone.
    client.delete(JobSet, name, namespace="default")
    try:
        eventually("the JobSet's pods to go", lambda: not list(client.list(Pod, namespace="default",
                                                                        labels={WORKLOAD_LABEL: name})), timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stuck_deletions(cp, client)}") from exc
    client.delete(ResourceClaim, f"{name}-channel", namespace="default")
    client.delete(ComputeDomainResource, name, namespace="default")


def test_stacks_dev_runs_its_jobset_over_both_racks_and_a_restart_keeps_its_domain(
        racks: tuple[ControlPlane, Client], stack: PulumiProject) -> None:
    cp, client = racks
    pods = eventually("the JobSet's four pods to run", lambda: running(client, "jobset", 4), timeout=300)
    status = ready_domain_status(client, "jobset")
    groups = {g["index"]: g for g in status["groups"]}
    clique_of = {n.metadata.name: (n.metadata.labels or {})[CLIQUE_LABEL] for n in client.list(Node)}
    jobset = client.get(JobSet, "jobset", namespace="default")
    assert [r["name"] for r in jobset["spec"]["replicatedJobs"]] == ["workers-0", "workers-1"]
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 3, "restartStrategy": "BlockingRecreate"}

    def check(pods: list[Pod]) -> dict[str, str]:
        """Each group whole in its own rack, with its rack's channel of the domain; the ranks of
        the whole job; one rank-0 address. Returns pod hostname → node."""
        cliques: dict[int, set[str]] = {}
        ranks = []
        for p in pods:
            g = int(p.metadata.annotations[CLIQUE_GROUP_ANNOTATION])
            cliques.setdefault(g, set()).add(clique_of[p.spec.nodeName])
            rec = container_record(cp, p, "trainer")
            env = rec["containerEnv"]
            ranks.append(int(env["NVLFABRIC_RANK"]))
            index = int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"])
            assert int(env["NVLFABRIC_RANK"]) == g * 2 + index, p.metadata.name
            assert env["NVLFABRIC_MASTER_ADDR"] == "jobset-workers-0-0-0.jobset.default.svc"
            assert (p.spec.hostname, p.spec.subdomain) == (f"jobset-workers-{g}-0-{index}", "jobset")
            channel = groups[g]["channel"]
            assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}",
                                           "type": "c", "major": 507, "minor": channel}], p.metadata.name
        assert sorted(ranks) == list(range(4))
        assert all(len(c) == 1 for c in cliques.values()) and cliques[0] != cliques[1], cliques
        assert cliques == {g: {groups[g]["clique"]} for g in (0, 1)}
        return {p.spec.hostname: p.spec.nodeName for p in pods}

    check(pods)
    claims = {c.metadata.name: (c.metadata.uid, c.status.allocation)
              for c in client.list(ResourceClaim, namespace="default") if c.metadata.name.startswith("jobset-")}
    assert len(claims) == 2

    # One pod fails (deleted under its Job, whose backoffLimit is 0): JobSet recreates all its Jobs.
    old = {p.metadata.uid for p in pods}
    client.delete(Pod, pods[0].metadata.name, namespace="default")
    eventually("JobSet to restart the job", lambda: (client.get(JobSet, "jobset", namespace="default")
                                                      .get("status") or {}).get("restarts") == 1, timeout=120)
    again = eventually("the restarted JobSet's four pods to run", lambda: (
        ps if (ps := running(client, "jobset", 4)) and not {p.metadata.uid for p in ps} & old else None),
        timeout=300)
    assert {j.metadata.labels["jobset.sigs.k8s.io/restart-attempt"]
            for j in client.list(Job, namespace="default", labels={"jobset.sigs.k8s.io/jobset-name": "jobset"})} \
        == {"1"}
    after = ready_domain_status(client, "jobset")
    assert [(g["index"], g["clique"], g["channel"]) for g in after["groups"]] == [
        (g["index"], g["clique"], g["channel"]) for g in status["groups"]], "the restart moved the job"
    check(again)  # (against the channels and cliques from before the restart)
    # The claims were never deallocated in between (their allocation, timestamp and all, is the same).
    assert {c.metadata.name: (c.metadata.uid, c.status.allocation)
            for c in client.list(ResourceClaim, namespace="default") if c.metadata.name in claims} == claims
    for name in claims:  # the claim is the new pods' alone
        reserved = {r.name for r in client.get(ResourceClaim, name, namespace="default").status.reservedFor or []
                    if r.resource == "pods"}
        assert reserved <= {p.metadata.name for p in again}, (name, reserved)

    try:
        stack.run("destroy", "--yes", "--skip-preview", timeout=600)
    except Exception as exc:
        raise AssertionError(f"destroy failed: {exc!r}\n{stuck_deletions(cp, client)}") from exc
    assert not list(client.list(JobSet, namespace="default"))
    assert not list(client.list(Pod, namespace="default"))
    assert not list(client.list(ResourceClaim, namespace="default"))
    for node in cp.nodes():
        assert not list((node.driver_root / "dev" / "nvidia-caps-imex-channels").glob("channel*")), node.name
