"""JobSet, the real controller, as a simulator addon (`nvlfabric-sim up --addons jobset`,
nvlfabric/sim/addons.py): installed with its own CRD, RBAC and webhooks, running under its own
ServiceAccount; a JobSet becomes its Jobs, its headless Service and running pods on the simulated
nodes, and its webhooks answer (a JobSet its validation refuses is refused at creation)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Service

from nvlfabric.sim import addons
from nvlfabric.sim.cluster import eventually
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import simulated_rack

pytestmark = pytest.mark.cluster
RACK = 179  # addresses 127.10.179.x: a rack number no other test uses
JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")


@pytest.fixture(scope="module")
def jobset_rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=2, field_manager="addons-test",
                        prefix="nvladd-", addons=("jobset",)) as rack:
        yield rack


def _jobset(name: str, replicas: int, **job: Any) -> Any:
    return JobSet.from_dict({"metadata": {"name": name, "namespace": "default"}, "spec": {"replicatedJobs": [
        {"name": "workers", "replicas": replicas, "template": {"spec": {**job, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "trainer", "image": "registry.invalid/train:1"}]}}}}}]}})


def test_a_jobset_runs_its_jobs_pods_and_headless_service(jobset_rack: tuple[ControlPlane, Client]) -> None:
    cp, client = jobset_rack
    client.create(_jobset("train", 2, parallelism=1, completions=1))
    pods = eventually("the JobSet's two pods to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default", labels={"jobset.sigs.k8s.io/jobset-name":
                                                                                    "train"})
                         if p.status.phase == "Running"]) == 2 else None), timeout=60)
    assert sorted(j.metadata.name for j in client.list(Job, namespace="default")) == ["train-workers-0",
                                                                                      "train-workers-1"]
    assert {p.spec.subdomain for p in pods} == {"train"}  # each pod resolvable by name in the JobSet's Service
    assert client.get(Service, "train", namespace="default").spec.clusterIP == "None"
    assert len({p.spec.nodeName for p in pods}) >= 1
    log = (cp.state_dir / "logs" / "jobset.log").read_text()
    assert "Starting workers" in log, log[-2000:]


def test_jobsets_webhooks_answer(jobset_rack: tuple[ControlPlane, Client]) -> None:
    _, client = jobset_rack
    with pytest.raises(ApiError) as refused:
        client.create(_jobset("Bad_Name", 1))
    assert refused.value.status.code in (400, 422)
    # The defaulting webhook ran: the stored JobSet carries its defaults.
    made = client.create(_jobset("defaults", 1))
    assert made["spec"]["successPolicy"]["operator"] == "All"


def test_an_unknown_addon_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown addon\\(s\\) volcano; known: jobset, lws, kueue"):
        addons.parse("jobset,volcano")
    assert addons.parse("kueue, jobset,kueue") == ("jobset", "kueue")  # Kueue after what it queues
