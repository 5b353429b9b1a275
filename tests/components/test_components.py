"""The components: argument validation (pure, no cluster) and one run through the real Pulumi CLI on
a simulated rack (driver + ComputeDomain + a Job of two pods → Ready, channel in the pods → destroy)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric import manifests
from nvlfabric.api import names
from nvlfabric.components import (
    BoundJob,
    ComponentArgsError,
    ComputeDomain,
    Nvl72Rack,
    NvlfabricDriver,
    NvlfabricDriverArgs,
)
from nvlfabric.components.driver import driver_objects
from nvlfabric.components.schema import package_schema
from nvlfabric.components.workload import BoundJobArgs, job_manifest, workload_manifests
from nvlfabric.sim.cluster import eventually, ready_domain_status
from nvlfabric.testbed.controlplane import ControlPlane
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import free_ports, simulated_rack, stuck_deletions
from tests.support.pulumimocks import EchoMocks

TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}


def _error(fn: Any, **kwargs: Any) -> str:
    with pytest.raises(ComponentArgsError) as err:
        fn("x", **kwargs)
    return str(err.value)


# -- validation: every bad argument fails at construction, naming the field and the fix ----------


def test_driver_args_name_the_field_and_the_fix() -> None:
    msg = _error(NvlfabricDriver, channels_per_clique=5000)
    assert "NvlfabricDriver 'x'" in msg and "channels_per_clique" in msg and "1..2047" in msg and "5000" in msg
    msg = _error(NvlfabricDriver, driver_root="run/nvidia")
    assert "driver_root" in msg and "absolute" in msg
    assert "image" in _error(NvlfabricDriver, image="Bad Image")


def test_compute_domain_args() -> None:
    msg = _error(ComputeDomain, name="Train_1")
    assert "ComputeDomain 'x'" in msg and "name" in msg and "DNS label" in msg
    msg = _error(ComputeDomain, name="ok", spec={"imexMode": "Sometimes"})
    assert "spec.imexMode" in msg
    assert "spec.bogus" in _error(ComputeDomain, name="ok", spec={"bogus": 1})


@pytest.mark.parametrize(("kwargs", "field", "words"), [
    ({"gpus_per_pod": 8}, "gpus_per_pod", "0..4"),
    ({"parallelism": 0}, "parallelism", "1..256"),
    ({"parallelism": 300, "gpu_resource": None, "gpus_per_pod": 0}, "parallelism", "reservedFor"),
    ({"name": "Job_A"}, "name", "DNS label"),
    ({"pod_template": {"spec": {"containers": []}}}, "pod_template", "non-empty list"),
    ({"pod_template": {"spec": {"containers": [{"name": "w"}]}}}, "pod_template", "name and an image"),
    ({"parallelism": 19, "gpus_per_pod": 4}, "parallelism", "72"),
    ({"kind": "Deployment"}, "kind", "'Job', 'StatefulSet', 'JobSet' or 'LeaderWorkerSet'"),
    ({"kind": "StatefulSet", "pod_template": {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "w", "image": "i"}]}}}, "pod_template", "restartPolicy of a StatefulSet's pods must be Always"),
    ({"pod_template": {"spec": {"restartPolicy": "Always", "containers": [{"name": "w", "image": "i"}]}}},
     "pod_template", "restartPolicy of a Job's pods must be Never or OnFailure"),
    ({"kind": "LeaderWorkerSet", "completions": 3}, "completions", "completions applies to Job and JobSet"),
])
def test_bound_job_args(kwargs: dict[str, Any], field: str, words: str) -> None:
    args = {"name": "job", "pod_template": TEMPLATE} | kwargs
    msg = _error(BoundJob, compute_domain=None, **args)
    assert f"  {field}:" in msg and words in msg, msg


def test_bound_job_needs_a_compute_domain() -> None:
    msg = _error(BoundJob, compute_domain="cd-channel", pod_template=TEMPLATE)
    assert "compute_domain: expected a nvlfabric.ComputeDomain (got str)" in msg


def test_rack_args() -> None:
    msg = _error(Nvl72Rack, nodes=[f"n{i}" for i in range(19)])
    assert "nodes" in msg and "1..18" in msg
    assert "unique" in _error(Nvl72Rack, nodes=["a", "a"])


def test_a_kubelet_root_too_long_for_the_keepers_socket_fails_naming_it() -> None:
    from nvlfabric.components.args import validate
    with pytest.raises(ComponentArgsError) as err:
        validate(NvlfabricDriverArgs, "NvlfabricDriver", "d", {"kubelet_root": "/" + "k" * 80})
    msg = str(err.value)
    assert "kubelet_root:" in msg and "socket under it would have 127 bytes" in msg and "at most 107" in msg


def test_unknown_argument_is_named() -> None:
    from nvlfabric.components.args import validate
    with pytest.raises(ComponentArgsError) as err:
        validate(NvlfabricDriverArgs, "NvlfabricDriver", "d", {"imagee": "x"})
    assert "imagee: unknown argument; valid ones are image, driver_root" in str(err.value)


# -- what the components produce (pure) ------------------------------------------------------------


def test_job_manifest_binds_every_container_to_the_domain_claim() -> None:
    tpl = {"spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i",
                                                                   "resources": {"limits": {"cpu": "1"}}}]}}
    args = BoundJobArgs(name="j", pod_template=tpl, parallelism=3, gpus_per_pod=2)
    job = job_manifest(args, namespace="ml", claim_name="cd-channel", domain="cd")
    spec = job["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "channel", "resourceClaimName": "cd-channel"}]
    assert [c["resources"]["claims"] for c in spec["containers"]] == [[{"name": "channel"}]] * 2
    # The pod's GPUs on one container (the first), not on each: the pod asks for 2, not 4.
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert spec["containers"][1]["resources"]["limits"] == {"cpu": "1"}
    assert spec["restartPolicy"] == "Never"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 3
    # Not waited for: no readiness check of pulumi-kubernetes' at all (its refresh would call a
    # running Job "failed to initialize"), deleted in the background (the domain waits its pods out).
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true",
                                              "pulumi.com/deletionPropagationPolicy": "background"}
    assert job["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvlfabric"
    assert tpl["spec"].get("resourceClaims") is None  # the user's template is not modified
    waiting = job_manifest(BoundJobArgs(name="j", pod_template=tpl, wait=True, gpu_resource=None),
                           namespace="ml", claim_name="c", domain="cd")
    assert waiting["metadata"]["annotations"] == {"pulumi.com/deletionPropagationPolicy": "foreground"}
    assert "limits" not in waiting["spec"]["template"]["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize("kind", ["Job", "StatefulSet", "JobSet", "LeaderWorkerSet"])
def test_every_workload_shape_binds_its_pods_to_the_domain(kind: str) -> None:
    args = BoundJobArgs(name="w", kind=kind, pod_template=TEMPLATE, parallelism=4, gpus_per_pod=2)  # type: ignore[arg-type]
    objs = workload_manifests(args, namespace="ml", claim_name="cd-channel", domain="cd")
    main = objs[-1]
    assert main["kind"] == kind and main["metadata"]["namespace"] == "ml"
    assert main["metadata"]["annotations"]["pulumi.com/deletionPropagationPolicy"] == (
        "background" if kind in ("Job", "StatefulSet") else "foreground")
    spec = main["spec"]
    if kind == "Job":
        pod, pods = spec["template"], spec["parallelism"]
    elif kind == "StatefulSet":
        pod, pods = spec["template"], spec["replicas"]
        assert spec["podManagementPolicy"] == "Parallel"  # members start together, not one by one
        (svc,) = objs[:-1]
        assert svc["kind"] == "Service" and svc["spec"]["clusterIP"] == "None"
        assert spec["serviceName"] == svc["metadata"]["name"]
        assert spec["selector"]["matchLabels"] == svc["spec"]["selector"]
        assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    elif kind == "JobSet":
        (rj,) = spec["replicatedJobs"]
        pod, pods = rj["template"]["spec"]["template"], rj["replicas"] * rj["template"]["spec"]["parallelism"]
    else:
        assert spec["replicas"] == 1
        pod, pods = spec["leaderWorkerTemplate"]["workerTemplate"], spec["leaderWorkerTemplate"]["size"]
    assert pods == 4
    assert pod["metadata"]["labels"]["nvlfabric.io/compute-domain"] == "cd"
    assert pod["spec"]["resourceClaims"] == [{"name": "channel", "resourceClaimName": "cd-channel"}]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "channel"}],
                                                         "limits": {"nvidia.com/gpu": "2"}}
    assert pod["spec"]["restartPolicy"] == ("Never" if kind in ("Job", "JobSet") else "Always")
    # held until nvlfabric's controller has reserved the claim for the pod (nvlfabric/controller/reservations.py)
    assert pod["spec"]["schedulingGates"] == [{"name": "nvlfabric.io/channel-reservation"}]


def test_the_reservation_gate_keeps_the_users_gates_and_can_be_left_out() -> None:
    tpl = {"spec": {"containers": [{"name": "a", "image": "i"}], "schedulingGates": [{"name": "example.com/q"}]}}
    args = BoundJobArgs(name="j", pod_template=tpl)
    spec = workload_manifests(args, namespace="ml", claim_name="c", domain="cd")[-1]["spec"]["template"]["spec"]
    assert spec["schedulingGates"] == [{"name": "example.com/q"}, {"name": "nvlfabric.io/channel-reservation"}]
    off = BoundJobArgs(name="j", pod_template=TEMPLATE, reservation_gate=False)
    assert "schedulingGates" not in workload_manifests(off, namespace="ml", claim_name="c",
                                                       domain="cd")[-1]["spec"]["template"]["spec"]


# -- what a distributed launcher needs, without hand wiring (pure) ------------------------------

LAUNCHER_VARS = ["NVLFABRIC_RANK", "NVLFABRIC_WORLD_SIZE", "NVLFABRIC_MASTER_ADDR", "NVLFABRIC_MASTER_PORT",
                 "NODE_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
TORCHRUN = ("torchrun --nnodes=$(NVLFABRIC_WORLD_SIZE) --node-rank=$(NVLFABRIC_RANK) "
            "--master-addr=$(NVLFABRIC_MASTER_ADDR) --master-port=$(NVLFABRIC_MASTER_PORT)")


def _pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "JobSet":
        return spec["replicatedJobs"][0]["template"]["spec"]["template"]  # type: ignore[no-any-return]
    if obj["kind"] == "LeaderWorkerSet":
        return spec["leaderWorkerTemplate"]["workerTemplate"]  # type: ignore[no-any-return]
    return spec["template"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("kind", "rank_from", "master"), [
    ("Job", "metadata.annotations['batch.kubernetes.io/job-completion-index']", "train-0.train.ml.svc"),
    ("StatefulSet", "metadata.labels['apps.kubernetes.io/pod-index']", "train-0.train.ml.svc"),
    ("JobSet", "metadata.annotations['batch.kubernetes.io/job-completion-index']",
     "train-workers-0-0.train.ml.svc"),
    ("LeaderWorkerSet", "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']", "$(LWS_LEADER_ADDRESS)"),
])
def test_every_container_gets_its_rank_the_world_size_and_rank_0s_address(kind: str, rank_from: str,
                                                                          master: str) -> None:
    tpl = {"spec": {"initContainers": [{"name": "wait", "image": "i"}],
                    "containers": [{"name": "a", "image": "i", "command": ["sh", "-c", TORCHRUN]},
                                   {"name": "b", "image": "i"}]}}
    args = BoundJobArgs(name="train", kind=kind, pod_template=tpl, parallelism=16,  # type: ignore[arg-type]
                        gpus_per_pod=4, master_port=23456)
    objs = workload_manifests(args, namespace="ml", claim_name="cd-channel", domain="cd")
    pod = _pod_template(objs[-1])["spec"]
    rank = {"valueFrom": {"fieldRef": {"fieldPath": rank_from}}}
    for c in [*pod["initContainers"], *pod["containers"]]:
        env = {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in c["env"]}
        assert [e["name"] for e in c["env"]] == LAUNCHER_VARS, c["name"]
        assert env["NVLFABRIC_RANK"] == env["NODE_RANK"] == env["RANK"] == rank
        assert env["NVLFABRIC_WORLD_SIZE"] == env["WORLD_SIZE"] == {"value": "16"}
        assert env["NVLFABRIC_MASTER_ADDR"] == env["MASTER_ADDR"] == {"value": master}
        assert env["NVLFABRIC_MASTER_PORT"] == env["MASTER_PORT"] == {"value": "23456"}
    assert pod["containers"][0]["command"] == ["sh", "-c", TORCHRUN]  # the user's line, expanded by the kubelet
    assert tpl["spec"]["containers"][0].get("env") is None  # the user's template is not modified


def test_the_pods_get_stable_dns_names_under_a_headless_service() -> None:
    """rank 0's address resolves: a headless Service (publishing not-ready pods, so rank 0 is found
    while the others start) whose name is the pods' subdomain; its selector picks exactly the
    workload's pods."""
    for kind in ("Job", "StatefulSet"):
        args = BoundJobArgs(name="train", kind=kind, pod_template=TEMPLATE, parallelism=4)  # type: ignore[arg-type]
        svc, main = workload_manifests(args, namespace="ml", claim_name="c", domain="cd")
        assert svc["kind"] == "Service" and svc["metadata"] == {
            "name": "train", "namespace": "ml", "labels": main["metadata"]["labels"]}
        assert svc["spec"] == {"clusterIP": "None", "publishNotReadyAddresses": True,
                               "selector": {"nvlfabric.io/compute-domain": "cd", "nvlfabric.io/workload": "train"}}
        pod = main["spec"]["template"]
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        if kind == "Job":  # Indexed Job pods are hosts <job>-<index>; the subdomain puts them under the Service
            assert pod["spec"]["subdomain"] == "train"
        else:  # a StatefulSet's pods take the Service from serviceName
            assert main["spec"]["serviceName"] == "train" and "subdomain" not in pod["spec"]
    js = workload_manifests(BoundJobArgs(name="train", kind="JobSet", pod_template=TEMPLATE),
                            namespace="ml", claim_name="c", domain="cd")
    assert [o["kind"] for o in js] == ["JobSet"]  # JobSet makes its headless Service itself
    assert js[0]["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "train",
                                        "publishNotReadyAddresses": True}
    assert js[0]["spec"]["replicatedJobs"][0]["name"] == "workers"  # the name rank 0's address is built from
    assert "failurePolicy" not in js[0]["spec"]  # unchanged from 0.1.0's shape: no restarts by default


