"""Golden tests for what a reviewer sees in CI: `pulumi preview --diff` of a ComputeDomain change.

The output of the real CLI is normalised (the random suffix, the local paths) and compared with
tests/golden/*.txt. After an intended change of the output, regenerate with
`NVLFABRIC_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/provider/test_preview_golden.py`.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.types import PatchType

from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import install_crd
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster
from tests.support.golden import check, normalise

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "cd_stack"


def test_preview_diff_shows_an_update_and_a_replace_with_their_reasons(cluster: Cluster, tmp_path: Path) -> None:
    install_crd(cluster.client)
    suffix = uuid.uuid4().hex[:6]
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=cluster.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "golden")
    proj.run("config", "set", "suffix", suffix)
    proj.run("up", "--yes", "--skip-preview")
    try:
        # Somebody changes the ComputeDomain behind Pulumi's back: refresh shows it, and the next
        # preview wants to put it back.
        cluster.client.patch(ComputeDomainResource, f"e2e-{suffix}", {"spec": {"numNodes": 5}}, namespace="default",
                             patch_type=PatchType.MERGE)
        refresh = proj.run("refresh", "--yes", "--diff").stdout
        assert "numNodes" in refresh and "5" in refresh, refresh
        (drift,) = [s for s in proj.json("preview", "--json")["steps"] if s["urn"].endswith("::cd")]
        assert drift["op"] == "update", drift
        proj.run("up", "--yes", "--skip-preview")  # converges the drift back to the program's numNodes
        live = cluster.client.get(ComputeDomainResource, f"e2e-{suffix}", namespace="default")
        assert live["spec"]["numNodes"] == 2
        proj.run("config", "set", "numNodes", "3")
        check("preview_update_numnodes.txt", normalise(proj.run("preview", "--diff").stdout, suffix))
        proj.run("config", "set", "imexMode", "Dedicated")
        check("preview_replace_imexmode.txt", normalise(proj.run("preview", "--diff").stdout, suffix))
        (step,) = [s for s in proj.json("preview", "--json")["steps"] if s["urn"].endswith("::cd")]
        reasons = {"op": step["op"], "replaceReasons": step.get("replaceReasons"),
                   "diffReasons": step.get("diffReasons")}
        check("preview_replace_imexmode.json", json.dumps(reasons, indent=2, sort_keys=True) + "\n")
    finally:
        proj.run("destroy", "--yes", "--skip-preview", check=False)
        with contextlib.suppress(ApiError):
            cluster.client.delete(ComputeDomainResource, f"e2e-{suffix}", namespace="default")
