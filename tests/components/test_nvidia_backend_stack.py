"""The components on NVIDIA's backend: what they declare (pure), and one stack through the real Pulumi
CLI on the real API server holding NVIDIA's CRD, moved to nvlfabric's backend and back by one setting.

NVIDIA's controller does not run here: tests/support/nvidia_standin.py writes what it would (its template,
finalizer and status). No node runs pods, so the Job's pods stay Pending: this is about what a
platform repo's `pulumi preview` and `up` do, not about IMEX.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError
from lightkube.resources.batch_v1 import Job
from lightkube.types import PatchType

from nvlfabric.api import nvidia as nv
from nvlfabric.components import ComponentArgsError, ComputeDomain
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.provider.computedomain import CD
from nvlfabric.provider.nvidiadomain import NVIDIA_CD
from nvlfabric.review import impact, markdown, preview
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster
from tests.support.golden import check
from tests.support.golden import normalise as _normalise
from tests.support.nvidia_standin import nvidia_controller

NS = "default"
FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvidia_stack"
CRD_FILE = Path(__file__).parents[1] / "fixtures" / "nvidia" / f"{nv.CRD_NAME}.yaml"
TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}


# -- what the components declare (pure) --------------------------------------------------------------


def test_a_domain_refuses_at_construction_what_nvidias_driver_cannot_mean() -> None:
    with pytest.raises(ComponentArgsError) as err:
        ComputeDomain("cd", backend="nvidia", spec={"imexMode": "Dedicated"})
    assert "ComputeDomain 'cd': invalid arguments\n  spec.imexMode: spec.imexMode means nothing on backend " \
           "'nvidia'" in str(err.value)
    with pytest.raises(ComponentArgsError) as bad:
        ComputeDomain("cd", backend="nvdia")
    assert "backend: Input should be 'nvlfabric' or 'nvidia'" in str(bad.value)


def _nvidia_job(**kw: Any) -> BoundJobArgs:
    return BoundJobArgs.model_validate({"name": "train", "pod_template": TEMPLATE, "backend": "nvidia", **kw})


def test_on_nvidia_the_pods_reference_nvidias_template_and_are_kept_in_one_clique() -> None:
    args = _nvidia_job(parallelism=18)
    job = workload_manifests(args, namespace="ml", claim_name="cd-channel", domain="cd")[-1]
    spec = job["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "channel", "resourceClaimTemplateName": "cd-channel"}]
    assert "schedulingGates" not in spec  # nvlfabric's controller does not run there to lift one
    assert spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": {"matchLabels": {"nvlfabric.io/compute-domain": "cd", "nvlfabric.io/workload": "train"}},
         "topologyKey": "nvidia.com/gpu.clique"}]


def test_on_nvidia_a_job_bigger_than_a_clique_spans_cliques_and_keeps_the_users_affinity() -> None:
    mine = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    big = _nvidia_job(parallelism=72, gpus_per_pod=4)  # 288 GPUs: no 256-pod nor one-clique limit on NVIDIA's
    assert "affinity" not in workload_manifests(big, namespace="ml", claim_name="c", domain="cd")[-1][
        "spec"]["template"]["spec"]
    small = _nvidia_job(pod_template={"spec": {**TEMPLATE["spec"], "affinity": mine}}, parallelism=2)
    terms = workload_manifests(small, namespace="ml", claim_name="c", domain="cd")[-1]["spec"]["template"][
        "spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["kubernetes.io/hostname", "nvidia.com/gpu.clique"]


@pytest.mark.parametrize(("kw", "words"), [
    pytest.param({"reservation_gate": True}, "not running with NVIDIA", id="gate"),
    pytest.param({"scheduler": "kubernetes"}, "scheduler='kubernetes' over a ComputeDomain of backend nvidia",
                 id="scheduler"),
])
def test_on_nvidia_what_needs_nvlfabrics_controller_is_refused_naming_it(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        _nvidia_job(**kw)


# -- one stack through the Pulumi CLI ---------------------------------------------------------------


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Cluster:
    """NVIDIA's CRD (as its chart installs it) and nvlfabric's, both Established."""
    install_crd(cluster.client, yaml.safe_load(CRD_FILE.read_text()))
    install_crd(cluster.client)
    return cluster


@pytest.fixture
def domain(api: Cluster) -> Iterator[str]:
    name = f"nvmig-{uuid.uuid4().hex[:5]}"
    yield name
    for res in (NVIDIA_CD, CD):
        try:
            api.client.patch(res, name, {"metadata": {"finalizers": None}}, namespace=NS, patch_type=PatchType.MERGE)
            api.client.delete(res, name, namespace=NS)
        except ApiError:
            pass


def normalise(text: str, suffix: str) -> str:
    """As the ComputeDomain goldens, and the uids (the domain's, the default provider's) too."""
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", _normalise(text, suffix))


def _changes(proj: Any) -> dict[str, tuple[str, list[str]]]:
    """The preview's changed steps: 'Kind/name' (the type's last part) → (op, replace reasons)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for s in proj.json("preview", "--json")["steps"]:
        if s["op"] in ("same", "refresh"):
            continue
        type_, name = s["urn"].rsplit("::", 2)[-2:]
        name = f"{type_.rsplit(':', 1)[-1].rsplit('$', 1)[-1]}/{name}"
        op = "replace" if s["op"] in ("replace", "create-replacement", "delete-replaced") else s["op"]
        reasons = sorted({*out.get(name, ("", []))[1], *(s.get("replaceReasons") or [])})
        out[name] = (op, reasons)
    return out


