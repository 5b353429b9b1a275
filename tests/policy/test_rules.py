"""The policy pack's rules on the objects nvlfabric's own components make (pure)."""

from __future__ import annotations

from nvlfabric.components.driver import NvlfabricDriverArgs, driver_objects
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.policy import rules

TEMPLATE = {"spec": {"containers": [{"name": "w", "image": "registry.invalid/w:1"}]}}


def _workload(**kw: object) -> tuple[str, dict]:  # type: ignore[type-arg]
    job = workload_manifests(BoundJobArgs(name="train", pod_template=TEMPLATE, **kw), namespace="ml",  # type: ignore[arg-type]
                             claim_name="c", domain="cd")[-1]
    return f"kubernetes:{job['apiVersion']}:{job['kind']}", job


def test_a_bound_workload_without_gpus_is_a_violation_and_one_with_them_is_not() -> None:
    assert rules.bound_workload_without_gpus(*_workload()) is None
    for kind in ("Job", "StatefulSet", "LeaderWorkerSet"):
        problem = rules.bound_workload_without_gpus(*_workload(kind=kind, gpu_resource=None))
        assert problem and "is bound to ComputeDomain cd but no container asks for nvidia.com/gpu" in problem, kind
    unbound = {"metadata": {"name": "x", "labels": {}}, "spec": {"template": TEMPLATE}}
    assert rules.bound_workload_without_gpus("kubernetes:batch/v1:Job", unbound) is None  # not ours to judge


def test_a_force_deleted_domain_is_a_violation() -> None:
    props = {"name": "train", "namespace": "ml", "force_delete": True}
    assert rules.force_deleted_domain("pulumi-python:dynamic/nvlfabric:ComputeDomain", props) == (
        "ComputeDomain ml/train has force_delete=True: deleting it would take the channel from running pods; delete "
        "its workloads first instead")
    assert rules.force_deleted_domain("pulumi-python:dynamic/nvlfabric:ComputeDomain", {"name": "x"}) is None


def test_more_clique_groups_than_the_racks_have_channels_is_a_violation() -> None:
    (deploy,) = [o for o in driver_objects(NvlfabricDriverArgs(channels_per_clique=2)) if o["kind"] == "Deployment"]
    rack = {"metadata": {"name": "n0", "labels": {"nvlfabric.io/rack": "rack-0"}}}
    domain = ("pulumi-python:dynamic/nvlfabric:ComputeDomain", {"spec": {}})
    multi = ("pulumi-python:dynamic/nvlfabric:ComputeDomain", {"spec": {"placement": {"cliques": 2}}})
    stack = [("kubernetes:apps/v1:Deployment", deploy), ("kubernetes:core/v1:NodePatch", rack), domain, domain]
    assert rules.channel_shortfall(stack) is None  # 2 groups, 2 channels
    problem = rules.channel_shortfall([*stack, multi])
    assert problem and problem.startswith("the program's ComputeDomains need 4 channels (one per clique group), but "
                                          "its 1 rack(s) have 2 (2 per clique")
    assert rules.channel_shortfall([domain, domain, domain]) is None  # no driver in the program: nothing to judge
    nvidias = ("pulumi-python:dynamic/nvlfabric:ComputeDomain", {"backend": "nvidia", "spec": {}})
    assert rules.channel_shortfall([*stack, nvidias, nvidias]) is None  # NVIDIA's domains take no channel of ours