def test_a_jobset_with_max_restarts_is_recreated_whole_each_old_pod_gone_first() -> None:
    js = job_manifest(BoundJobArgs(name="train", kind="JobSet", pod_template=TEMPLATE, max_restarts=2),
                      namespace="ml", claim_name="c", domain="cd")
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 2, "restartStrategy": "BlockingRecreate"}
    with pytest.raises(ValueError, match=r"max_restarts applies to JobSet .*not Job: leave it unset .*backoffLimit"):
        BoundJobArgs(name="train", pod_template=TEMPLATE, max_restarts=1)
    with pytest.raises(ValueError, match=r"max_restarts applies to JobSet .*not StatefulSet"):
        BoundJobArgs(name="train", kind="StatefulSet", pod_template=TEMPLATE, max_restarts=1)


def test_a_variable_the_user_set_wins_and_may_refer_to_the_injected_ones() -> None:
    tpl = {"spec": {"containers": [{"name": "a", "image": "i", "env": [
        {"name": "MASTER_PORT", "value": "1234"},
        {"name": "NVLFABRIC_RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['my/rank']"}}},
        {"name": "PEER", "value": "$(NVLFABRIC_MASTER_ADDR):$(NVLFABRIC_MASTER_PORT)"}]}]}}
    args = BoundJobArgs(name="train", pod_template=tpl, parallelism=2)
    env = job_manifest(args, namespace="ml", claim_name="c", domain="cd")["spec"]["template"]["spec"][
        "containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("MASTER_PORT") == names.count("NVLFABRIC_RANK") == 1  # the user's, not a second one
    assert env[-3:] == tpl["spec"]["containers"][0]["env"]  # theirs, unchanged, after ours
    # ours come first: `$(VAR)` expands only entries defined before it
    assert names.index("NVLFABRIC_MASTER_ADDR") < names.index("PEER")
    assert {"name": "NVLFABRIC_MASTER_PORT", "value": "29500"} in env  # torch's default port


@pytest.mark.parametrize(("kwargs", "field", "words"), [
    ({"master_port": 0}, "master_port", "greater than or equal to 1"),
    ({"master_port": 70000}, "master_port", "1..65535"),
    ({"pod_template": {"spec": {"subdomain": "mine", "containers": [{"name": "w", "image": "i"}]}}},
     "pod_template", "spec.subdomain is set by BoundJob"),
    ({"pod_template": {"spec": {"hostname": "h", "containers": [{"name": "w", "image": "i"}]}}},
     "pod_template", "spec.hostname is set by BoundJob"),
])
def test_launcher_arguments_are_checked_naming_the_field(kwargs: dict[str, Any], field: str, words: str) -> None:
    msg = _error(BoundJob, compute_domain=None, **({"name": "job", "pod_template": TEMPLATE} | kwargs))
    assert f"  {field}:" in msg and words in msg, msg


def test_driver_objects_apply_the_settings_and_label_everything() -> None:
    args = NvlfabricDriverArgs(image="registry.example/nvl:1.2", kubelet_root="/data/kubelet",
                               driver_root="/", channels_per_clique=256)
    objs = driver_objects(args)
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvlfabric" for o in objs)
    assert all("app.kubernetes.io/component" in o["metadata"]["labels"] for o in objs)
    kinds = {o["kind"]: o for o in objs}
    assert {"Namespace", "DeviceClass", "DaemonSet", "Deployment", "ClusterRole"} <= set(kinds)
    ds = kinds["DaemonSet"]["spec"]["template"]["spec"]
    assert ds["containers"][0]["image"] == "registry.example/nvl:1.2"
    assert {"name": "KUBELET_ROOT", "value": "/data/kubelet"} in ds["containers"][0]["env"]
    vols = {v["name"]: v["hostPath"]["path"] for v in ds["volumes"]}
    assert vols["kubelet"] == "/data/kubelet" and vols["driver-root"] == "/"
    ctl = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "CHANNELS_PER_CLIQUE", "value": "256"} in ctl["env"]