@pytest.mark.cluster
@pytest.mark.pulumi
def test_a_stack_on_nvidias_backend_previews_clean_repairs_drift_and_moves_to_ours_and_back(
        api: Cluster, domain: str, tmp_path: Path) -> None:
    client = api.client
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=api.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "domain", domain)
    proj.run("config", "set", "nvlfabric:backend", "nvidia")

    # What NVIDIA's driver cannot mean fails the preview, naming the field; no traceback.
    proj.run("config", "set", "imexMode", "Dedicated")
    bad = proj.run("preview", check=False)
    assert bad.returncode != 0 and "spec.imexMode means nothing on backend 'nvidia'" in bad.stdout, bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr
    proj.run("config", "rm", "imexMode")

    with nvidia_controller(client, NS):
        proj.run("up", "--yes", "--skip-preview", timeout=300)
        assert proj.json("stack", "output", "--json") == {"claim_name": f"{domain}-channel", "channel": 0,
                                                           "scheduler": "kube-scheduler"}
        live = client.get(NVIDIA_CD, domain, namespace=NS)
        assert live["spec"]["channel"]["resourceClaimTemplate"]["name"] == f"{domain}-channel"
        pod_spec = client.get(Job, domain, namespace=NS).spec.template.spec
        assert [(r.name, r.resourceClaimTemplateName) for r in pod_spec.resourceClaims] == [
            ("channel", f"{domain}-channel")]

        # Clean previews, before and after a refresh.
        assert _changes(proj) == {}
        proj.run("refresh", "--yes")
        assert _changes(proj) == {}

        # Drift: a label changed behind the stack's back shows on refresh, and up puts it back.
        client.patch(NVIDIA_CD, domain, {"metadata": {"labels": {"team": "other"}}}, namespace=NS,
                     patch_type=PatchType.MERGE)
        drift = proj.run("refresh", "--diff", "--yes").stdout
        assert "other" in drift, drift
        proj.run("up", "--yes", "--skip-preview", timeout=300)
        assert client.get(NVIDIA_CD, domain, namespace=NS)["metadata"]["labels"]["team"] == "ml"

        # NVIDIA's spec is immutable: a numNodes change is a replace, named by the field.
        proj.run("config", "set", "numNodes", "2")
        assert _changes(proj) == {"ComputeDomain/train": ("replace", ["spec.numNodes"])}
        suffix = domain.removeprefix("nvmig-")
        check("preview_nvidia_replace_numnodes.txt", normalise(proj.run("preview", "--diff").stdout, suffix))
        proj.run("config", "rm", "numNodes")

        # The migration: one setting; the preview replaces the domain (for `backend`) and the Job
        # bound to it (its pods reference another claim), and nothing else.
        old_uid = live["metadata"]["uid"]
        proj.run("config", "set", "nvlfabric:backend", "nvlfabric")
        changes = _changes(proj)
        check("preview_nvidia_to_nvlfabric.txt", normalise(proj.run("preview", "--diff").stdout, suffix))
        # ... and the reviewer's report of it names the reason.
        report = markdown.render(impact.build(preview.load(proj.run("preview", "--json").stdout), None))
        check("report/migrate_nvidia.md", normalise(report, suffix))
        assert changes.pop("ComputeDomain/train") == ("replace", ["backend"]), changes
        assert changes.pop("Job/train")[0] == "replace", changes
        assert set(changes) <= {"Workload/train-workload-train", "PodGroup/train-podgroup-train"}, changes
        proj.run("up", "--yes", "--skip-preview", timeout=300)
        assert client.get(CD, domain, namespace=NS)["metadata"]["labels"]["team"] == "ml"
        eventually("NVIDIA's domain to go", lambda: not [o for o in client.list(NVIDIA_CD, namespace=NS)
                                                         if o["metadata"]["name"] == domain], timeout=30)
        pod_spec = client.get(Job, domain, namespace=NS).spec.template.spec
        assert [(r.name, r.resourceClaimName) for r in pod_spec.resourceClaims] == [("channel", f"{domain}-channel")]
        assert _changes(proj) == {}

        # ... and back.
        proj.run("config", "set", "nvlfabric:backend", "nvidia")
        assert _changes(proj).get("ComputeDomain/train") == ("replace", ["backend"])
        proj.run("up", "--yes", "--skip-preview", timeout=300)
        assert client.get(NVIDIA_CD, domain, namespace=NS)["metadata"]["uid"] != old_uid
        proj.run("destroy", "--yes", "--skip-preview", timeout=300)
        time.sleep(0.5)
    assert not [o for o in client.list(NVIDIA_CD, namespace=NS) if o["metadata"]["name"] == domain]
    assert not [o for o in client.list(CD, namespace=NS) if o["metadata"]["name"] == domain]
