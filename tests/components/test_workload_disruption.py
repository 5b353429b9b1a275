"""A pod failed as disrupted is replaced in place (issue 51): every Job BoundJob makes whose pods
restart Never carries DISRUPTION_POLICY (a podFailurePolicy that ignores a pod with condition
DisruptionTarget True, as nvlfabric's controller marks a lost member node's pods), and the
Jobs and JobSets already in a stack's state, created without it, are neither replaced nor changed
by an upgrade (the field is immutable; CREATED_ONLY makes it the resources' ignore_changes).

- what the manifests carry (pure), and what the API server makes of them (a server-side dry run
  on the session's control plane: podReplacementPolicy defaults to Failed; OnFailure refuses a
  policy);
- the options BoundJob gives its resources (under Pulumi's mocks);
- through the real Pulumi CLI (a platform project) on the session's control
  plane: a stack of a Job, a MultiClique domain's two Jobs and a JobSet of two replicated Jobs,
  brought up as the release before this one wrote them (no policy); without the ignore_changes
  the preview would update the Jobs and fail on the API server's refusal (immutable); with it,
  nothing changes, `up` keeps each object; a workload added afterwards gets the policy, and so
  does an old Job replaced for a change of its pod template.
"""

from __future__ import annotations

import copy
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from lightkube import ApiError, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.batch_v1 import Job

from nvlfabric.components import BoundJob, ComputeDomain
from nvlfabric.components.workload import CREATED_ONLY, DISRUPTION_POLICY, BoundJobArgs, workload_manifests
from nvlfabric.testbed.pulumi_cli import PulumiProject
from tests.conftest import Cluster
from tests.support.installed import platform_project
from tests.support.pulumimocks import EchoMocks

TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}
ON_FAILURE = {"spec": {"restartPolicy": "OnFailure", "containers": TEMPLATE["spec"]["containers"]}}
EXPECTED = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}


def _manifests(kind: str, groups: int = 1, template: dict[str, Any] = TEMPLATE) -> list[dict[str, Any]]:
    args = BoundJobArgs(name="train", kind=kind, parallelism=2 * groups, pod_template=copy.deepcopy(template),
                        clique_groups=groups)
    claims = [f"c-{g}" for g in range(groups)] if groups > 1 else None
    return workload_manifests(args, namespace="ml", claim_name="c", domain="cd", claims=claims)


