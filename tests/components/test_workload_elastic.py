"""An elastic BoundJob (`max_parallelism`, issue 51) changes size in place: `pulumi up` with another
parallelism updates the running Job or StatefulSet, never replaces it, and leaves its pod template
as it was (so the pods that stay are not touched).

- what the manifests carry (pure): the same pod template at every size, the size range as
  NVLFABRIC_NNODES and no world size; the arguments refused, each with its reason;
- the options BoundJob gives its resources (under Pulumi's mocks): the Job ignores its size, a
  JobParallelism resource holds it;
- through the real Pulumi CLI (a platform project) on the session's control plane: an elastic
  Job and StatefulSet grown and shrunk; the preview shows an update of the size only, `up` keeps
  each object (same uid) at the new size, and a later update of the Job for another reason keeps
  the size it has.
"""

from __future__ import annotations

import copy
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.batch_v1 import Job
from pydantic import ValidationError

from nvlfabric.api import names
from nvlfabric.components import BoundJob, ComputeDomain
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.components.workloadmanifests import ELASTIC_SIZE
from nvlfabric.provider import jobparallelism
from nvlfabric.testbed.pulumi_cli import PulumiProject
from tests.conftest import Cluster
from tests.support.installed import platform_project
from tests.support.pulumimocks import EchoMocks

TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}


def _objs(kind: str = "Job", **args: Any) -> list[dict[str, Any]]:
    a = BoundJobArgs(name="train", kind=kind, pod_template=copy.deepcopy(TEMPLATE), **args)
    return workload_manifests(a, namespace="ml", claim_name="c", domain="cd")


def _workload(kind: str = "Job", **args: Any) -> dict[str, Any]:
    return next(o for o in _objs(kind, **args) if o["kind"] == kind)


@pytest.mark.parametrize("kind", ["Job", "StatefulSet"])
def test_an_elastic_workloads_pod_template_is_the_same_at_every_size(kind: str) -> None:
    sizes = {n: _workload(kind, parallelism=n, min_parallelism=2, max_parallelism=8) for n in (2, 5, 8)}
    templates = [w["spec"]["template"] for w in sizes.values()]
    assert templates[0] == templates[1] == templates[2]
    counts = {n: (w["spec"]["parallelism"], w["spec"]["completions"]) if kind == "Job" else w["spec"]["replicas"]
              for n, w in sizes.items()}
    assert counts == ({n: (n, n) for n in sizes} if kind == "Job" else {n: n for n in sizes})
    # Without max_parallelism the template names the size: a changed parallelism replaces the Job.
    fixed = [_workload(kind, parallelism=n)["spec"]["template"] for n in (2, 5)]
    assert fixed[0] != fixed[1]


def test_an_elastic_jobs_pods_read_the_size_range_and_no_world_size() -> None:
    tpl = _workload(parallelism=3, min_parallelism=2, max_parallelism=6)["spec"]["template"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in tpl["spec"]["containers"][0]["env"]}
    assert env[names.NNODES_ENV] == "2:6"
    assert names.WORLD_SIZE_ENV not in env and names.TORCH_WORLD_SIZE_ENV not in env
    assert {names.RANK_ENV, names.MASTER_ADDR_ENV, names.MASTER_PORT_ENV} <= env.keys()
    # The controller places min_parallelism pods at once; the others join as they come.
    assert tpl["metadata"]["annotations"][names.GROUP_SIZE_ANNOTATION] == "2"
    assert _workload(parallelism=3, max_parallelism=6)["spec"]["template"]["metadata"]["annotations"][
        names.GROUP_SIZE_ANNOTATION] == "1"


def test_an_elastic_leaderworkerset_changes_its_number_of_groups_and_nothing_in_them() -> None:
    """lws_size: groups of that many pods, each a launch of its own; an elastic LeaderWorkerSet's
    size is its replicas (groups), its group template the same at every size."""
    sizes = {n: _workload("LeaderWorkerSet", parallelism=n, lws_size=2, min_parallelism=2, max_parallelism=8)
             for n in (2, 4, 8)}
    assert {n: (w["spec"]["replicas"], w["spec"]["leaderWorkerTemplate"]["size"]) for n, w in sizes.items()} == {
        2: (1, 2), 4: (2, 2), 8: (4, 2)}
    templates = [{k: v for k, v in w["spec"].items() if k != "replicas"} for w in sizes.values()]
    assert templates[0] == templates[1] == templates[2]
    tpl = sizes[4]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in tpl["spec"]["containers"][0]["env"]}
    # Each group's world is the group, its leader rank 0 (LWS's own address of it).
    assert env[names.WORLD_SIZE_ENV] == "2" and names.NNODES_ENV not in env
    assert env[names.MASTER_ADDR_ENV] == f"$({names.LWS_LEADER_ADDRESS_ENV})"
    assert tpl["metadata"]["annotations"][names.GROUP_SIZE_ANNOTATION] == "2"  # a group is placed whole
    # Without lws_size a LeaderWorkerSet is one group of parallelism pods, as before.
    one = _workload("LeaderWorkerSet", parallelism=3)["spec"]
    assert (one["replicas"], one["leaderWorkerTemplate"]["size"]) == (1, 3)


