"""The components reused from other languages: the component provider (nvlfabric/components/plugin) consumed
through `pulumi package add` by a Pulumi YAML project (examples/yaml-consumer) and by a TypeScript
project (examples/ts-consumer, with a generated SDK), with the real CLI, our Python language host,
the YAML language host and our Node.js language host, on the session's control plane.

The pure tests check that the schema is derived from the pydantic models and how Construct maps
inputs, and what `python -m nvlfabric.components.plugin_dir` writes; the end-to-end tests write the
plugin directory into the consumer project (a tmp directory, outside the checkout), add the package
(the engine creates the plugin's own virtualenv and installs nvlfabric into it from the wheel
tests/support/installed.py builds), read its schema back through the CLI, fail a preview on a bad argument,
run `up` and `destroy`. Neither the checkout nor its .venv is on any path the CLI, the plugin or its
dynamic providers run with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim

import nvlfabric
from nvlfabric.api import computedomain as cdapi
from nvlfabric.api.names import RACK_LABEL
from nvlfabric.components import BoundJobArgs, ComputeDomainArgs, NvlfabricDriverArgs, plugin_dir, pluginserver, served
from nvlfabric.components.pluginserver import NvlfabricProvider
from nvlfabric.components.schema import BY_TOKEN, package_schema, version
from nvlfabric.provider.computedomain import CD
from nvlfabric.sim.cluster import delete_nodes, eventually, make_ready_nodes
from nvlfabric.testbed.pulumi_cli import OFFLINE, PulumiProject, project_from_fixture
from tests.conftest import Cluster
from tests.support import installed
from tests.support.consumer import PLUGIN, PLUGIN_ENTRY, gone, outside_the_checkout
from tests.support.upgrade import previous_release

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "yaml-consumer"
CD_TOKEN = "nvlfabric:index:ComputeDomain"
JOB_TOKEN = "nvlfabric:index:BoundJob"


# -- the schema is derived from the pydantic models (pure) ---------------------------------------


def test_inputs_are_the_args_models_fields_in_camel_case_with_their_descriptions() -> None:
    schema = package_schema()
    assert schema["name"] == "nvlfabric" and set(schema["resources"]) == set(BY_TOKEN)
    cd = schema["resources"][CD_TOKEN]
    assert cd["isComponent"] is True
    assert set(cd["inputProperties"]) == {"name", "namespace", "backend", "spec", "labels", "awaitFor", "timeoutS",
                                          "forceDelete"}
    assert cd["inputProperties"]["namespace"] == {
        "type": "string", "default": "default", "description": ComputeDomainArgs.model_fields["namespace"].description}
    assert cd["inputProperties"]["spec"]["$ref"] == "#/types/nvlfabric:index:ComputeDomainSpec"
    assert "requiredInputs" not in cd  # name defaults to the resource name, as in Python
    assert cd["inputProperties"]["name"]["description"].endswith("Defaults to the resource's name.")
    spec = schema["types"]["nvlfabric:index:ComputeDomainSpec"]["properties"]
    assert set(spec) == {"channelAllocationMode", "numNodes", "imexMode", "placement", "channelClaim",
                         "imexAuthentication", "nodeLossPolicy"}
    assert spec["numNodes"]["description"] == cdapi.ComputeDomainSpec.model_fields["num_nodes"].description
    assert schema["types"]["nvlfabric:index:IMEXMode"]["enum"] == [{"value": "CliqueScoped"}, {"value": "Dedicated"}]

    job = schema["resources"][JOB_TOKEN]
    assert job["requiredInputs"] == ["computeDomain", "podTemplate"]
    assert job["inputProperties"]["computeDomain"]["$ref"] == f"#/resources/{CD_TOKEN}"
    assert job["inputProperties"]["gpusPerPod"] == {
        "type": "integer", "default": 4, "description": BoundJobArgs.model_fields["gpus_per_pod"].description}
    assert job["inputProperties"]["podTemplate"]["additionalProperties"] == {"$ref": "pulumi.json#/Any"}
    driver = schema["resources"]["nvlfabric:index:NvlfabricDriver"]["inputProperties"]
    assert driver["channelsPerClique"]["description"] == NvlfabricDriverArgs.model_fields[
        "channels_per_clique"].description


def test_outputs_are_the_components_typed_attributes() -> None:
    cd = package_schema()["resources"][CD_TOKEN]
    assert cd["properties"]["claimName"] == {"type": "string"}
    assert cd["properties"]["members"] == {"type": "array", "items": {"type": "string"}}
    assert "channel" in cd["properties"] and "channel" not in cd["required"]  # Output[int | None]
    assert {"name", "namespace", "claimName", "phase"} <= set(cd["required"])


def test_construct_refuses_unknown_and_unresolved_inputs_by_their_schema_names() -> None:
    exposed = BY_TOKEN[JOB_TOKEN]
    unknown: pulumi.Output[str] = pulumi.Output.from_input("x")
    kwargs, problems = NvlfabricProvider._arguments(exposed, {
        "gpusPerPod": 2.0, "colour": "red", "name": unknown, "computeDomain": "urn:x",
        "podTemplate": {"spec": {"containers": [{"name": "a", "image": "b", "ports": [{"containerPort": 80.0}]}]}}})
    assert kwargs["gpus_per_pod"] == 2 and isinstance(kwargs["gpus_per_pod"], int)
    assert kwargs["pod_template"]["spec"]["containers"][0]["ports"] == [{"containerPort": 80}]
    reasons = {p["property_path"]: p["reason"] for p in problems}
    assert reasons["colour"].startswith("unknown argument; valid ones are computeDomain, podTemplate, name")
    assert "must be known when the program runs" in reasons["name"]
    assert reasons["computeDomain"] == f"expected an {CD_TOKEN} declared in the same program (got str)"


# -- the plugin directory, anywhere (pure) -------------------------------------------------------


def test_the_plugin_runs_in_a_virtualenv_of_its_own_that_installs_this_nvlfabric() -> None:
    plugin = yaml.safe_load((PLUGIN / "PulumiPlugin.yaml").read_text())
    assert plugin["runtime"] == {"name": "python", "options": {"virtualenv": "venv"}}
    lines = [ln for ln in (PLUGIN / "requirements.txt").read_text().splitlines() if not ln.startswith("#")]
    assert lines == [plugin_dir.requirement()] == [f"nvlfabric[pulumi]=={nvlfabric.__version__}"]


def test_plugin_dir_writes_the_plugin_files_with_the_requirement_asked_for(tmp_path: Path) -> None:
    where = plugin_dir.write(tmp_path / "a" / "nvlfabric-plugin")
    assert sorted(p.name for p in where.iterdir()) == sorted([*plugin_dir.FILES, ".gitignore"])
    for name in ("PulumiPlugin.yaml", "__main__.py"):
        assert (where / name).read_text() == (PLUGIN / name).read_text()
    assert (where / "requirements.txt").read_text() == (PLUGIN / "requirements.txt").read_text()
    assert (where / ".gitignore").read_text() == "venv/\n__pycache__/\n"

    (where / "venv").mkdir()  # written again: the files replaced, the virtualenv kept
    spec = "nvlfabric[pulumi] @ file:///wheels/nvlfabric-0.1.0-py3-none-any.whl"
    subprocess.run([sys.executable, "-m", "nvlfabric.components.plugin_dir", str(where), "--requirement", spec],
                   check=True, capture_output=True, timeout=60)
    assert (where / "requirements.txt").read_text().splitlines()[-1] == spec
    assert (where / "venv").is_dir()


# -- end to end: pulumi package add, get-schema, preview, up, destroy ----------------------------


def added_with_its_own_virtualenv(plugin: Path) -> None:
    """`pulumi package add` created the plugin's virtualenv and installed the wheel's nvlfabric in it."""
    python = plugin / "venv" / "bin" / "python"
    assert python.exists(), "pulumi package add did not create the plugin's virtualenv"
    where = subprocess.run([str(python), "-c", "import nvlfabric, pulumi; print(nvlfabric.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=plugin.parent)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(plugin / "venv"), where.stdout


class Timed:
    """Runs pulumi commands of a project, recording how long each named step took."""

    def __init__(self, proj: PulumiProject) -> None:
        self.proj = proj
        self.timings: dict[str, float] = {}

    def __call__(self, step: str, *args: str, check: bool = True) -> Any:
        start = time.monotonic()
        proc = self.proj.run(*args, check=check)
        self.timings[step] = round(time.monotonic() - start, 1)
        return proc


def bad_gpus_fail_the_preview(timed: Timed) -> None:
    """`gpusPerPod: 5` fails the preview, naming the input as the consumer's program writes it."""
    timed.proj.run("config", "set", "gpusPerPod", "5")
    bad = timed("preview (bad argument)", "preview", check=False)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert "nvlfabric:index:BoundJob resource 'trainer' has a problem: invalid arguments" in out, out
    assert "property gpusPerPod with value '{5}' has a problem: Input should be less than or equal to 4" in out
    assert "GPUs per pod, 0..4" in out and "Traceback" not in out
    timed.proj.run("config", "set", "gpusPerPod", "4")