def _job_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every Job spec among the objects: a Job's own, each JobSet replicated Job's template."""
    out = []
    for o in objs:
        if o["kind"] == "Job":
            out.append(o["spec"])
        elif o["kind"] == "JobSet":
            out.extend(r["template"]["spec"] for r in o["spec"]["replicatedJobs"])
    return out


def _mentions(obj: Any, key: str) -> bool:
    if isinstance(obj, dict):
        return key in obj or any(_mentions(v, key) for v in obj.values())
    return isinstance(obj, list) and any(_mentions(v, key) for v in obj)


# -- what the manifests carry ------------------------------------------------------------------------


def test_the_disruption_policy_ignores_a_pod_failed_as_disrupted_and_nothing_else() -> None:
    assert DISRUPTION_POLICY == EXPECTED


@pytest.mark.parametrize(("kind", "groups", "jobs"), [("Job", 1, 1), ("Job", 2, 2), ("JobSet", 1, 1), ("JobSet", 2, 2)])
def test_every_job_of_a_workload_manifest_replaces_a_disrupted_pod(kind: str, groups: int, jobs: int) -> None:
    specs = _job_specs(_manifests(kind, groups))
    assert len(specs) == jobs
    for spec in specs:
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert spec["podFailurePolicy"] == EXPECTED
        assert spec["backoffLimit"] == 0  # any other failure still fails the Job
        assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (0, 0)  # a back-off per index
    # Each Job its own copy: mutating one touches neither another nor the constant.
    specs[0]["podFailurePolicy"]["rules"].clear()
    assert DISRUPTION_POLICY == EXPECTED
    assert all(s["podFailurePolicy"] == EXPECTED for s in specs[1:])


@pytest.mark.parametrize(("kind", "groups"), [("Job", 1), ("Job", 2), ("JobSet", 1), ("JobSet", 2)])
def test_a_workload_manifest_whose_pods_restart_on_failure_has_no_policy(kind: str, groups: int) -> None:
    specs = _job_specs(_manifests(kind, groups, ON_FAILURE))
    assert specs and all(s["template"]["spec"]["restartPolicy"] == "OnFailure" for s in specs)
    assert not [s for s in specs if "podFailurePolicy" in s]


@pytest.mark.parametrize(("kind", "groups"), [("StatefulSet", 1), ("StatefulSet", 2), ("LeaderWorkerSet", 1)])
def test_a_workload_manifest_of_pods_that_keep_running_has_no_policy(kind: str, groups: int) -> None:
    objs = _manifests(kind, groups)
    assert [o["kind"] for o in objs if o["kind"] == kind] and not _mentions(objs, "podFailurePolicy")


@pytest.mark.cluster
def test_the_api_server_takes_the_manifests_job_and_defaults_its_pod_replacement_to_failed(
        cluster: Cluster) -> None:
    """A server-side dry run: the Job as BoundJob makes it is valid, and the API server defaults
    podReplacementPolicy to Failed (the replacement once the old pod is terminal). An OnFailure
    Job has no policy, and could not: the API server refuses one there."""
    (job,) = [o for o in _manifests("Job") if o["kind"] == "Job"]
    job["metadata"]["namespace"] = "default"
    made = cluster.client.create(codecs.from_dict(job), dry_run=True)
    assert made.spec.podFailurePolicy.to_dict() == EXPECTED
    assert made.spec.podReplacementPolicy == "Failed"

    (on_failure,) = [o for o in _manifests("Job", template=ON_FAILURE) if o["kind"] == "Job"]
    on_failure["metadata"]["namespace"] = "default"
    assert cluster.client.create(codecs.from_dict(on_failure), dry_run=True).spec.podFailurePolicy is None
    on_failure["spec"]["podFailurePolicy"] = DISRUPTION_POLICY
    with pytest.raises(ApiError) as refused:
        cluster.client.create(codecs.from_dict(on_failure), dry_run=True)
    assert "podFailurePolicy" in str(refused.value) and "Never" in str(refused.value), refused.value


# -- the resources' options ----------------------------------------------------------------------------


def test_the_workload_resources_ignore_changes_to_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Job and JobSet resource ignores changes to the policy's path (the whole list of a
    JobSet's replicated Jobs); a StatefulSet and a LeaderWorkerSet ignore nothing."""
    fields = ("podFailurePolicy", "backoffLimitPerIndex", "maxFailedIndexes")
    job, jobset = [f"spec.{f}" for f in fields], [f"spec.replicatedJobs[*].template.spec.{f}" for f in fields]
    assert {"Job": tuple(job), "JobSet": tuple(jobset)} == CREATED_ONLY
    made: dict[str, list[str] | None] = {}

    def spy(cls: Any) -> Callable[..., Any]:
        def make(resource_name: str, *args: Any, opts: pulumi.ResourceOptions | None = None, **kw: Any) -> Any:
            made[resource_name] = opts.ignore_changes if opts is not None else None
            return cls(resource_name, *args, opts=opts, **kw)
        return make

    monkeypatch.setattr(k8s.batch.v1, "Job", spy(k8s.batch.v1.Job))
    monkeypatch.setattr(k8s.apps.v1, "StatefulSet", spy(k8s.apps.v1.StatefulSet))
    monkeypatch.setattr(k8s.apiextensions, "CustomResource", spy(k8s.apiextensions.CustomResource))
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    installer = pulumi.CustomResource("test:index:Install", "crds")  # JobSet and LWS: told what installs them
    single = ComputeDomain("single")
    multi = ComputeDomain("multi", spec={"numNodes": 2, "placement": {"scope": "MultiClique", "cliques": 2}})
    common: dict[str, Any] = {"parallelism": 2, "gpu_resource": None, "scheduler": "nvlfabric",
                              "pod_template": TEMPLATE, "opts": pulumi.ResourceOptions(depends_on=[installer])}
    for kind in ("Job", "JobSet", "StatefulSet", "LeaderWorkerSet"):
        BoundJob(f"s-{kind.lower()}", kind=kind, compute_domain=single, **common)
    for kind in ("Job", "JobSet", "StatefulSet"):
        BoundJob(f"m-{kind.lower()}", kind=kind, compute_domain=multi, **common)
    assert made == {
        "s-job": job, "m-job": job, "m-job-1": job, "s-jobset": jobset, "m-jobset": jobset,
        "s-statefulset": None, "m-statefulset": None, "m-statefulset-1": None, "s-leaderworkerset": None,
    }