@pytest.mark.parametrize(("args", "says"), [
    ({"kind": "LeaderWorkerSet", "parallelism": 3, "lws_size": 2}, "parallelism 3 is not a whole number of "
                                                                     "LeaderWorkerSet groups of lws_size 2"),
    ({"kind": "LeaderWorkerSet", "parallelism": 2, "lws_size": 2, "max_parallelism": 5},
     "max_parallelism 5 is not a whole number"),
    ({"parallelism": 2, "lws_size": 2}, "lws_size applies to a LeaderWorkerSet"),
    ({"parallelism": 5, "max_parallelism": 4}, "outside the elastic range"),
    ({"parallelism": 2, "min_parallelism": 3, "max_parallelism": 4}, "outside the elastic range"),
    ({"parallelism": 2, "min_parallelism": 2}, "min_parallelism without max_parallelism"),
    ({"kind": "JobSet", "parallelism": 2, "max_parallelism": 4}, "replicated Jobs are immutable"),
    ({"kind": "LeaderWorkerSet", "parallelism": 2, "max_parallelism": 4}, "restarts every group"),
    ({"parallelism": 2, "max_parallelism": 4, "clique_groups": 2}, "MultiClique"),
    ({"parallelism": 2, "max_parallelism": 4, "completions": 4}, "completions on an elastic job"),
    ({"parallelism": 2, "max_parallelism": 4, "queue_name": "q"}, "Kueue admits a job at the size"),
    ({"parallelism": 2, "max_parallelism": 4, "scheduler": "kubernetes"}, "gang is a fixed size"),
    ({"parallelism": 2, "max_parallelism": 19}, "max_parallelism x gpus_per_pod = 76 GPUs"),
])
def test_an_elastic_job_that_cannot_change_size_in_place_is_refused_with_the_reason(
        args: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        BoundJobArgs(name="train", pod_template=copy.deepcopy(TEMPLATE), **{"kind": "Job", **args})
    assert says in str(refused.value), refused.value


# -- the resources' options ----------------------------------------------------------------------------


def test_an_elastic_jobs_size_is_its_own_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    """The elastic Job's resource ignores parallelism and completions, and a JobParallelism
    resource after it holds them; a fixed Job has none, an elastic StatefulSet needs none
    (pulumi-kubernetes updates its replicas in place)."""
    made: dict[str, Any] = {}

    def spy(cls: Any) -> Callable[..., Any]:
        def make(resource_name: str, *args: Any, opts: pulumi.ResourceOptions | None = None, **kw: Any) -> Any:
            made[resource_name] = (cls.__name__, [*(opts.ignore_changes or [])] if opts is not None else [],
                                   args[0].parallelism if args else None)
            return cls(resource_name, *args, opts=opts, **kw)
        return make

    monkeypatch.setattr(k8s.batch.v1, "Job", spy(k8s.batch.v1.Job))
    monkeypatch.setattr(k8s.apps.v1, "StatefulSet", spy(k8s.apps.v1.StatefulSet))
    monkeypatch.setattr(jobparallelism, "JobParallelism", spy(jobparallelism.JobParallelism))
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    domain = ComputeDomain("d")
    common: dict[str, Any] = {"compute_domain": domain, "gpu_resource": None, "pod_template": TEMPLATE}
    BoundJob("elastic", parallelism=3, max_parallelism=6, **common)
    BoundJob("fixed", parallelism=3, **common)
    BoundJob("set", kind="StatefulSet", parallelism=3, max_parallelism=6, **common)
    monkeypatch.setattr(k8s.apiextensions, "CustomResource", spy(k8s.apiextensions.CustomResource))
    BoundJob("groups", kind="LeaderWorkerSet", parallelism=4, lws_size=2, max_parallelism=8, **common)
    created_only = ["spec.podFailurePolicy", "spec.backoffLimitPerIndex", "spec.maxFailedIndexes"]
    assert made == {"elastic": ("Job", [*created_only, *ELASTIC_SIZE], None),
                    "elastic-size": ("JobParallelism", [], 3),
                    "fixed": ("Job", created_only, None), "set": ("StatefulSet", [], None),
                    "groups": ("CustomResource", [], None)}  # replicas: an update of the custom resource


def test_an_elastic_job_on_a_domain_of_another_fixed_size_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    common: dict[str, Any] = {"pod_template": TEMPLATE, "max_parallelism": 8, "scheduler": "nvlfabric"}
    BoundJob("follows", compute_domain=ComputeDomain("free"), parallelism=6, **common)
    BoundJob("same", compute_domain=ComputeDomain("six", spec={"numNodes": 6}), parallelism=6, **common)
    assert warned == []
    BoundJob("other", compute_domain=ComputeDomain("four", spec={"numNodes": 4}), parallelism=6, **common)
    assert warned == ["BoundJob other: elastic, 6 pods of a whole node each, on ComputeDomain four whose numNodes "
                      "is 4: its readiness counts 4 members, whatever the job's size; leave its numNodes unset (it "
                      "then follows its pods) or change it with parallelism"]


# -- grown and shrunk through the real Pulumi CLI -------------------------------------------------------

PROGRAM = '''\
"""A platform repo's stack: an elastic Job and an elastic StatefulSet on a domain without numNodes;
config `pods` is their parallelism, `team` a label of the Job's."""

import pulumi

from nvlfabric.components import BoundJob, ComputeDomain

config = pulumi.Config()
name = config.require("name")
domain = ComputeDomain("domain", name=name)
common = {"compute_domain": domain, "gpu_resource": None, "parallelism": config.require_int("pods"),
          "min_parallelism": 1, "max_parallelism": 4,
          "pod_template": {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}}
BoundJob("job", name=f"{name}-job", labels={"team": config.get("team") or "a"}, **common)
BoundJob("set", name=f"{name}-set", kind="StatefulSet", **common)
'''


def _preview(proj: PulumiProject) -> dict[str, tuple[str, list[str]]]:
    """The preview's steps that change something: resource name → (op, the differing properties;
    a dynamic resource, which reports no detailed diff: the inputs that differ)."""
    proc = proj.run("preview", "--json", "--diff")
    steps = json.loads(proc.stdout).get("steps") or []

    def changed(s: dict[str, Any]) -> list[str]:
        if diff := s.get("detailedDiff") or s.get("diffReasons"):
            return sorted(diff)
        old, new = ((s.get(k) or {}).get("inputs") or {} for k in ("oldState", "newState"))
        return sorted(k for k in new.keys() | old.keys() if not k.startswith("__") and old.get(k) != new.get(k))

    return {s["urn"].rsplit("::", 1)[1]: (s["op"], changed(s)) for s in steps if s["op"] not in ("same", "read")}


@pytest.mark.cluster
@pytest.mark.pulumi
@pytest.mark.timeout(900)
def test_pulumi_up_grows_and_shrinks_an_elastic_job_and_statefulset_in_place(api: Cluster, tmp_path: Path) -> None:
    client = api.client
    name = f"el-{uuid.uuid4().hex[:5]}"

    def live() -> dict[str, Any]:
        job = client.get(Job, f"{name}-job", namespace="default")
        sts = client.get(StatefulSet, f"{name}-set", namespace="default")
        return {"job": (job.metadata.uid, job.spec.parallelism, job.spec.completions, job.spec.template.to_dict()),
                "set": (sts.metadata.uid, sts.spec.replicas, sts.spec.template.to_dict())}

    proj = platform_project(tmp_path / "proj", Path(sys.prefix), api.kubeconfig, PROGRAM)
    proj.run("stack", "init", "dev")
    proj.run("config", "set", "name", name)
    proj.run("config", "set", "pods", "2")
    try:
        proj.run("up", "--yes", "--skip-preview")
        before = live()
        assert (before["job"][1:3], before["set"][1]) == ((2, 2), 2)
        for pods in (4, 1):  # grown, then shrunk below where it started
            proj.run("config", "set", "pods", str(pods))
            assert _preview(proj) == {"job-size": ("update", ["parallelism"]), "set": ("update", ["spec.replicas"])}
            proj.run("up", "--yes", "--skip-preview")
            now = live()
            assert now["job"] == (before["job"][0], pods, pods, before["job"][3])
            assert now["set"] == (before["set"][0], pods, before["set"][2])
        # The Job updated for something else (a label): it keeps the size it has, not the one it was made with.
        proj.run("config", "set", "team", "b")
        team = ("update", ["metadata.labels.team"])
        assert _preview(proj) == {"job": team, "job-svc": team}
        proj.run("up", "--yes", "--skip-preview")
        job = client.get(Job, f"{name}-job", namespace="default")
        assert (job.metadata.uid, job.spec.parallelism, job.metadata.labels["team"]) == (before["job"][0], 1, "b")
        assert _preview(proj) == {}
    finally:
        proj.run("destroy", "--yes", "--skip-preview")
