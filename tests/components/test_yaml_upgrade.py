"""The YAML consumer upgrades its component provider from the previous release (tests/e2e/test_upgrade.py
is the same for a Python platform repo): the previous release's example project and plugin
directory, from this checkout's git history, brought up with the previous wheel; then the plugin
directory as this release writes it (its requirement pinned to this version), `pulumi install`, and:
the preview replaces and deletes nothing (golden), `up` and `refresh` change nothing of the domain,
its claim or its Job, and the domain taken out of the program is deleted through the state the
previous plugin wrote.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml
from lightkube.resources.batch_v1 import Job
from lightkube.resources.resource_v1 import ResourceClaim

import nvlfabric
from nvlfabric.provider.computedomain import CD
from nvlfabric.sim.cluster import delete_nodes, eventually, make_ready_nodes
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster
from tests.support import installed
from tests.support.consumer import PLUGIN, gone, outside_the_checkout
from tests.support.upgrade import KEPT_TYPES, golden, previous_release, steps_of

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]


def _old_files(ref: str, path: str, into: Path) -> Path:
    """`path` of the checkout as commit `ref` has it, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(installed.REPO), "archive", ref, path], check=True,
                             capture_output=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / path


def plugin_version(plugin: Path) -> str:
    """The nvlfabric release in the plugin's virtualenv (run outside the checkout, which is not on its path)."""
    probe = "import nvlfabric; print(nvlfabric.__version__)"
    proc = subprocess.run([str(plugin / "venv" / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=plugin.parent)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.timeout(1500)
def test_a_yaml_project_upgrades_its_plugin_and_keeps_its_domain(api: Cluster, tmp_path: Path,
                                                                 wheelhouse: Path) -> None:
    version, ref = previous_release()
    old_wheel = installed.release_wheel(ref)
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                              "--dest", str(wheelhouse), f"nvlfabric[pulumi] @ {old_wheel.as_uri()}"],
                             capture_output=True, text=True, timeout=900)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    old = tmp_path / "old"
    example = _old_files(ref, "examples/yaml-consumer", old)
    old_plugin = _old_files(ref, "nvlfabric/components/plugin", old)
    proj = project_from_fixture(example, tmp_path / "consumer", kubeconfig=api.kubeconfig, venv=Path(sys.prefix))
    plugin = outside_the_checkout(proj, wheelhouse)
    for f in old_plugin.iterdir():  # the plugin directory as the previous release wrote it
        if f.is_file():
            (plugin / f.name).write_text(f.read_text())
    assert (plugin / "requirements.txt").read_text().splitlines()[-1] == f"nvlfabric[pulumi]=={version}"

    proj.run("install", timeout=600)
    domain = f"yup-{uuid.uuid4().hex[:6]}"
    node = f"{domain}-node"
    proj.run("stack", "init", "test")
    proj.run("config", "set", "domain", domain)
    proj.run("config", "set", "rackNode", node)
    make_ready_nodes(api.client, {node: {}})
    try:
        proj.run("up", "--yes", "--skip-preview", timeout=400)
        assert plugin_version(plugin) == version
        before = {kind: api.client.get(kind, name, namespace="default").metadata.uid
                  for kind, name in ((CD, domain), (ResourceClaim, f"{domain}-channel"), (Job, domain))}

        # The upgrade: this release's plugin files (its requirement pin), installed into the plugin's venv.
        for name in ("PulumiPlugin.yaml", "__main__.py", "requirements.txt"):
            (plugin / name).write_text((PLUGIN / name).read_text())
        proj.run("install", timeout=600)
        assert plugin_version(plugin) == nvlfabric.__version__, "pulumi install did not upgrade the plugin's venv"

        steps = steps_of(proj.json("preview", "--json", "--diff"))
        assert not [s for s in steps if s[0] != "update"], f"the upgrade would replace or delete: {steps}"
        assert not [s for s in steps if s[1].endswith(KEPT_TYPES)], f"the upgrade touches a user's object: {steps}"
        assert steps == golden(f"yaml-from-{version}.json", steps)
        proj.run("up", "--yes", "--skip-preview", timeout=400)
        proj.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", timeout=300)
        after = {kind: api.client.get(kind, name, namespace="default").metadata.uid
                 for kind, name in ((CD, domain), (ResourceClaim, f"{domain}-channel"), (Job, domain))}
        assert after == before

        # The domain and its job leave the program: deleted through the previous plugin's state.
        program = yaml.safe_load((proj.workdir / "Pulumi.yaml").read_text())
        for name in ("pretrain", "trainer"):
            del program["resources"][name]
        del program["outputs"]
        (proj.workdir / "Pulumi.yaml").write_text(yaml.safe_dump(program, sort_keys=False))
        proj.run("up", "--yes", "--skip-preview", timeout=400)
        for res, name in ((CD, domain), (ResourceClaim, f"{domain}-channel"), (Job, domain)):
            eventually(f"{res.__name__} {name} to be gone", lambda r=res, n=name: gone(api, r, n), timeout=60)
    finally:
        proj.run("destroy", "--yes", "--skip-preview", timeout=400, check=False)
        delete_nodes(api.client, [node])
    print(json.dumps(steps))