def _controller_env(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
    env: list[dict[str, Any]] = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    return env


@pytest.mark.parametrize("quota", [None, 0, 5, names.MAX_CHANNEL_QUOTA_PER_NAMESPACE])
def test_the_channel_quota_per_namespace_is_the_controllers_setting(quota: int | None) -> None:
    """Rendered as CHANNELS_PER_CLIQUE is: set in the manifest's controller env, or added where an
    older driver.yaml has none (0 is "no quota", written as such)."""
    args = NvlfabricDriverArgs(**({} if quota is None else {"channel_quota_per_namespace": quota}))
    want = {"name": "CHANNEL_QUOTA_PER_NAMESPACE",
            "value": str(names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE if quota is None else quota)}
    assert [e for e in _controller_env(driver_objects(args)) if e["name"] == want["name"]] == [want]
    older = "\n".join(ln for ln in manifests.read(manifests.DRIVER_FILE).splitlines()
                      if "CHANNEL_QUOTA_PER_NAMESPACE" not in ln)
    assert [e for e in _controller_env(driver_objects(args, older)) if e["name"] == want["name"]] == [want]


def test_the_channel_quota_setting_is_an_input_of_the_component_provider_with_its_description() -> None:
    driver = package_schema()["resources"]["nvlfabric:index:NvlfabricDriver"]["inputProperties"]
    description = NvlfabricDriverArgs.model_fields["channel_quota_per_namespace"].description or ""
    assert driver["channelQuotaPerNamespace"] == {
        "type": "integer", "default": names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE, "description": description}
    assert names.CHANNEL_QUOTA_ANNOTATION in description and "ResourceQuota" in description
    assert "0 turns the quota off" in description
    assert NvlfabricDriver("q", channel_quota_per_namespace=0).args.channel_quota_per_namespace == 0
    for bad, words in ((-1, "Input should be greater than or equal to 0 (got -1)"),
                       (names.MAX_CHANNEL_QUOTA_PER_NAMESPACE + 1,
                        f"Input should be less than or equal to {names.MAX_CHANNEL_QUOTA_PER_NAMESPACE}"),
                       (True, "Input should be a valid integer, not a boolean (got True)")):
        assert f"  channel_quota_per_namespace: {words}" in _error(NvlfabricDriver, channel_quota_per_namespace=bad)


def test_a_domain_refuses_more_than_256_pods_over_its_workloads() -> None:
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    cd = ComputeDomain("cd")
    BoundJob("a", compute_domain=cd, pod_template=TEMPLATE, parallelism=200, gpus_per_pod=0)
    with pytest.raises(ComponentArgsError) as err:
        BoundJob("b", compute_domain=cd, pod_template=TEMPLATE, parallelism=57, gpus_per_pod=0)
    assert "257 pods" in str(err.value) and "at most 256" in str(err.value)


def test_the_component_takes_reservation_gate_as_the_readme_shows() -> None:
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    job = BoundJob("ungated", compute_domain=ComputeDomain("cd"), pod_template=TEMPLATE, reservation_gate=False)
    assert job.args.reservation_gate is False


def test_a_domain_awaiting_ready_refuses_bound_workloads() -> None:
    """Its Job would be created only after the domain is Ready, which needs the Job's pods: `pulumi
    up` would hang for timeout_s (600 s by default) and fail. Refused at construction instead."""
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    cd = ComputeDomain("cd", spec={"numNodes": 18}, await_for="Ready")
    with pytest.raises(ComponentArgsError) as err:
        BoundJob("train", compute_domain=cd, pod_template=TEMPLATE, parallelism=72, gpus_per_pod=1)
    msg = str(err.value)
    assert "ComputeDomain 'cd': await_for='Ready' with workload 'train' bound to it" in msg
    assert "timeout_s (600 s)" in msg and "await_for='Accepted'" in msg


# -- end to end through the real Pulumi CLI on a simulated rack -----------------------------------

PORTS = free_ports()  # a control plane of its own; free ports so sessions never clash
RACK = 160
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "components_stack"


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, field_manager="components-test", prefix="nvlcomp-") as sim:
        yield sim