def up_runs_the_domain_and_job_and_destroy_removes_them(api: Cluster, timed: Timed, domain: str,
                                                        rack_node: str | None = None, elastic: bool = False) -> None:
    """... and, with `rack_node`, the program's rack labels that Node through the plugin's own
    RackNodes resource, and `destroy` takes the label away again; with `elastic`, the job is
    elastic and the plugin serves its Job's size too (JobParallelism)."""
    proj = timed.proj
    try:
        timed("up", "up", "--yes", "--skip-preview")
        outputs = proj.json("stack", "output", "--json")
        assert outputs == {"claimName": f"{domain}-channel", "namespace": "default", "job": domain}
        obj = api.client.get(CD, domain, namespace="default").to_dict()
        assert obj["spec"]["numNodes"] == 2 and obj["spec"]["imexMode"] == "CliqueScoped"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvlfabric"
        api.client.get(ResourceClaim, f"{domain}-channel", namespace="default")
        pod = api.client.get(Job, domain, namespace="default").to_dict()["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": "channel", "resourceClaimName": f"{domain}-channel"}]
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
        types = {r["type"] for r in proj.json("stack", "export")["deployment"]["resources"]}
        # The domain's object is served by the plugin (in its own virtualenv), not a dynamic resource.
        assert {CD_TOKEN, JOB_TOKEN, served.COMPUTE_DOMAIN, "kubernetes:batch/v1:Job"} <= types
        assert not any(t.startswith("pulumi-python:dynamic") for t in types), types
        if elastic:
            assert served.JOB_PARALLELISM in types
            job = api.client.get(Job, domain, namespace="default")
            assert (job.spec.parallelism, job.spec.completions) == (2, 2)
        if rack_node is not None:
            assert served.RACK_NODES in types
            assert (api.client.get(Node, rack_node).metadata.labels or {}).get(RACK_LABEL) == "rack-0"
    finally:
        timed("destroy", "destroy", "--yes", "--skip-preview")
    if rack_node is not None:
        assert RACK_LABEL not in (api.client.get(Node, rack_node).metadata.labels or {})
    for res, name in ((CD, domain), (ResourceClaim, f"{domain}-channel"), (Job, domain)):
        eventually(f"{res.__name__} {name} to be gone", lambda r=res, n=name: gone(api, r, n), timeout=60)
    print(f"timings (s): {timed.timings}")


