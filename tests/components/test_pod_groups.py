"""BoundJob's objects when Kubernetes schedules the job (pure), and how the component decides who
schedules it (`scheduler`), with what the cluster says replaced by `clusterprobes.scheduling_apis`'s answers."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from nvlfabric.api.names import CLIQUE_LABEL, RESERVATION_GATE
from nvlfabric.clusterview.scheduling import WorkloadApis
from nvlfabric.components import BoundJob, ComputeDomain, clusterprobes, workload
from nvlfabric.components.args import ComponentArgsError
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from tests.support.pulumimocks import EchoMocks

APIS = WorkloadApis("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3")
TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}


def _objs(k: int, kind: str = "Job", apis: WorkloadApis | None = APIS) -> list[dict[str, Any]]:
    args = BoundJobArgs(name="train", kind=kind, parallelism=4 * k, gpus_per_pod=4, clique_groups=k,
                        pod_template=TEMPLATE)
    claims = [f"cd-channel-{g}" for g in range(k)] if k > 1 else ["cd-channel"]
    return workload_manifests(args, namespace="ml", claim_name=claims[0], domain="cd", claims=claims, apis=apis)


def _templates(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for o in objs:
        if o["kind"] in ("Job", "StatefulSet"):
            out.append(o["spec"]["template"])
        elif o["kind"] == "JobSet":
            out.extend(r["template"]["spec"]["template"] for r in o["spec"]["replicatedJobs"])
    return out


def test_over_one_clique_one_gang_pod_group_holds_the_claim_and_the_pods_carry_no_gate() -> None:
    objs = _objs(1)
    assert [o["kind"] for o in objs] == ["Workload", "PodGroup", "Service", "Job"]
    wl, pg = objs[0], objs[1]
    assert wl["spec"]["podGroupTemplates"] == [{"name": "clique", "schedulingPolicy": {"gang": {"minCount": 4}},
                                                "schedulingConstraints": {"topology": [{"key": CLIQUE_LABEL}]}}]
    assert pg["metadata"]["name"] == "train" and pg["metadata"]["namespace"] == "ml"
    assert pg["spec"]["workloadRef"] == {"workloadName": "train", "templateName": "clique"}
    assert pg["spec"]["resourceClaims"] == [{"name": "channel", "resourceClaimName": "cd-channel"}]
    assert "parentCompositePodGroupName" not in pg["spec"]
    (tpl,) = _templates(objs)
    assert tpl["spec"]["schedulingGroup"] == {"podGroupName": "train"}
    # the pod's claim entry matches the PodGroup's (name and reference): reserved for the group
    assert tpl["spec"]["resourceClaims"] == pg["spec"]["resourceClaims"]
    assert "schedulingGates" not in tpl["spec"]  # the rank is the Job's own index: nothing to wait for


@pytest.mark.parametrize("kind", ["Job", "StatefulSet", "JobSet"])
def test_over_cliques_each_group_is_a_gang_inside_one_gang_of_all_groups(kind: str) -> None:
    objs = _objs(3, kind)
    wl, composite, *groups = [o for o in objs if o["kind"] in workload.SCHEDULING_KINDS]
    (tmpl,) = wl["spec"]["compositePodGroupTemplates"]
    assert tmpl["name"] == "job" and tmpl["schedulingPolicy"] == {"gang": {"minGroupCount": 3}}
    assert tmpl["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert composite["apiVersion"] == "scheduling.k8s.io/v1alpha3" and composite["kind"] == "CompositePodGroup"
    assert composite["spec"]["schedulingPolicy"] == {"gang": {"minGroupCount": 3}}
    assert [g["metadata"]["name"] for g in groups] == ["train-0", "train-1", "train-2"]
    templates = _templates(objs)
    assert len(templates) == 3
    for g, (group, tpl) in enumerate(zip(groups, templates, strict=True)):
        assert group["spec"]["parentCompositePodGroupName"] == "train"
        assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": CLIQUE_LABEL}]}
        assert group["spec"]["resourceClaims"] == [{"name": "channel", "resourceClaimName": f"cd-channel-{g}"}]
        assert tpl["spec"]["schedulingGroup"] == {"podGroupName": f"train-{g}"}
        assert {"name": "channel", "resourceClaimName": f"cd-channel-{g}"} in tpl["spec"]["resourceClaims"]
        # the controller writes the job-wide rank, then lifts the gate: it places nothing
        assert tpl["spec"]["schedulingGates"] == [{"name": RESERVATION_GATE}]


def test_without_the_apis_the_objects_are_nvlfabrics_as_before() -> None:
    objs = _objs(2, apis=None)
    assert [o["kind"] for o in objs] == ["Service", "Job", "Job"]
    assert all("schedulingGroup" not in t["spec"] for t in _templates(objs))


def test_a_cluster_without_composite_groups_cannot_gang_a_job_over_cliques() -> None:
    with pytest.raises(ValueError, match="CompositePodGroup"):
        _objs(2, apis=WorkloadApis(APIS.workload, APIS.pod_group, None))


def _resolve(monkeypatch: pytest.MonkeyPatch, found: WorkloadApis | Exception | None, *, cliques: int = 1,
             scheduler: str = "auto") -> BoundJob:
    def probed(namespace: str) -> WorkloadApis | None:
        if isinstance(found, Exception):
            raise found
        return found

    monkeypatch.setattr(clusterprobes, "scheduling_apis", probed)
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    spec = {"numNodes": 2 * cliques, **({"placement": {"scope": "MultiClique", "cliques": cliques}}
                                        if cliques > 1 else {})}
    return BoundJob("train", compute_domain=ComputeDomain("cd", spec=spec), pod_template=TEMPLATE,
                    parallelism=2 * cliques, scheduler=scheduler)  # type: ignore[arg-type]


def _scheduler(job: BoundJob) -> str:
    got: list[str] = []
    job.scheduler.apply(got.append)
    return got[0] if got else ""


@pytest.mark.parametrize("found, cliques, expected", [
    (APIS, 1, "kubernetes"),
    (APIS, 2, "kubernetes"),
    (None, 1, "nvlfabric"),  # not served
    (WorkloadApis(APIS.workload, APIS.pod_group, None), 2, "nvlfabric"),  # no composite: not over cliques
    (WorkloadApis(APIS.workload, APIS.pod_group, None), 1, "kubernetes"),  # ... but one clique needs none
    (WorkloadApis(APIS.workload, APIS.pod_group, APIS.composite, "the API server drops pod-group claims"), 1,
     "nvlfabric"),  # served, a gate off
    (ConnectionRefusedError("no cluster"), 1, "nvlfabric"),  # unreadable at preview
])
def test_auto_uses_kubernetes_only_where_the_cluster_offers_all_the_job_needs(
        monkeypatch: pytest.MonkeyPatch, found: Any, cliques: int, expected: str) -> None:
    job = _resolve(monkeypatch, found, cliques=cliques)
    assert job.pod_groups if expected == "kubernetes" else not job.pod_groups
    assert _scheduler(job) in (expected, "")  # outputs resolve only in the engine's run


def test_scheduler_kubernetes_on_a_cluster_without_it_fails_at_preview_naming_the_field_and_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ComponentArgsError) as err:
        _resolve(monkeypatch, None, scheduler="kubernetes")
    msg = str(err.value)
    assert "scheduler: 'kubernetes', but the cluster does not serve scheduling.k8s.io Workload and PodGroup" in msg
    assert "GenericWorkload" in msg and "scheduler='auto'" in msg


def test_scheduler_nvlfabric_never_asks_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    job = _resolve(monkeypatch, AssertionError("asked"), scheduler="nvlfabric")
    assert not job.pod_groups


def test_scheduler_kubernetes_on_an_unreadable_cluster_takes_the_users_word(monkeypatch: pytest.MonkeyPatch) -> None:
    job = _resolve(monkeypatch, ConnectionRefusedError("not there yet"), cliques=2, scheduler="kubernetes")
    assert len(job.pod_groups) == 4  # Workload, CompositePodGroup, 2 PodGroups


def test_a_bad_scheduler_is_named() -> None:
    with pytest.raises(ComponentArgsError) as err:
        BoundJob("x", compute_domain=None, pod_template=TEMPLATE, scheduler="slurm")  # type: ignore[arg-type]
    assert "scheduler:" in str(err.value) and "'auto', 'nvlfabric' or 'kubernetes'" in str(err.value)


def test_a_job_of_576_one_gpu_pods_over_8_racks_is_one_boundjob() -> None:
    """The reservedFor limit (256) is per claim, and a MultiClique domain has a claim per group: a
    576-GPU job of 1-GPU pods (72 per rack) used to be refused for the whole job's size."""
    from nvlfabric.components.args import validate
    from nvlfabric.components.workload import BoundJobArgs

    tpl = {"spec": {"containers": [{"name": "w", "image": "registry.invalid/w:1"}]}}
    args = validate(BoundJobArgs, "BoundJob", "big", {"name": "big", "pod_template": tpl, "parallelism": 576,
                                                      "gpus_per_pod": 1, "clique_groups": 8})
    assert args.group_size == 72
    with pytest.raises(ComponentArgsError, match=r"parallelism / 2 clique groups = 288 pods share one channel claim"):
        validate(BoundJobArgs, "BoundJob", "big", {"name": "big", "pod_template": tpl, "parallelism": 576,
                                                   "gpu_resource": None, "gpus_per_pod": 0, "clique_groups": 2})