@pytest.mark.cluster
@pytest.mark.pulumi
def test_up_runs_bound_pods_with_the_channel_and_destroy_leaves_nothing(
        rack: tuple[ControlPlane, Client], tmp_path: Path) -> None:
    from nvlfabric.controller.cache import ComputeDomainResource

    cp, client = rack
    domain = f"train-{uuid.uuid4().hex[:5]}"
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "domain", domain)
    # A bad argument stops `pulumi preview`, naming the component, the field and the fix.
    proj.run("config", "set", "channels", "5000")
    bad = proj.run("preview", check=False)
    assert bad.returncode != 0
    assert "NvlfabricDriver 'driver': invalid arguments" in bad.stdout, bad.stdout
    assert "channels_per_clique: Input should be less than or equal to 2047 (got 5000)" in bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr
    proj.run("config", "rm", "channels")
    proj.run("config", "set", "crdShapes", "true")
    proj.run("config", "set", "rackNodes", json.dumps([n.name for n in cp.nodes()]))
    proj.run("config", "set", "rackName", f"rack-{RACK}")
    proj.run("up", "--yes", "--skip-preview", timeout=300)
    for group, version, kind, plural, template_at in (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets",
             lambda sp: sp["replicatedJobs"][0]["template"]["spec"]["template"]),
            ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets",
             lambda sp: sp["leaderWorkerTemplate"]["workerTemplate"])):
        res = create_namespaced_resource(group, version, kind, plural)
        obj = client.get(res, f"{domain}-{kind.lower()}", namespace="default")
        pod = template_at(obj.spec)
        assert pod["spec"]["resourceClaims"] == [{"name": "channel", "resourceClaimName": f"{domain}-channel"}], kind
    outputs = proj.json("stack", "output", "--json")
    assert outputs == {"claim_name": f"{domain}-channel", "device_class": "imex-channel.nvlfabric.io",
                       "job": domain, "server": f"{domain}-serve"}

    status = ready_domain_status(client, domain)
    members = {"nvlfabric.io/compute-domain": domain}
    eventually("the Job's two pods and the StatefulSet's one to run", lambda: len(
        [p for p in client.list(Pod, namespace="default", labels=members) if p.status.phase == "Running"]) == 3,
        timeout=60)

    # Clean previews: with everything running, neither `preview` nor `preview --refresh` plans a
    # change, nor `preview` after a `refresh` (a running Job was an update with an empty diff).
    def changes(*args: str) -> list[tuple[str, str]]:
        return [(s["op"], s["urn"].rsplit("::", 1)[1]) for s in proj.json("preview", "--json", *args)["steps"]
                if s["op"] not in ("same", "refresh")]

    assert changes() == [] and changes("--refresh") == []
    proj.run("refresh", "--yes")
    assert changes() == []

    # Drift: the domain's spec edited and the StatefulSet deleted behind the stack's back show in
    # `refresh --diff`, and `up` puts back what the program declares.
    from lightkube.resources.apps_v1 import StatefulSet
    from lightkube.types import PatchType

    client.patch(ComputeDomainResource, domain, {"spec": {"numNodes": 7}}, namespace="default",
                 patch_type=PatchType.MERGE)
    client.delete(StatefulSet, f"{domain}-serve", namespace="default")
    eventually("the StatefulSet to go", lambda: not list(client.list(
        StatefulSet, namespace="default", fields={"metadata.name": f"{domain}-serve"})), timeout=60)
    drift = proj.run("refresh", "--diff", "--yes").stdout
    assert "numNodes" in drift and "7" in drift, drift
    assert "kubernetes:apps/v1:StatefulSet: (delete)" in drift or "StatefulSet" in drift, drift
    proj.run("up", "--yes", "--skip-preview", timeout=300)
    assert "numNodes" not in client.get(ComputeDomainResource, domain, namespace="default").spec
    assert client.get(StatefulSet, f"{domain}-serve", namespace="default").metadata.uid
    pods = eventually("the Job's two pods and the StatefulSet's one to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default", labels=members)
                         if p.status.phase == "Running"]) == 3 else None), timeout=60)
    assert f"{domain}-serve-0" in {p.metadata.name for p in pods}
    channel = status["channel"]
    assert isinstance(channel, int) and channel >= 1
    for pod in pods:
        rec = json.loads((cp.state_dir / "nodes" / pod.spec.nodeName / "containers"
                          / f"default_{pod.metadata.name}_worker.json").read_text())
        assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c",
                                       "major": 507, "minor": channel}], rec
        assert f"NVLFABRIC_COMPUTE_DOMAIN={domain}" in rec["env"]

    # A change to the domain: numNodes is an update in place, imexMode a replacement.
    def domain_step() -> dict[str, Any]:
        """The one changed step of the preview: the domain's dynamic resource (its workloads and the
        claim inside it are untouched by these changes)."""
        steps = proj.json("preview", "--json")["steps"]
        changed = [st for st in steps if st["op"] != "same"]
        ops = {st["op"] for st in changed}
        assert all("dynamic/nvlfabric:ComputeDomain::" in st["urn"] for st in changed), \
            [(st["urn"], st.get("detailedDiff")) for st in changed]
        assert len({st["urn"] for st in changed}) == 1, changed
        return {"op": "replace" if "replace" in ops or "create-replacement" in ops else ops.pop(),
                "replaceReasons": sorted({r for st in changed for r in st.get("replaceReasons") or []})}

    proj.run("config", "set", "numNodes", "1")
    assert domain_step()["op"] == "update"
    proj.run("config", "set", "imexMode", "Dedicated")
    replace = domain_step()
    assert replace["op"] == "replace", replace
    assert "spec.imexMode" in (replace.get("replaceReasons") or []), replace
    proj.run("config", "rm", "imexMode")
    proj.run("up", "--yes", "--skip-preview", timeout=300)
    assert client.get(ComputeDomainResource, domain, namespace="default").spec["numNodes"] == 1

    try:
        proj.run("destroy", "--yes", "--skip-preview", timeout=300)
    except subprocess.TimeoutExpired as exc:  # say what the delete waited on (seen once, not reproduced)
        raise AssertionError(f"destroy hung: {exc.output!r}\n{stuck_deletions(cp, client)}") from exc
    assert not list(client.list(Pod, namespace="default"))
    assert not list(client.list(ResourceClaim, namespace="default"))
    assert not [p for p in client.list(Pod, namespace="nvlfabric-system")
                if p.metadata.deletionTimestamp is None]
    # ... and no channel is prepared on any node: no CDI spec, no channel node, no checkpoint entry.
    for node in cp.nodes():
        assert not list(node.cdi_dirs[1].glob("k8s.channel.nvlfabric.io-claim_*")), node.name
        assert not list((node.driver_root / "dev" / "nvidia-caps-imex-channels").glob("channel*")), node.name
        cp_file = node.kubelet_root / "plugins" / "channel.nvlfabric.io" / "checkpoint.json"
        assert not cp_file.exists() or json.loads(cp_file.read_text())["claims"] == {}, node.name


