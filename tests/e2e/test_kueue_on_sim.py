"""Kueue and nvlfabric agree on what runs (nvlfabric/controller/admission.py), end to end with the
real Kueue and JobSet (the simulator's addons), nvlfabric's agents and controller, on six
simulated racks: two 4-rack jobs (BoundJob JobSets over MultiClique domains, queued in one
LocalQueue whose ClusterQueue has quota for both) cannot both be placed. Kueue admits the first
once nvlfabric has placed its four groups; the second waits queued, its quota not held, none of
its pods created, its check saying why; when the first finishes, the second is admitted and
placed, all four groups at once. Nothing is ever half placed, and Kueue's quota counts the GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod

from nvlfabric import manifests
from nvlfabric.api.names import CLIQUE_GROUP_ANNOTATION, CLIQUE_LABEL, PLACEMENT_CHECK_CONTROLLER, WORKLOAD_LABEL
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.sim.kubelet.kubelet import RUN_SECONDS_ANNOTATION
from nvlfabric.testbed.controlplane import ControlPlane
from tests.conftest import free_ports, simulated_rack
from tests.support.onsim import multi_clique_domain

pytestmark = pytest.mark.cluster
PORTS = free_ports()
RACK = 210  # racks 210..215: numbers no other test uses
KUEUE = ("kueue.x-k8s.io", "v1beta1")
ResourceFlavor = create_global_resource(*KUEUE, "ResourceFlavor", "resourceflavors")
ClusterQueue = create_global_resource(*KUEUE, "ClusterQueue", "clusterqueues")
AdmissionCheck = create_global_resource(*KUEUE, "AdmissionCheck", "admissionchecks")
LocalQueue = create_namespaced_resource(*KUEUE, "LocalQueue", "localqueues")
KueueWorkload = create_namespaced_resource(*KUEUE, "Workload", "workloads")
JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")  # (codecs needs it known)
RUN_S = 40  # each job's pods run this long, then succeed


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, racks=6, nodes=2, field_manager="kueue-test",
                        prefix="nvlkueue-", addons=("jobset", "kueue")) as (cp, client):
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, force=True)
        eventually("the agents to label every node with its clique", lambda: all(
            CLIQUE_LABEL in (n.metadata.labels or {}) for n in client.list(Node)), timeout=120)
        client.create(ResourceFlavor(metadata=ObjectMeta(name="gb200"), spec={}))
        client.create(AdmissionCheck(metadata=ObjectMeta(name="nvlfabric-placement"),
                                     spec={"controllerName": PLACEMENT_CHECK_CONTROLLER}))
        # Quota for 64 GPUs, more than the 48 of the six racks: quota alone would admit both jobs.
        client.create(ClusterQueue(metadata=ObjectMeta(name="gpus"), spec={
            "namespaceSelector": {}, "admissionChecks": ["nvlfabric-placement"],
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": "gb200", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 64}]}]}]}))
        client.create(LocalQueue(metadata=ObjectMeta(name="team-a", namespace="default"),
                                 spec={"clusterQueue": "gpus"}))
        eventually("nvlfabric's admission check to be Active", lambda: any(
            c.get("type") == "Active" and c.get("status") == "True"
            for c in (client.get(AdmissionCheck, "nvlfabric-placement").get("status") or {}).get("conditions") or []),
            timeout=60)
        yield cp, client


def _submit(client: Client, name: str) -> None:
    """A 4-rack job: a MultiClique domain of 4 clique groups, a JobSet of 8 pods x 4 GPUs queued in team-a."""
    claims = multi_clique_domain(client, name, cliques=4, num_nodes=8)
    args = BoundJobArgs(name=name, kind="JobSet", parallelism=8, gpus_per_pod=4, clique_groups=4,
                        queue_name="team-a", pod_template={
                            "metadata": {"annotations": {RUN_SECONDS_ANNOTATION: str(RUN_S)}},
                            "spec": {"containers": [{"name": "trainer", "image": "registry.invalid/train:1"}]}})
    (jobset,) = workload_manifests(args, namespace="default", claim_name=claims[0], domain=name, claims=claims)
    client.create(codecs.from_dict(jobset))


def _workload(client: Client, job: str) -> dict[str, Any] | None:
    for wl in client.list(KueueWorkload, namespace="default"):
        raw = wl.to_dict()
        if any(o.get("name") == job for o in raw["metadata"].get("ownerReferences") or []):
            return dict(raw)
    return None


def _admitted(wl: dict[str, Any] | None) -> bool:
    return wl is not None and any(c.get("type") == "Admitted" and c.get("status") == "True"
                                  for c in (wl.get("status") or {}).get("conditions") or [])


def _pods(client: Client, job: str) -> list[Pod]:
    return [p for p in client.list(Pod, namespace="default", labels={WORKLOAD_LABEL: job})
            if p.metadata.deletionTimestamp is None]


def test_two_jobs_that_cannot_both_be_placed_run_one_after_the_other_never_half_placed(
        cluster: tuple[ControlPlane, Client]) -> None:
    _, client = cluster
    clique_of = {n.metadata.name: (n.metadata.labels or {})[CLIQUE_LABEL] for n in client.list(Node)}
    _submit(client, "first")
    eventually("Kueue to admit the first job", lambda: _admitted(_workload(client, "first")), timeout=90)
    _submit(client, "second")

    def running(job: str) -> list[Pod]:
        return [p for p in _pods(client, job) if p.status and p.status.phase == "Running"]

    first = eventually("the first job's 8 pods to run", lambda: ps if len(ps := running("first")) == 8 else None,
                       timeout=120)
    groups: dict[str, set[str]] = {}
    for p in first:
        groups.setdefault(p.metadata.annotations[CLIQUE_GROUP_ANNOTATION], set()).add(clique_of[p.spec.nodeName])
    assert len(groups) == 4 and all(len(c) == 1 for c in groups.values()), groups
    assert len({next(iter(c)) for c in groups.values()}) == 4, f"two groups in one rack: {groups}"

    # The second: quota would allow it, room does not. nvlfabric's check says so and Kueue keeps
    # it queued, none of its pods made, while the first runs.
    # (Kueue resets the check to Pending as it requeues; the reason is an Event on the Workload.)
    said = eventually("nvlfabric's check to turn the second job away", lambda: next(
        (e.message for e in client.list(Event, namespace="default", fields={"reason": "NoCliqueRoom"})
         if e.involvedObject.kind == "Workload" and e.involvedObject.name == (_workload(client, "second") or {})
         .get("metadata", {}).get("name")), None), timeout=60)
    assert "4 clique groups needs 4 cliques with room, 2 have it" in said, said
    usage = (client.get(ClusterQueue, "gpus").get("status") or {}).get("flavorsUsage") or []
    assert usage and usage[0]["resources"][0]["total"] == "32", usage  # the admitted job's 8 x 4 GPUs
    while running("first"):  # (its pods succeed after RUN_S)
        assert not _pods(client, "second"), "the second job has pods while the first runs: half placed"
        assert not _admitted(_workload(client, "second")), "admitted with no room for it"
        time.sleep(1)

    second = eventually("the second job's 8 pods to run once the first is done",
                        lambda: ps if len(ps := running("second")) == 8 else None, timeout=180)
    groups = {}
    for p in second:
        groups.setdefault(p.metadata.annotations[CLIQUE_GROUP_ANNOTATION], set()).add(clique_of[p.spec.nodeName])
    assert len(groups) == 4 and all(len(c) == 1 for c in groups.values()), groups
    check = next(c for c in (_workload(client, "second") or {})["status"]["admissionChecks"]
                 if c["name"] == "nvlfabric-placement")
    assert check["state"] == "Ready" and len(check["podSetUpdates"]) == 4, check
    assert {u["name"] for u in check["podSetUpdates"]} == {f"workers-{g}" for g in range(4)}
