"""The components: argument validation (pure, no cluster) and one run through the real Pulumi CLI on
a simulated rack (driver + ComputeDomain + a Job of two pods → Ready, channel in the pods → destroy)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from components import (
    BoundJob,
    ComponentArgsError,
    ComputeDomain,
    Nvl72Rack,
    NvlfabricDriver,
    NvlfabricDriverArgs,
)
from components.driver import driver_objects
from components.workload import BoundJobArgs, job_manifest
from sim.controlplane import ControlPlane
from tests.conftest import free_ports
from tests.kube import eventually
from tests.pulumi_cli import project_from_fixture

TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}


def _error(fn: Any, **kwargs: Any) -> str:
    with pytest.raises(ComponentArgsError) as err:
        fn("x", **kwargs)
    return str(err.value)


# -- validation: every bad argument fails at construction, naming the field and the fix ----------


def test_driver_args_name_the_field_and_the_fix() -> None:
    msg = _error(NvlfabricDriver, channels_per_clique=5000)
    assert "NvlfabricDriver 'x'" in msg and "channels_per_clique" in msg and "1..2048" in msg and "5000" in msg
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
    ({"parallelism": 19, "gpus_per_pod": 4}, "(arguments)", "72"),
])
def test_bound_job_args(kwargs: dict[str, Any], field: str, words: str) -> None:
    args = {"name": "job", "pod_template": TEMPLATE} | kwargs
    msg = _error(BoundJob, compute_domain=None, **args)
    assert f"  {field}:" in msg and words in msg, msg


def test_bound_job_needs_a_compute_domain() -> None:
    msg = _error(BoundJob, compute_domain="cd-channel", pod_template=TEMPLATE)
    assert "compute_domain: expected a components.ComputeDomain (got str)" in msg


def test_rack_args() -> None:
    msg = _error(Nvl72Rack, nodes=[f"n{i}" for i in range(19)])
    assert "nodes" in msg and "1..18" in msg
    assert "unique" in _error(Nvl72Rack, nodes=["a", "a"])


def test_unknown_argument_is_named() -> None:
    from components._args import validate
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
    assert spec["containers"][1]["resources"]["limits"] == {"cpu": "1", "nvidia.com/gpu": "2"}
    assert spec["restartPolicy"] == "Never"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 3
    assert job["metadata"]["annotations"] == {"pulumi.com/waitFor": "jsonpath={.metadata.uid}",
                                              "pulumi.com/deletionPropagationPolicy": "foreground"}
    assert job["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvlfabric"
    assert tpl["spec"].get("resourceClaims") is None  # the user's template is not modified
    waiting = job_manifest(BoundJobArgs(name="j", pod_template=tpl, wait=True, gpu_resource=None),
                           namespace="ml", claim_name="c", domain="cd")
    assert "pulumi.com/waitFor" not in waiting["metadata"]["annotations"]
    assert "limits" not in waiting["spec"]["template"]["spec"]["containers"][0]["resources"]


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


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


def test_a_domain_refuses_more_than_256_pods_over_its_workloads() -> None:
    pulumi.runtime.set_mocks(_Mocks(), preview=True)
    cd = ComputeDomain("cd")
    BoundJob("a", compute_domain=cd, pod_template=TEMPLATE, parallelism=200, gpus_per_pod=0)
    with pytest.raises(ComponentArgsError) as err:
        BoundJob("b", compute_domain=cd, pod_template=TEMPLATE, parallelism=57, gpus_per_pod=0)
    assert "257 pods" in str(err.value) and "at most 256" in str(err.value)


# -- end to end through the real Pulumi CLI on a simulated rack -----------------------------------

PORTS = free_ports()  # a control plane of its own; free ports so sessions never clash
RACK = 160
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "components_stack"


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    state = Path(tempfile.mkdtemp(prefix="nvlcomp-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=PORTS, racks=1, nodes_per_rack=3, first_rack=RACK,
                      progress=lambda m: None)
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="components-test")
    try:
        yield cp, client
    finally:
        client.close()
        cp.down()
        for log in [*sorted(state.glob("nodes/*/pods/*/*.log")), state / "logs" / "sim-kubelet.log"]:
            print(f"--- {log.relative_to(state)}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.cluster
@pytest.mark.pulumi
def test_up_runs_bound_pods_with_the_channel_and_destroy_leaves_nothing(
        rack: tuple[ControlPlane, Client], tmp_path: Path) -> None:
    from nodeagent.controller import ComputeDomainResource

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
    assert "channels_per_clique: Input should be less than or equal to 2048 (got 5000)" in bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr
    proj.run("config", "rm", "channels")
    proj.run("up", "--yes", "--skip-preview", timeout=300)
    outputs = proj.json("stack", "output", "--json")
    assert outputs == {"claim_name": f"{domain}-channel", "device_class": "imex-channel.nvlfabric.io",
                       "job": domain}

    status = eventually("the ComputeDomain to be Ready", lambda: (
        s if (s := client.get(ComputeDomainResource, domain, namespace="default").status or {}).get("phase") == "Ready"
        else None), timeout=90)
    job_pods = {"batch.kubernetes.io/job-name": domain}
    pods = eventually("both pods to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default", labels=job_pods)
                         if p.status.phase == "Running"]) == 2 else None), timeout=60)
    channel = status["channel"]
    assert isinstance(channel, int) and channel >= 1
    for pod in pods:
        rec = json.loads((cp.state_dir / "nodes" / pod.spec.nodeName / "containers"
                          / f"default_{pod.metadata.name}_worker.json").read_text())
        assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c",
                                       "major": 507, "minor": channel}], rec
        assert f"NVLFABRIC_COMPUTE_DOMAIN={domain}" in rec["env"]

    proj.run("destroy", "--yes", "--skip-preview", timeout=300)
    assert not list(client.list(Pod, namespace="default"))
    assert not list(client.list(ResourceClaim, namespace="default"))
    assert not [p for p in client.list(Pod, namespace="nvlfabric-system")
                if p.metadata.deletionTimestamp is None]


@pulumi.runtime.test
def test_the_components_wire_up_under_mocks() -> Any:
    pulumi.runtime.set_mocks(_Mocks(), preview=False)
    driver = NvlfabricDriver("nvl")
    rack = Nvl72Rack("rack-7", nodes=["rack-7-node-00", "rack-7-node-01"], expected_clique="abc.1")
    cd = ComputeDomain("wired", opts=pulumi.ResourceOptions(depends_on=[driver]))
    job = BoundJob("wired", compute_domain=cd, pod_template=TEMPLATE, parallelism=2, gpus_per_pod=4)
    assert len(rack.patches) == 2 and cd.bound_pods == 2

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

    from sim.controlplane import default_images

    dockerfile = (_Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile").read_text()
    (entry,) = [line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")]
    argv = _json.loads(entry.removeprefix("ENTRYPOINT"))
    assert default_images()["nvlfabric/node-agent"] == [_sys.executable, *argv[1:]]
    assert argv[0] == "python"
