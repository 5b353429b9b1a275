"""nvlfabric as a platform repo installs it: `nvlfabric[pulumi]` from the wheel into a fresh
virtualenv, and a Pulumi project of its own that runs in that virtualenv only.

The project (written here, in the test's tmp directory) does what the README's "Use it from your
platform repo" shows: `from nvlfabric import NvlfabricDriver, Nvl72Rack, ComputeDomain, BoundJob`,
a driver, one rack naming the simulated rack's nodes, a ComputeDomain and a Job of two pods bound
to it. `pulumi preview`, `up` and `destroy` run with the real CLI, offline, on a simulated rack
(the set-up of the components' end-to-end test, tests/components/test_components.py). Neither the
checkout nor its .venv is on the program's or the dynamic providers' path: what runs is the wheel.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from lightkube import Client
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim

from nvlfabric.api.names import DEVICE_CLASS, NAMESPACE, RACK_LABEL
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import eventually, ready_domain_status
from nvlfabric.sim.nvml.topology import rack_name
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import simulated_rack, stuck_deletions
from tests.support import installed

RACK = 165  # addresses 127.10.165.x: a rack number no other test uses
GENERIC = ("components", "provider", "nodeagent", "sim", "kubeletapi")  # the old top-level packages

PROGRAM = '''\
"""A platform repo's stack: the driver, one NVL72 rack, a ComputeDomain and a Job bound to it."""

import pulumi

import nvlfabric
from nvlfabric import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver

config = pulumi.Config()
driver = NvlfabricDriver("nvlfabric", channels_per_clique=16)
# the simulator labels its nodes with their rack (nvlfabric.io/rack): the rack is declared by that name
rack = Nvl72Rack(config.require("rack"), nodes=config.require_object("nodes"))
cd = ComputeDomain("pretrain", name=config.require("domain"), opts=pulumi.ResourceOptions(depends_on=[driver]))
job = BoundJob("pretrain", name=config.require("domain"), compute_domain=cd, parallelism=2, gpus_per_pod=1,
               pod_template={"spec": {"containers": [{"name": "trainer", "image": "registry.invalid/train:1"}]}})