@pulumi.runtime.test
def test_the_components_wire_up_under_mocks() -> Any:
    pulumi.runtime.set_mocks(EchoMocks(), preview=False)
    driver = NvlfabricDriver("nvl")
    rack = Nvl72Rack("rack-7", nodes=["rack-7-node-00", "rack-7-node-01"], expected_clique="abc.1")
    cd = ComputeDomain("wired", opts=pulumi.ResourceOptions(depends_on=[driver]))
    job = BoundJob("wired", compute_domain=cd, pod_template=TEMPLATE, parallelism=2, gpus_per_pod=4)
    assert rack.labelled_nodes == ["rack-7-node-00", "rack-7-node-01"] and cd.bound_pods == 2

    def check(args: list[Any]) -> None:
        gpus, spec, job_name = args
        assert gpus == 8 and job_name == "wired"
        pod = spec["template"]["spec"]
        assert pod["containers"][0]["resources"] == {"claims": [{"name": "channel"}],
                                                     "limits": {"nvidia.com/gpu": "4"}}
        # (the mocks hand outputs back with Python names)
        claims = pod.get("resourceClaims") or pod.get("resource_claims")
        assert claims[0]["name"] == "channel"

    return pulumi.Output.all(rack.gpus, job.job.spec, job.job_name).apply(check)