# -- an upgrade through the real Pulumi CLI -------------------------------------------------------------

JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
#: The workload resources of the stack and the object each is: (kind, name suffix).
WORKLOADS = {"job": ("Job", "job"), "groups": ("Job", "groups-0"), "groups-1": ("Job", "groups-1"),
             "jobset": ("JobSet", "js")}
PROGRAM = f'''\
"""A platform repo's stack: a Job, a MultiClique domain's two Jobs and a JobSet of two replicated Jobs
(a minimal JobSet CRD of its own: no JobSet controller), and with `fresh` one Job more; `image` is
the pods' image. Test hooks:
`previous` makes the workloads as the release before this one did (no podFailurePolicy),
`unguarded` drops the ignore_changes."""

import pulumi
import pulumi_kubernetes as k8s

from nvlfabric.components import BoundJob, ComputeDomain, workload

config = pulumi.Config()
name = config.require("name")
if config.get_bool("previous"):
    made = workload.workload_manifests

    def previous(*args, **kwargs):
        objs = made(*args, **kwargs)
        for o in objs:
            for spec in ([o["spec"]] if o["kind"] == "Job" else
                         [r["template"]["spec"] for r in o["spec"].get("replicatedJobs") or []]
                         if o["kind"] == "JobSet" else []):
                for field in ("podFailurePolicy", "backoffLimitPerIndex", "maxFailedIndexes"):
                    spec.pop(field, None)
        return objs

    workload.workload_manifests = previous
if config.get_bool("unguarded"):
    workload.CREATED_ONLY = {{}}

crd = k8s.apiextensions.v1.CustomResourceDefinition(
    "jobsets", metadata={{"name": "{JOBSET_CRD}"}}, spec={{
        "group": "jobset.x-k8s.io", "scope": "Namespaced",
        "names": {{"plural": "jobsets", "singular": "jobset", "kind": "JobSet"}},
        "versions": [{{"name": "v1alpha2", "served": True, "storage": True, "schema": {{"openAPIV3Schema": {{
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}}]}})
single = ComputeDomain("single", name=f"{{name}}-a")
multi = ComputeDomain("multi", name=f"{{name}}-b",
                      spec={{"numNodes": 2, "placement": {{"scope": "MultiClique", "cliques": 2}}}})
image = config.get("image") or "registry.invalid/train:1"
common = {{"parallelism": 2, "gpu_resource": None, "scheduler": "nvlfabric",
          "pod_template": {{"spec": {{"containers": [{{"name": "worker", "image": image}}]}}}}}}
BoundJob("job", name=f"{{name}}-job", compute_domain=single, **common)
BoundJob("groups", name=f"{{name}}-groups", compute_domain=multi, **common)
BoundJob("jobset", name=f"{{name}}-js", kind="JobSet", compute_domain=multi, **common,
         opts=pulumi.ResourceOptions(depends_on=[crd]))
if config.get_bool("fresh"):
    BoundJob("fresh", name=f"{{name}}-fresh", compute_domain=single, **common)
'''


def _preview(proj: PulumiProject) -> tuple[dict[str, tuple[str, list[str]]], str]:
    """The preview's steps that change something, resource name → (op, the differing properties),
    and its error ("" if none)."""
    proc = proj.run("preview", "--json", "--diff", check=False)
    out = json.loads(proc.stdout)
    steps = {s["urn"].rsplit("::", 1)[1]: (s["op"], sorted(s.get("detailedDiff") or s.get("diffReasons") or []))
             for s in out.get("steps") or [] if s["op"] not in ("same", "read")}
    errors = [d["message"] for d in out.get("diagnostics") or [] if d.get("severity") == "error"]
    assert (proc.returncode == 0) == (not errors), proc
    return steps, "\n".join(errors)