pulumi.export("nvlfabric_file", nvlfabric.__file__)
pulumi.export("claim_name", cd.claim_name)
pulumi.export("job", job.job_name)
pulumi.export("rack_gpus", rack.gpus)
'''


@pytest.fixture(scope="module")
def platform_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with `nvlfabric[pulumi]` installed from this checkout's wheel."""
    tmp = tmp_path_factory.mktemp("platform")
    installed.venv(tmp / "venv", "pulumi")
    return tmp / "venv"


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=2, field_manager="installed-wheel-test",
                        prefix="nvlwheel-") as sim:
        yield sim


def test_the_wheel_installs_nvlfabric_alone(platform_venv: Path) -> None:
    """The venv's interpreter, run from its tmp directory, imports nvlfabric from its own
    site-packages, and nothing there answers to the old generic top-level names."""
    tmp = platform_venv.parent
    probe = ("import importlib.util as u, json, sys, nvlfabric\n"
             "print(json.dumps({'file': nvlfabric.__file__, 'path': sys.path,\n"
             f"                  'generic': [m for m in {GENERIC!r} if u.find_spec(m)]}}))\n"
             "from nvlfabric import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver\n")
    proc = subprocess.run([str(platform_venv / "bin" / "python"), "-c", probe], cwd=tmp,
                          env=installed.clean_env(platform_venv),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout)
    (site,) = platform_venv.glob("lib/python*/site-packages")
    assert Path(got["file"]) == site / "nvlfabric" / "__init__.py", got["file"]
    assert not [p for p in got["path"] if p and Path(p).resolve().is_relative_to(installed.REPO)], got["path"]
    assert got["generic"] == [], f"site-packages holds generic top-level packages: {got['generic']}"
    assert not [d.name for d in site.iterdir() if d.name in GENERIC]


@pytest.mark.cluster
@pytest.mark.pulumi
@pytest.mark.timeout(1200)
def test_a_platform_project_on_the_installed_wheel_runs_a_bound_job(
        platform_venv: Path, rack: tuple[ControlPlane, Client]) -> None:
    cp, client = rack
    nodes = [n.name for n in cp.nodes()]
    domain = f"pretrain-{uuid.uuid4().hex[:5]}"
    proj = installed.platform_project(platform_venv.parent / "proj", platform_venv, cp.kubeconfig, PROGRAM)
    proj.run("stack", "init", "dev")
    proj.run("config", "set", "domain", domain)
    proj.run("config", "set", "rack", rack_name(RACK))
    proj.run("config", "set", "nodes", json.dumps(nodes))

    steps = proj.json("preview", "--json")["steps"]
    planned = {st["urn"].split("::")[-2].split("$")[-1] for st in steps if st["op"] == "create"}
    assert {"nvlfabric:index:NvlfabricDriver", "nvlfabric:index:Nvl72Rack", "nvlfabric:index:ComputeDomain",
            "nvlfabric:index:BoundJob"} <= planned, planned

    proj.run("up", "--yes", "--skip-preview", timeout=300)
    outputs = proj.json("stack", "output", "--json")
    site = next(platform_venv.glob("lib/python*/site-packages"))
    assert outputs == {"nvlfabric_file": str(site / "nvlfabric" / "__init__.py"), "claim_name": f"{domain}-channel",
                       "job": domain, "rack_gpus": 4 * len(nodes)}

    # The driver: the CRD, the agents' DaemonSet, the controller, the DeviceClass; the rack's labels.
    client.get(CustomResourceDefinition, "computedomains.nvlfabric.io")
    client.get(DaemonSet, "nvlfabric-agent", namespace=NAMESPACE)
    client.get(Deployment, "nvlfabric-controller", namespace=NAMESPACE)
    client.get(DeviceClass, DEVICE_CLASS)
    assert {client.get(Node, n).metadata.labels.get(RACK_LABEL) for n in nodes} == {rack_name(RACK)}

    status = ready_domain_status(client, domain)
    members = {"nvlfabric.io/compute-domain": domain}
    pods = eventually("the Job's two pods to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default", labels=members)
                         if p.status.phase in ("Running", "Succeeded")]) == 2 else None), timeout=60)
    channel = status["channel"]
    for pod in pods:
        assert [c.resourceClaimName for c in pod.spec.resourceClaims] == [f"{domain}-channel"]
        rec = json.loads((cp.state_dir / "nodes" / pod.spec.nodeName / "containers"
                          / f"default_{pod.metadata.name}_trainer.json").read_text())
        assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c",
                                       "major": 507, "minor": channel}], rec

    try:
        proj.run("destroy", "--yes", "--skip-preview", timeout=300)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"destroy hung: {exc.output!r}\n{stuck_deletions(cp, client)}") from exc
    # The domain is gone, and the driver with the CRD: 404s (for the domain a Status while the API
    # server still serves the kind, a bare 404 once it does not, which lightkube raises as the
    # HTTPStatusError that ApiError derives from).
    for res, name, ns in ((ComputeDomainResource, domain, "default"),
                          (CustomResourceDefinition, "computedomains.nvlfabric.io", None)):
        with pytest.raises(httpx2.HTTPStatusError) as err:
            client.get(res, name, namespace=ns)
        assert err.value.response.status_code == 404, (name, err.value)
    assert not list(client.list(ResourceClaim, namespace="default"))
    assert not list(client.list(Job, namespace="default"))
    assert not list(client.list(Pod, namespace="default"))


def test_the_installed_wheel_has_the_preview_report_command(platform_venv: Path) -> None:
    """`nvlfabric preview-report` from the platform venv's bin, run outside the checkout, on a
    recorded preview of the dev stack."""
    preview_file = installed.REPO / "tests" / "golden" / "report" / "replace.json"
    proc = subprocess.run([str(platform_venv / "bin" / "nvlfabric"), "preview-report", "--no-cluster"],
                          input=preview_file.read_text(), cwd=platform_venv.parent,
                          env=installed.clean_env(platform_venv),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| `default/eval` | +- replace | spec.imexMode | ? |" in proc.stdout, proc.stdout