def test_the_agent_image_runs_what_the_simulator_runs() -> None:
    """The Dockerfile's entrypoint and the simulator's image mapping must not drift apart."""
    import json as _json
    import sys as _sys
    from pathlib import Path as _Path

    from nvlfabric.sim.images import default_images

    dockerfile = (_Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile").read_text()
    (entry,) = [line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")]
    argv = _json.loads(entry.removeprefix("ENTRYPOINT"))
    assert default_images()["nvlfabric/node-agent"].entrypoint == [_sys.executable, *argv[1:]]
    assert argv[0] == "python"
    # `imex` execs the keeper's program: the image puts it on the PATH, the simulator's image names it.
    assert "COPY --from=keeper /out/nvlfabric-imex-keeper /usr/local/bin/nvlfabric-imex-keeper" in dockerfile
    assert "make -C /src/keeper OUT=/out" in dockerfile
    keeper = default_images()["nvlfabric/node-agent"].env["NVLFABRIC_IMEX_KEEPER"]
    assert keeper.endswith("/keeper/nvlfabric-imex-keeper")


def test_the_driver_passes_the_allowed_imex_modes_to_the_agents_and_the_controller() -> None:
    objs = driver_objects(NvlfabricDriverArgs(imex_modes=["CliqueScoped"]))  # type: ignore[list-item]
    ds, keeper = [o for o in objs if o["kind"] == "DaemonSet"]
    assert {"name": "IMEX_MODES", "value": "CliqueScoped"} in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    # The keeper runs whatever the agent asks for: the modes are the agent's setting only.
    assert keeper["metadata"]["name"] == "nvlfabric-imex"
    assert all(e["name"] != "IMEX_MODES" for e in keeper["spec"]["template"]["spec"]["containers"][0]["env"])
    # The controller knows them as well: it fails a domain of another mode instead of placing it.
    ctl = next(o for o in objs if o["kind"] == "Deployment")
    assert {"name": "IMEX_MODES", "value": "CliqueScoped"} in ctl["spec"]["template"]["spec"]["containers"][0]["env"]
    default = next(o for o in driver_objects(NvlfabricDriverArgs()) if o["kind"] == "DaemonSet")
    assert {"name": "IMEX_MODES", "value": "CliqueScoped,Dedicated"} in \
        default["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "each IMEX mode at most once" in _error(NvlfabricDriver, imex_modes=["Dedicated", "Dedicated"])


# -- one job over several cliques -----------------------------------------------------------------

MULTI = {"numNodes": 72, "placement": {"scope": "MultiClique", "cliques": 4}}


def test_a_job_over_a_multi_clique_domain_is_a_group_per_clique_with_one_rank_order() -> None:
    args = BoundJobArgs(name="train", parallelism=72, gpus_per_pod=4, clique_groups=4, pod_template=TEMPLATE)
    claims = [f"big-channel-{g}" for g in range(4)]
    svc, *jobs = workload_manifests(args, namespace="ml", claim_name=claims[0], domain="big", claims=claims)
    assert svc["kind"] == "Service" and [j["metadata"]["name"] for j in jobs] == [f"train-{g}" for g in range(4)]
    for g, job in enumerate(jobs):
        tpl = job["spec"]["template"]
        assert job["spec"]["parallelism"] == job["spec"]["completions"] == 18
        assert tpl["spec"]["resourceClaims"] == [{"name": "channel", "resourceClaimName": f"big-channel-{g}"}]
        assert tpl["metadata"]["annotations"] == {"nvlfabric.io/group-size": "18", "nvlfabric.io/clique-group": str(g)}
        assert tpl["spec"]["subdomain"] == "train" and svc["spec"]["selector"].items() <= tpl["metadata"][
            "labels"].items()
        env = {e["name"]: e for e in tpl["spec"]["containers"][0]["env"]}
        rank_field = env["NVLFABRIC_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert rank_field == "metadata.annotations['nvlfabric.io/rank']"
        assert env["NVLFABRIC_WORLD_SIZE"]["value"] == "72"
        assert env["NVLFABRIC_MASTER_ADDR"]["value"] == "train-0-0.train.ml.svc"
    (jobset,) = workload_manifests(args.model_copy(update={"kind": "JobSet"}), namespace="ml", claim_name=claims[0],
                                   domain="big", claims=claims)
    assert [r["name"] for r in jobset["spec"]["replicatedJobs"]] == [f"workers-{g}" for g in range(4)]


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"parallelism": 70}, "parallelism 70 does not split evenly over the ComputeDomain's 4 clique groups"),
    ({"kind": "LeaderWorkerSet"}, "a LeaderWorkerSet's groups share one pod template"),
    ({"reservation_gate": False}, "reservation_gate=False over a MultiClique domain"),
])
def test_a_job_that_cannot_be_split_over_the_cliques_is_refused_naming_why(kwargs: dict[str, Any], words: str) -> None:
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    cd = ComputeDomain("big", spec=MULTI)
    args = {"parallelism": 72, "gpus_per_pod": 4, "pod_template": TEMPLATE} | kwargs
    msg = _error(BoundJob, compute_domain=cd, **args)
    assert words in msg, msg