@pytest.mark.cluster
@pytest.mark.pulumi
def test_a_yaml_project_adds_the_package_and_runs_a_bound_job(api: Cluster, tmp_path: Path,
                                                             wheelhouse: Path) -> None:
    proj = project_from_fixture(EXAMPLE, tmp_path / "consumer", kubeconfig=api.kubeconfig, venv=Path(sys.prefix))
    timed = Timed(proj)
    # Start from the project as it was before `pulumi package add`.
    project_file = proj.workdir / "Pulumi.yaml"
    committed = yaml.safe_load(project_file.read_text())
    lock = (EXAMPLE / "sdks" / "nvlfabric" / f"nvlfabric-{version()}.yaml").read_text()
    project_file.write_text(yaml.safe_dump({k: v for k, v in committed.items() if k != "packages"}, sort_keys=False))
    for f in (proj.workdir / "sdks").rglob("*"):
        if f.is_file():
            f.unlink()
    plugin = outside_the_checkout(proj, wheelhouse)

    added = timed("package add", "package", "add", PLUGIN_ENTRY)
    assert "Added package nvlfabric" in added.stdout + added.stderr
    added_with_its_own_virtualenv(plugin)
    assert yaml.safe_load(project_file.read_text())["packages"] == committed["packages"] == {"nvlfabric": PLUGIN_ENTRY}
    assert (proj.workdir / "sdks" / "nvlfabric" / f"nvlfabric-{version()}.yaml").read_text() == lock

    # The schema the CLI gets from the plugin is the one derived from the pydantic models.
    start = time.monotonic()
    schema = json.loads(proj.run("package", "get-schema", PLUGIN_ENTRY).stdout)
    timed.timings["package get-schema"] = round(time.monotonic() - start, 1)
    cd_inputs = schema["resources"][CD_TOKEN]["inputProperties"]
    assert cd_inputs["namespace"]["description"] == ComputeDomainArgs.model_fields["namespace"].description
    assert cd_inputs["spec"]["$ref"] == "#/types/nvlfabric:index:ComputeDomainSpec"
    assert schema["resources"] == package_schema()["resources"]

    domain = f"yaml-{uuid.uuid4().hex[:6]}"
    proj.run("stack", "init", "test")
    proj.run("config", "set", "domain", domain)
    node = f"{domain}-node"
    proj.run("config", "set", "rackNode", node)
    make_ready_nodes(api.client, {node: {}})
    try:
        # A bad argument fails the preview, naming the input as the YAML program writes it and the fix.
        bad_gpus_fail_the_preview(timed)
        up_runs_the_domain_and_job_and_destroy_removes_them(api, timed, domain, rack_node=node, elastic=True)
    finally:
        delete_nodes(api.client, [node])


