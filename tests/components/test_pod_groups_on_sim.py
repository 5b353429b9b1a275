"""The other path of one job over racks: a cluster with Kubernetes 1.37's workload scheduling on
(`nvlfabric-sim up --workload-scheduling`) places BoundJob's groups itself. Real agents, the
controller and the real kube-scheduler: each clique group a gang in one rack with that rack's own
channel, its claim reserved for its PodGroup (no pod in `reservedFor`), global ranks from the
controller; and all or nothing: a job whose second group finds no room starts no pod at all,
until room frees. Also what `scheduling.probe` tells the component on each kind of cluster."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import CascadeType

from nvlfabric import manifests
from nvlfabric.api import computedomain as api
from nvlfabric.api.names import CLIQUE_LABEL, COMPUTE_DOMAIN_LABEL, RANK_ANNOTATION, RESERVATION_GATE
from nvlfabric.clusterview import scheduling
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster, free_ports, simulated_rack

pytestmark = pytest.mark.cluster
PORTS = free_ports()
RACK = 186  # racks 186 and 187: numbers no other test uses
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "podgroup_stack"
PodGroup = create_namespaced_resource("scheduling.k8s.io", "v1beta1", "PodGroup", "podgroups")
Workload = create_namespaced_resource("scheduling.k8s.io", "v1beta1", "Workload", "workloads")
WORKER = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1", "command": [
    "torchrun", "--nnodes=$(NVLFABRIC_WORLD_SIZE)", "--node-rank=$(NVLFABRIC_RANK)"]}]}}


@pytest.fixture(scope="module")
def racks() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, racks=2, nodes=2, field_manager="podgroup-test",
                        prefix="nvlpg-", workload_scheduling=True) as (cp, client):
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, force=True)
        yield cp, client


def start_job(client: Client, name: str, *, cliques: int, pods: int) -> list[str]:
    """A ComputeDomain of `cliques` groups and a BoundJob of `pods` x 4 GPUs over it, Kubernetes
    scheduling it; returns the channel claims."""
    placement = {"scope": "MultiClique", "cliques": cliques} if cliques > 1 else {}
    spec = api.ComputeDomainSpec.model_validate({"numNodes": pods, **({"placement": placement} if placement else {})})
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"),
                                             spec=spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    claims = api.channel_claim_names(name, spec)
    for g in range(len(claims)):
        client.create(codecs.from_dict(channel_claim(name, "default", cd.metadata.uid, spec, g)))
    apis = scheduling.probe(client, "default")
    assert apis is not None and apis.usable, apis
    args = BoundJobArgs(name=name, parallelism=pods, gpus_per_pod=4, clique_groups=cliques, pod_template=WORKER)
    for obj in workload_manifests(args, namespace="default", claim_name=claims[0], domain=name, claims=claims,
                                  apis=apis):
        client.create(codecs.from_dict(obj))
    return claims


def job_pods(client: Client, name: str) -> list[Pod]:
    return list(client.list(Pod, namespace="default", labels={"nvlfabric.io/workload": name}))


def running(client: Client, name: str, n: int) -> list[Pod] | None:
    ps = [p for p in job_pods(client, name) if p.status and p.status.phase == "Running"]
    return ps if len(ps) == n else None


def test_the_probe_finds_the_apis_here_and_none_on_a_cluster_without_the_gates(
        racks: tuple[ControlPlane, Client], cluster: Cluster) -> None:
    apis = scheduling.probe(racks[1], "no-such-namespace")  # falls back to `default` for the dry run
    assert apis == scheduling.WorkloadApis("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1beta1",
                                           "scheduling.k8s.io/v1alpha3")
    assert scheduling.probe(cluster.client, "default") is None


def test_kubernetes_places_each_group_in_a_rack_of_its_own_with_its_claim_reserved_for_the_group(
        racks: tuple[ControlPlane, Client]) -> None:
    cp, client = racks
    name = f"pg-{uuid.uuid4().hex[:5]}"
    claims = start_job(client, name, cliques=2, pods=4)
    pods = eventually("the job's four pods to run", lambda: running(client, name, 4), timeout=180)
    clique_of = {n.metadata.name: (n.metadata.labels or {}).get(CLIQUE_LABEL) for n in client.list(Node)}
    groups: dict[str, set[str]] = {}
    ranks = []
    for p in pods:
        assert p.spec.schedulingGroup.podGroupName == f"{name}-{p.metadata.annotations['nvlfabric.io/clique-group']}"
        assert not p.spec.nodeSelector, "the controller placed a pod Kubernetes was to place"
        assert not any(g.name == RESERVATION_GATE for g in p.spec.schedulingGates or [])
        groups.setdefault(p.spec.schedulingGroup.podGroupName, set()).add(clique_of[p.spec.nodeName])
        env = json.loads((cp.state_dir / "nodes" / p.spec.nodeName / "containers"
                          / f"default_{p.metadata.name}_worker.json").read_text())
        g, i = int(p.metadata.annotations["nvlfabric.io/clique-group"]), int(
            p.metadata.annotations["batch.kubernetes.io/job-completion-index"])
        assert env["containerEnv"]["NVLFABRIC_RANK"] == p.metadata.annotations[RANK_ANNOTATION] == str(2 * g + i)
        assert env["command"] == ["torchrun", "--nnodes=4", f"--node-rank={2 * g + i}"]
        ranks.append(2 * g + i)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(len(c) == 1 for c in groups.values()), f"a group split across racks: {groups}"
    assert len({c for cs in groups.values() for c in cs}) == 2, f"both groups in one rack: {groups}"
    for g, claim in enumerate(claims):
        rc = client.get(ResourceClaim, claim, namespace="default")
        consumers = [(r.resource, r.name) for r in rc.status.reservedFor or []]
        assert consumers == [("podgroups", f"{name}-{g}")], consumers  # no per-pod entry, no 256 limit
    status = eventually("the domain to be Ready with both groups", lambda: (
        s if (s := client.get(ComputeDomainResource, name, namespace="default").status or {}).get("phase") == "Ready"
        else None), timeout=60)
    assert status["placedCliques"] == 2 and status["readyNodes"] == 4
    delete_job(client, name)  # the next test needs the racks free


def delete_job(client: Client, name: str) -> None:
    from lightkube.resources.batch_v1 import Job
    for job in client.list(Job, namespace="default", labels={COMPUTE_DOMAIN_LABEL: name}):
        client.delete(Job, job.metadata.name, namespace="default", cascade=CascadeType.FOREGROUND)
    eventually(f"{name}'s pods to be gone", lambda: not job_pods(client, name) or None, timeout=120)


def test_a_job_whose_second_group_has_no_room_starts_no_pod_until_room_frees(
        racks: tuple[ControlPlane, Client]) -> None:
    _, client = racks

    blocker = f"blk-{uuid.uuid4().hex[:5]}"
    start_job(client, blocker, cliques=1, pods=2)  # one whole rack: both of its nodes' GPUs
    eventually("the blocker to run", lambda: running(client, blocker, 2), timeout=180)
    name = f"pg-{uuid.uuid4().hex[:5]}"
    start_job(client, name, cliques=2, pods=4)
    deadline = time.monotonic() + 15  # the scheduler has long had its chances by then
    while time.monotonic() < deadline:
        bound: list[Any] = [p.metadata.name for p in job_pods(client, name) if p.spec.nodeName]
        assert not bound, f"pods of a job that cannot be placed whole were bound: {bound}"
        time.sleep(1)
    assert len(job_pods(client, name)) == 4
    delete_job(client, blocker)
    eventually("the job to run once the rack is free", lambda: running(client, name, 4), timeout=180)
    delete_job(client, name)  # the next test needs the racks free


@pytest.mark.pulumi
def test_pulumi_up_declares_the_pod_groups_and_destroy_removes_them(racks: tuple[ControlPlane, Client],
                                                                    tmp_path: Path) -> None:
    cp, client = racks
    name = f"st-{uuid.uuid4().hex[:5]}"
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "domain", name)
    steps = proj.json("preview", "--json")["steps"]
    kinds = sorted(st["urn"].split("::")[2].split("$")[-1] for st in steps if st["op"] == "create")
    assert kinds.count("kubernetes:scheduling.k8s.io/v1beta1:PodGroup") == 2, kinds
    assert kinds.count("kubernetes:scheduling.k8s.io/v1beta1:Workload") == 1, kinds
    assert kinds.count("kubernetes:scheduling.k8s.io/v1alpha3:CompositePodGroup") == 1, kinds
    assert kinds.count("kubernetes:batch/v1:Job") == 2, kinds
    proj.run("up", "--yes", "--skip-preview", timeout=300)
    assert proj.json("stack", "output", "--json") == {"scheduler": "kubernetes"}
    pods = eventually("the job's four pods to run", lambda: running(client, name, 4), timeout=180)
    # Kubernetes placed them: each pod in its PodGroup (pulumi-kubernetes drops the template's
    # schedulingGroup; the driver's MutatingAdmissionPolicy sets it from the pod-group annotation),
    # none steered by nvlfabric's controller.
    astray = [(p.metadata.name, p.spec.schedulingGroup, p.spec.nodeSelector) for p in pods
              if not p.spec.schedulingGroup or p.spec.nodeSelector]
    assert astray == []
    for res in (PodGroup, Workload):
        assert {o.metadata.name for o in client.list(res, namespace="default")} >= (
            {f"{name}-0", f"{name}-1"} if res is PodGroup else {name})
    proj.run("destroy", "--yes", "--skip-preview", timeout=300)
    assert not job_pods(client, name)
    assert not [o for o in client.list(PodGroup, namespace="default") if o.metadata.name.startswith(name)]
    assert not [c for c in client.list(ResourceClaim, namespace="default") if c.metadata.name.startswith(name)]