def test_a_single_clique_domain_of_19_nodes_fails_at_preview_naming_the_fix() -> None:
    msg = _error(ComputeDomain, spec={"numNodes": 19})
    assert "spec.numNodes (19) is more nodes than one NVL72 clique has (18)" in msg
    assert "placement: {scope: MultiClique, cliques: N}" in msg


def test_76_gpus_over_a_multi_clique_domain_fit_where_one_clique_would_not() -> None:
    pulumi.runtime.set_mocks(EchoMocks(), preview=True)
    cd = ComputeDomain("big2", spec={"placement": {"scope": "MultiClique", "cliques": 2}})
    job = BoundJob("j", compute_domain=cd, pod_template=TEMPLATE, parallelism=38, gpus_per_pod=2)
    assert job.args.group_size == 19 and len(job.jobs) == 2


def test_preview_says_when_a_job_needs_more_racks_or_free_gpus_than_declared() -> None:
    from nvlfabric.components.capacity import DeclaredRack, shortfall

    racks = [DeclaredRack("rack-0", 72, 72), DeclaredRack("rack-1", 72, 40)]
    assert shortfall("j", groups=2, pods_per_group=10, gpus_per_pod=4, racks=racks) is None
    more = shortfall("j", groups=4, pods_per_group=18, gpus_per_pod=4, racks=racks)
    assert more is not None and "needs 4 clique group(s) of 18 pods x 4 GPUs, a rack each" in more
    assert "declares 2 Nvl72Rack(s) (rack-0, rack-1)" in more
    full = shortfall("j", groups=2, pods_per_group=18, gpus_per_pod=4, racks=racks)
    assert full is not None and "72 free GPUs in each of 2 rack(s); 1 of the declared racks" in full
    assert "rack-1 40" in full
    assert shortfall("j", groups=1, pods_per_group=18, gpus_per_pod=4, racks=[]) is None  # nothing declared
    # A running job judged again (a later preview): the GPUs its own pods hold are its to use.
    # Before, the dev stack's running multirack job warned that it did not fit beside itself.
    running = [DeclaredRack("rack-0", 72, 0, {"ml/j": 72}), DeclaredRack("rack-1", 72, 40, {"ml/j": 32})]
    assert shortfall("j", groups=2, pods_per_group=18, gpus_per_pod=4, racks=running, namespace="ml") is None
    assert shortfall("other", groups=2, pods_per_group=18, gpus_per_pod=4, racks=running, namespace="ml")
    # A rack's spares are not room for a new job: 16 trays of 18 with 2 spares fit, 17 do not.
    spared = [DeclaredRack("rack-0", 72, 72, spare_gpus=8)]
    assert shortfall("j", groups=1, pods_per_group=16, gpus_per_pod=4, racks=spared) is None
    over = shortfall("j", groups=1, pods_per_group=17, gpus_per_pod=4, racks=spared)
    assert over is not None and "rack-0 64, spares not counted" in over