@pytest.fixture
def no_jobset_crd(api: Cluster) -> Iterator[None]:
    """The shared control plane serves no JobSet (test_bad_arguments.py counts on it): the stack's
    CRD goes with it, and is deleted here should the stack's destroy not get to it."""
    yield
    try:
        api.client.delete(CustomResourceDefinition, JOBSET_CRD)
    except ApiError as exc:
        assert exc.status.code == 404, exc


@pytest.mark.cluster
@pytest.mark.pulumi
@pytest.mark.timeout(900)
def test_an_upgrade_keeps_the_workloads_created_without_the_policy_and_new_ones_get_it(
        api: Cluster, no_jobset_crd: None, tmp_path: Path) -> None:
    client = api.client
    name = f"pfp-{uuid.uuid4().hex[:5]}"

    def live(kind: str, suffix: str) -> tuple[str, list[Any]]:
        """The object's uid and the podFailurePolicy of each of its Jobs (None: none)."""
        if kind == "Job":
            job = client.get(Job, f"{name}-{suffix}", namespace="default")
            return job.metadata.uid, [job.spec.podFailurePolicy and job.spec.podFailurePolicy.to_dict()]
        js = client.get(JobSet, f"{name}-{suffix}", namespace="default")
        return js.metadata.uid, [r["template"]["spec"].get("podFailurePolicy") for r in js["spec"]["replicatedJobs"]]

    proj = platform_project(tmp_path / "proj", Path(sys.prefix), api.kubeconfig, PROGRAM)
    proj.run("stack", "init", "dev")
    proj.run("config", "set", "name", name)
    try:
        # The stack as the previous release brought it up: its Jobs without the policy.
        proj.run("config", "set", "previous", "true")
        proj.run("up", "--yes", "--skip-preview")
        proj.run("config", "rm", "previous")
        before = {r: live(*obj) for r, obj in WORKLOADS.items()}
        assert [p for _, policies in before.values() for p in policies] == [None] * 5, before

        # Without the ignore_changes this release would update each Job and the JobSet's
        # replicated Jobs, and the API server refuses the Jobs' update: the preview fails (at the
        # first refusal: which of the other steps it got to varies), and so would `pulumi up`.
        proj.run("config", "set", "unguarded", "true")
        steps, error = _preview(proj)
        proj.run("config", "rm", "unguarded")
        fields = ["spec.backoffLimitPerIndex", "spec.maxFailedIndexes", "spec.podFailurePolicy"]
        replicated = sorted(f.replace("spec.", f"spec.replicatedJobs[{i}].template.spec.") for i in (0, 1)
                            for f in fields)
        would = {"job": ("update", fields), "groups": ("update", fields), "groups-1": ("update", fields),
                 "jobset": ("update", replicated)}
        assert steps and steps.items() <= would.items() and {"job", "groups", "groups-1"} & set(steps), steps
        assert "spec.podFailurePolicy: Invalid value" in error and "field is immutable" in error, error

        # With them: nothing to do, and `up` keeps every object as it is.
        assert _preview(proj) == ({}, "")
        proj.run("up", "--yes", "--skip-preview")
        assert {r: live(*obj) for r, obj in WORKLOADS.items()} == before

        # A workload created now has the policy.
        proj.run("config", "set", "fresh", "true")
        proj.run("up", "--yes", "--skip-preview")
        assert live("Job", "fresh")[1] == [EXPECTED]
        assert client.get(Job, f"{name}-fresh", namespace="default").spec.podReplacementPolicy == "Failed"
        assert {r: live(*obj) for r, obj in WORKLOADS.items()} == before

        # So does an old Job replaced for a change of its own (its pod template): ignore_changes
        # holds for updates, not for what a replacement creates. (The JobSet, updated in place:
        # the minimal CRD refuses nothing, where JobSet's webhook would refuse the change.)
        proj.run("config", "set", "image", "registry.invalid/train:2")
        proj.run("up", "--yes", "--skip-preview")
        after = {r: live(*obj) for r, obj in WORKLOADS.items()}
        assert after.pop("jobset") == before["jobset"]
        assert all(uid != before[r][0] and policies == [EXPECTED] for r, (uid, policies) in after.items()), after
    finally:
        proj.run("destroy", "--yes", "--skip-preview")
