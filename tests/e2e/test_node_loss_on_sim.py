"""A member node dies under a running job and the domain heals onto a spare (issue 51), on the
simulator: the driver deployed from its manifests, a BoundJob-shaped Job of 2 pods x 4 GPUs on a
rack of 3 nodes (one free), the node lifecycle controller's grace shortened to 20 s as clusters do.

1. The node of pod 0 stops its kubelet (`fault node-down`): once the API shows the Node NotReady,
   the domain names the node lost (status.lostNodes, NodesAvailable, Event NodeLost) within 10 s;
   pod 0 is failed as disrupted and the Job creates it again, which runs on the free node, on the
   same claim and channel; the other member's pod and IMEX daemon are untouched; the domain is
   Ready again.
2. The node of pod 1 dies too, and no node is free: the replacement stays gated (no node, no GPU)
   with a WaitingForNode Event, and the domain says it waits for a node.
3. The first node comes back: the waiting replacement runs there; nothing of the old pods is left
   (the claim's reservedFor holds live pods and the domain only).

On the same rack, afterwards, an elastic job (BoundJob max_parallelism) on a Dedicated domain
declared without numNodes grows from 1 pod to 3 and shrinks to 2 (its Job's size set as its
JobParallelism resource sets it): the new pods join the running domain, whose daemons learn the
new members without a restart, and which is Ready at each size with those nodes; the pod that
stays is not touched; the node the job leaves has no daemon of the domain and no prepared claim
left.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import CascadeType, PatchType

from nvlfabric import manifests
from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.components.workloadargs import BoundJobArgs
from nvlfabric.components.workloadmanifests import workload_manifests
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider import jobparallelism
from nvlfabric.provider.nvlfabricdomain import channel_claim
from nvlfabric.sim import faults
from nvlfabric.sim.cluster import eventually, install_crd, job_pods, ready_domain_status
from nvlfabric.testbed.controlplane import ControlPlane
from tests.conftest import free_ports, simulated_rack
from tests.support.agents import imex_daemon, pod_gone

pytestmark = pytest.mark.cluster
RACK = 196  # addresses 127.10.196.x: a rack number no other test uses
GRACE_S = 20  # --node-monitor-grace-period: the kubelets here renew their Lease every 10 s
DETECT_S = 10.0  # the promise: the domain names the node within 10 s of the API showing it NotReady


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=3, field_manager="node-loss", prefix="nvlnl-",
                        extra_args={"kube-controller-manager": [f"--node-monitor-grace-period={GRACE_S}s",
                                                                "--node-monitor-period=1s"]}) as (cp, client):
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, field_manager="node-loss", force=True)
        yield cp, client


def bound_job(client: Client, name: str, pods: int, most: int | None = None) -> None:
    """A ComputeDomain (numNodes = pods; an elastic job's: none), its channel claim, and BoundJob's
    Job of `pods` x 4 GPUs (elastic up to `most`)."""
    spec: dict[str, Any] = {"numNodes": pods} if most is None else {"imexMode": "Dedicated"}
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec=spec))
    client.create(codecs.from_dict(channel_claim(name, "default", cd.metadata.uid,
                                                 api.ComputeDomainSpec.model_validate(spec))))
    args = BoundJobArgs(name=name, parallelism=pods, max_parallelism=most, pod_template={"spec": {"containers": [
        {"name": "worker", "image": "registry.invalid/train:1"}]}})
    for obj in workload_manifests(args, namespace="default", claim_name=f"{name}-channel", domain=name):
        client.create(codecs.from_dict(obj))


def status(client: Client, name: str) -> dict[str, Any]:
    got = client.get(ComputeDomainResource, name, namespace="default").status
    return got if isinstance(got, dict) else {}


def running(client: Client, job: str, index: str) -> Pod | None:
    p = job_pods(client, job).get(index)
    return p if p is not None and p.status.phase == "Running" else None


def not_ready_since(client: Client, node: str) -> float | None:
    ready = next((c for c in client.get(Node, node).status.conditions or [] if c.type == "Ready"), None)
    return time.monotonic() if ready is not None and ready.status != "True" else None


def events(client: Client, name: str, reason: str) -> list[Event]:
    return [e for e in client.list(Event, namespace="default", fields={"involvedObject.name": name})
            if e.reason == reason]


def test_a_lost_node_is_named_replaced_on_a_spare_and_waits_when_none_is_free(
        sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    nodes = {n.name: n for n in cp.nodes()}
    eventually("every agent to label its Node with the clique", lambda: all(
        (client.get(Node, n).metadata.labels or {}).get(names.CLIQUE_LABEL) for n in nodes), timeout=120)
    job = f"nl-{uuid.uuid4().hex[:5]}"
    bound_job(client, job, 2)
    eventually("both pods to run", lambda: running(client, job, "0") and running(client, job, "1"), timeout=120)
    before = ready_domain_status(client, job)
    first, second = job_pods(client, job)["0"], job_pods(client, job)["1"]
    (spare,) = set(nodes) - {first.spec.nodeName, second.spec.nodeName}
    clique = before["clique"]
    daemon_before, _ = imex_daemon(nodes[second.spec.nodeName], clique)

    # 1. The node of pod 0 dies: named within 10 s of the API showing it, replaced on the spare.
    faults.inject(cp.state_dir, nodes[first.spec.nodeName], "node-down")
    seen = eventually("the Node to be NotReady", lambda: not_ready_since(client, first.spec.nodeName),
                      timeout=GRACE_S + 30, interval=0.1)
    named = eventually("the domain to name the lost node", lambda: time.monotonic() if [
        n["name"] for n in status(client, job).get("lostNodes", [])] == [first.spec.nodeName] else None,
        timeout=DETECT_S + 5, interval=0.1)
    print(f"node loss named {named - seen:.1f} s after the API showed it")
    assert named - seen <= DETECT_S
    lost = status(client, job)
    assert lost["lostNodes"][0]["reason"] == "NodeNotReady"
    available = next(c for c in lost["conditions"] if c["type"] == "NodesAvailable")
    assert available["status"] == "False" and first.spec.nodeName in available["message"]
    assert lost["phase"] == "Degraded"
    eventually("a NodeLost Event on the domain", lambda: events(client, job, "NodeLost"), timeout=10)

    healed = eventually("pod 0's replacement to run", lambda: running(client, job, "0"), timeout=60)
    print(f"healed {time.monotonic() - seen:.1f} s after the API showed the loss")
    assert healed.metadata.uid != first.metadata.uid and healed.spec.nodeName == spare
    assert [c.resourceClaimName for c in healed.spec.resourceClaims] == [f"{job}-channel"]
    after = ready_domain_status(client, job, timeout=30)
    assert (after["clique"], after["channel"]) == (before["clique"], before["channel"])
    assert sorted(n["name"] for n in after["nodes"]) == sorted([spare, second.spec.nodeName])
    # The other member was not touched: same pod, no restart, the same IMEX daemon.
    still = job_pods(client, job)["1"]
    assert still.metadata.uid == second.metadata.uid
    assert [c.restartCount for c in still.status.containerStatuses] == [0]
    assert imex_daemon(nodes[second.spec.nodeName], clique)[0] == daemon_before
    gone = client.get(Pod, first.metadata.name, namespace="default") if any(
        p.metadata.name == first.metadata.name for p in client.list(Pod, namespace="default")) else None
    if gone is not None:  # still held by the Job's finalizer: failed as disrupted by nvlfabric
        assert gone.status.phase == "Failed"
        assert any(c.type == "DisruptionTarget" and c.reason == names.DISRUPTION_REASON
                   for c in gone.status.conditions)

    # 2. The node of pod 1 dies too and no node is free: the replacement waits, gated, holding nothing.
    faults.inject(cp.state_dir, nodes[second.spec.nodeName], "node-down")
    waiting = eventually("pod 1's replacement to wait gated", lambda: (
        p if (p := job_pods(client, job).get("1")) is not None and p.metadata.uid != second.metadata.uid
        and names.RESERVATION_GATE in [g.name for g in p.spec.schedulingGates or []] else None), timeout=GRACE_S + 60)
    eventually("a WaitingForNode Event on it", lambda: events(client, waiting.metadata.name, "WaitingForNode"),
               timeout=30)
    assert not client.get(Pod, waiting.metadata.name, namespace="default").spec.nodeName
    says = eventually("the domain to say it waits for a node", lambda: next((
        c for c in status(client, job).get("conditions", []) if c["type"] == "NodesAvailable"
        and "waiting for a node" in c["message"]), None), timeout=30)
    assert second.spec.nodeName in says["message"]

    # 3. The first node comes back: the waiting replacement runs there; no old pod is left on the claim.
    faults.inject(cp.state_dir, nodes[first.spec.nodeName], "clear")
    back = eventually("pod 1's replacement to run on the node that came back", lambda: running(client, job, "1"),
                      timeout=GRACE_S + 90)
    assert back.spec.nodeName == first.spec.nodeName
    final = ready_domain_status(client, job, timeout=60)
    assert (final["clique"], final["channel"]) == (before["clique"], before["channel"])
    live = {p.metadata.uid for p in job_pods(client, job).values()}
    cd_uid = client.get(ComputeDomainResource, job, namespace="default").metadata.uid
    reserved = {r.uid for r in client.get(ResourceClaim, f"{job}-channel", namespace="default").status.reservedFor}
    assert reserved <= live | {cd_uid}, reserved - live
    faults.inject(cp.state_dir, nodes[second.spec.nodeName], "clear")


def resize(client: Client, job: str, pods: int) -> None:
    """The elastic Job's new size, applied as its JobParallelism resource applies it."""
    args = jobparallelism.JobParallelismArgs(name=job, namespace="default", parallelism=pods)
    client.patch(Job, job, jobparallelism.size_patch(args), namespace="default", patch_type=PatchType.APPLY,
                 field_manager=jobparallelism.FIELD_MANAGER, force=True)


def prepared(node: Any, claim_uid: str) -> bool:
    """Whether `node`'s agent holds `claim_uid` prepared (its checkpoint)."""
    path = node.kubelet_root / "plugins" / names.DRIVER / "checkpoint.json"
    return path.exists() and claim_uid in json.loads(path.read_text()).get("claims", {})


def test_a_domain_without_num_nodes_grows_and_shrinks_with_its_elastic_job(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    nodes = {n.name: n for n in cp.nodes()}
    for old in client.list(Job, namespace="default"):  # the rack to itself (the loss test's job is done)
        client.delete(Job, old.metadata.name, namespace="default", cascade=CascadeType.BACKGROUND)
    eventually("the other jobs' pods to go", lambda: not list(client.list(Pod, namespace="default")) or None,
               timeout=90)
    eventually("every node to be Ready", lambda: all(not_ready_since(client, n) is None for n in nodes) or None,
               timeout=GRACE_S + 60)
    job = f"el-{uuid.uuid4().hex[:5]}"
    bound_job(client, job, 1, most=3)
    first = eventually("pod 0 to run", lambda: running(client, job, "0"), timeout=120)
    before = ready_domain_status(client, job)
    assert [n["name"] for n in before["nodes"]] == [first.spec.nodeName]
    clique = before["clique"]
    uid = client.get(ComputeDomainResource, job, namespace="default").metadata.uid

    def daemon(node: str) -> tuple[list[int], str]:  # the domain's own daemon there, and its nodes file
        return imex_daemon(nodes[node], clique, uid)

    pids = daemon(first.spec.nodeName)[0]
    assert len(pids) == 1
    claim_uid = client.get(ResourceClaim, f"{job}-channel", namespace="default").metadata.uid

    def untouched(members: int) -> None:
        still = job_pods(client, job)["0"]
        assert (still.metadata.uid, [c.restartCount for c in still.status.containerStatuses]) == (
            first.metadata.uid, [0])
        addresses = sorted(nodes[p.spec.nodeName].address for p in job_pods(client, job).values())
        assert len(addresses) == members
        for p in job_pods(client, job).values():
            eventually(f"{p.spec.nodeName}'s daemon to know the {members} members", lambda p=p: (
                daemon(p.spec.nodeName)[1].split() == addresses), timeout=30)
        assert daemon(first.spec.nodeName)[0] == pids

    def ready_with(count: int) -> dict[str, Any] | None:
        got = status(client, job)
        members = got.get("nodes") or []
        return got if got.get("phase") == "Ready" and len(members) == count and all(
            n.get("ready") for n in members) else None

    # Grown by 2: the new pods join the running domain, which is Ready with 3 nodes.
    start = time.monotonic()
    resize(client, job, 3)
    grown = eventually("the domain to be Ready with 3 nodes", lambda: ready_with(3), timeout=120)
    print(f"grown by 2 in {time.monotonic() - start:.1f} s")
    pods = job_pods(client, job)
    assert {p.spec.nodeName for p in pods.values()} == set(nodes) == {n["name"] for n in grown["nodes"]}
    assert (grown["clique"], grown["channel"]) == (before["clique"], before["channel"])
    untouched(3)
    # `kubectl describe cd` says who joined (a grow may come over one pass or two).
    new_nodes = sorted(set(nodes) - {first.spec.nodeName})

    def joined() -> list[str]:
        return sorted(n for e in events(client, job, "MembersChanged") for part in (e.message or "").split("; ")
                      if part.startswith("joined: ") for n in part.removeprefix("joined: ").split(", "))

    eventually("MembersChanged Events naming the joined nodes", lambda: joined() == new_nodes, timeout=30)

    # Shrunk by 1: the last index leaves; its node's daemon stops and its claim is unprepared.
    leaving = pods["2"]
    start = time.monotonic()
    resize(client, job, 2)
    shrunk = eventually("the domain to be Ready with 2 nodes", lambda: ready_with(2), timeout=120)
    print(f"shrunk by 1 in {time.monotonic() - start:.1f} s")
    assert leaving.spec.nodeName not in {n["name"] for n in shrunk["nodes"]}
    eventually("the leaving pod to be gone", lambda: pod_gone(client, leaving.metadata.name), timeout=60)
    gone = nodes[leaving.spec.nodeName]
    eventually("the left node's daemon of the domain to stop", lambda: daemon(leaving.spec.nodeName) == ([], ""),
               timeout=60)
    eventually("the left node's claim to be unprepared", lambda: not prepared(gone, claim_uid), timeout=60)
    assert all(prepared(nodes[p.spec.nodeName], claim_uid) for p in job_pods(client, job).values())
    reserved = {r.uid for r in client.get(ResourceClaim, f"{job}-channel", namespace="default").status.reservedFor}
    assert leaving.metadata.uid not in reserved
    assert not shrunk.get("lostNodes"), shrunk["lostNodes"]
    untouched(2)
    left = eventually("a MembersChanged Event naming the left node", lambda: [
        e for e in events(client, job, "MembersChanged") if f"left: {leaving.spec.nodeName}" in (e.message or "")],
        timeout=30)
    assert left[0].type == "Normal" and "2 member nodes now" in left[0].message, left[0].message