# -- the same from TypeScript: a generated SDK, typed inputs, our Node.js language host ----------

TS_EXAMPLE = REPO / "examples" / "ts-consumer"


def npm_cache() -> Path:
    """npm's download cache, outside the checkout, so fresh clones and CI reuse it."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nvlfabric" / "npm"


def npm(proj: PulumiProject, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["npm", *args, "--no-audit", "--no-fund", "--prefer-offline"], cwd=proj.workdir,
                          env=proj.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"npm {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.cluster
@pytest.mark.pulumi
def test_a_typescript_project_adds_the_package_and_runs_a_bound_job(api: Cluster, tmp_path: Path,
                                                                   wheelhouse: Path) -> None:
    assert shutil.which("node") and shutil.which("npm"), \
        "the TypeScript consumer needs Node.js (>= 20) and npm on PATH (Debian: apt-get install nodejs npm)"
    proj = project_from_fixture(TS_EXAMPLE, tmp_path / "consumer", kubeconfig=api.kubeconfig, venv=Path(sys.prefix))
    timed = Timed(proj)
    # npm fetches @pulumi/pulumi and TypeScript from its registry: no refusing proxy for this
    # project (the CLI stays offline by its own settings: no plugin downloads, no update checks).
    for key in OFFLINE:
        proj.env.pop(key, None)
    proj.env["npm_config_cache"] = str(npm_cache())
    project_file = proj.workdir / "Pulumi.yaml"
    committed = yaml.safe_load(project_file.read_text())
    assert committed["packages"] == {"nvlfabric": PLUGIN_ENTRY}
    project_file.write_text(yaml.safe_dump({k: v for k, v in committed.items() if k != "packages"}, sort_keys=False))
    plugin = outside_the_checkout(proj, wheelhouse)
    start = time.monotonic()
    npm(proj, "install")
    timed.timings["npm install"] = round(time.monotonic() - start, 1)

    added = timed("package add", "package", "add", PLUGIN_ENTRY)
    out = added.stdout + added.stderr
    assert "Added package nvlfabric" in out and 'import * as nvlfabric from "@pulumi/nvlfabric";' in out, out
    added_with_its_own_virtualenv(plugin)
    assert yaml.safe_load(project_file.read_text())["packages"] == {"nvlfabric": PLUGIN_ENTRY}
    manifest = json.loads((proj.workdir / "package.json").read_text())
    assert manifest["dependencies"]["@pulumi/nvlfabric"] == "file:sdks/nvlfabric"
    sdk = proj.workdir / "sdks" / "nvlfabric"
    assert json.loads((sdk / "package.json").read_text())["pulumi"] == {"resource": True, "name": "nvlfabric",
                                                                        "version": version()}
    assert (sdk / "bin" / "index.js").exists(), "npm did not compile the generated SDK"
    # The generated class carries the descriptions of the pydantic fields as its doc comments.
    assert BoundJobArgs.model_fields["gpus_per_pod"].description in (sdk / "boundJob.ts").read_text()

    domain = f"ts-{uuid.uuid4().hex[:6]}"
    proj.run("stack", "init", "test")
    proj.run("config", "set", "domain", domain)
    # TypeScript's types catch a wrong kind of value before anything runs, naming the property...
    program = proj.workdir / "index.ts"
    good = program.read_text()
    program.write_text(good.replace("parallelism: 2,", 'parallelism: "two",'))
    bad = timed("preview (type error)", "preview", check=False)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "index.ts" in out and "TS2322" in out and "number" in out, out
    program.write_text(good)
    # ...and the provider what types cannot say, naming the input as the program writes it.
    bad_gpus_fail_the_preview(timed)
    up_runs_the_domain_and_job_and_destroy_removes_them(api, timed, domain)


def test_the_served_object_is_found_by_its_urns_type() -> None:
    urn = "urn:pulumi:test::consumer::nvlfabric:index:ComputeDomain$nvlfabric:kubernetes:ComputeDomain::pretrain"
    assert served.type_of(urn) == served.COMPUTE_DOMAIN and served.COMPUTE_DOMAIN in served.PROVIDERS
    assert served.type_of("not-a-urn") == ""


def test_a_plugin_directory_the_previous_release_wrote_starts_this_releases_server() -> None:
    """A consumer's committed plugin directory outlives an upgrade of the wheel until it is written
    anew: its entry point, as the previous release wrote it, must still reach the plugin server."""
    _, ref = previous_release()
    old = subprocess.run(["git", "-C", str(installed.REPO), "show", f"{ref}:nvlfabric/components/plugin/__main__.py"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    entry: dict[str, Any] = {"__name__": "previous_plugin_main"}  # not "__main__": import, do not serve
    exec(compile(old, "previous release's plugin __main__.py", "exec"), entry)
    assert entry["main"] is pluginserver.main
