"""A consumer project of the component provider outside the checkout: the plugin directory, where
the project keeps it, and the environment of a machine without this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError

from nvlfabric.testbed.pulumi_cli import PulumiProject
from tests.conftest import Cluster
from tests.support import installed

PLUGIN = installed.REPO / "nvlfabric" / "components" / "plugin"
#: Where a consumer project keeps the plugin directory `python -m nvlfabric.components.plugin_dir` writes,
#: as its committed `packages:` entry names it.
PLUGIN_ENTRY = "./nvlfabric-plugin"


def gone(api: Cluster, res: Any, name: str) -> bool:
    """The namespaced object is gone (404)."""
    try:
        api.client.get(res, name, namespace="default")
    except ApiError as exc:
        if exc.status.code == 404:
            return True
        raise
    return False


def outside_the_checkout(proj: PulumiProject, wheelhouse: Path) -> Path:
    """Writes the plugin directory into the consumer project (`python -m nvlfabric.components.plugin_dir`,
    no virtualenv yet) and sets the project's environment as a machine without this checkout has it:
    pip (run by the engine when it installs the plugin) takes nvlfabric and its dependencies from the
    wheelhouse; the interpreter that makes the virtualenv is the base Python, not the checkout's
    .venv, which leaves PATH. Returns the plugin directory."""
    where = proj.workdir / PLUGIN_ENTRY
    proc = subprocess.run([sys.executable, "-m", "nvlfabric.components.plugin_dir", str(where)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not (where / "venv").exists(), proc.stderr
    checkout_venv = Path(sys.prefix)
    path = [p for p in proj.env["PATH"].split(os.pathsep) if p and not Path(p).is_relative_to(checkout_venv)]
    proj.env["PATH"] = os.pathsep.join([path[0], str(Path(sys.base_prefix) / "bin"), *path[1:]])  # tools first
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        proj.env.pop(key, None)
    proj.env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), PIP_DISABLE_PIP_VERSION_CHECK="1")
    # The `python3` on that PATH has no Pulumi, and the project names no virtualenv: the ComputeDomain's
    # object is served by the plugin itself (nvlfabric.components.served), not by a dynamic provider
    # the engine would start in the consumer's Python.
    bare = subprocess.run(["python3", "-c", "import pulumi"], env=proj.env, capture_output=True, timeout=60)
    assert bare.returncode != 0, "python3 on the consumer's PATH must not have Pulumi for this test to prove anything"
    runtime = yaml.safe_load((proj.workdir / "Pulumi.yaml").read_text())["runtime"]
    assert "virtualenv" not in (runtime.get("options") or {} if isinstance(runtime, dict) else {})
    return where
