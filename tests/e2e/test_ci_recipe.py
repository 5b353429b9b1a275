"""The CI recipe of examples/ci/ as a runner would run it, on the simulator: a pull request's
preview.sh writes the report and comment.sh posts it (to a stand-in for `gh` that records what it
was asked), up.sh applies on main, and the next pull request's report shows the change and the
running pods it disrupts. GitHub itself is not involved."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import simulated_rack

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "ci"
FIXTURE = REPO / "tests" / "fixtures" / "components_stack"
RACK = 193  # addresses 127.10.193.x: a rack number no other test uses
FAKE_GH = """#!/usr/bin/env bash
# Stand-in for the GitHub CLI: records each call (its arguments and the body file's text).
args=("$@"); body=""
for ((i = 0; i < ${#args[@]}; i++)); do [[ ${args[i]} == --body-file ]] && body=$(cat "${args[i+1]}"); done
python3 -c 'import json, sys; print(json.dumps({"args": sys.argv[1:-1], "body": sys.argv[-1]}))' "$@" "$body" \\
  >> "$GH_CALLS"
[[ " $* " == *" --edit-last "* && ! -e "$GH_CALLS.posted" ]] && exit 1   # nothing to edit yet
touch "$GH_CALLS.posted"
"""


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=2, field_manager="ci-recipe-test",
                        prefix="nvlci-") as sim:
        yield sim


def test_the_recipe_previews_comments_and_applies(rack: tuple[ControlPlane, Client], tmp_path: Path) -> None:
    cp, client = rack
    proj = project_from_fixture(FIXTURE, tmp_path / "fabric", kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "prod")
    proj.run("config", "set", "domain", "train")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    calls = tmp_path / "gh-calls.jsonl"
    env = {**proj.env, "STACK": "prod", "WORKDIR": str(proj.workdir), "PR": "42", "GH_CALLS": str(calls),
           "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), proj.env["PATH"]])}

    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(RECIPE / script)], env=env, capture_output=True, text=True, timeout=600)

    # The first pull request: everything is new.
    pr = run("preview.sh")
    assert pr.returncode == 0, pr.stdout + pr.stderr
    report = (proj.workdir / "report.md").read_text()
    assert report.startswith("### nvlfabric preview of prod\n") and "| `default/train` | + create | new |" in report
    assert run("comment.sh").returncode == 0
    posted = [json.loads(line) for line in calls.read_text().splitlines()]
    assert posted[-1]["args"][:3] == ["pr", "comment", "42"] and "--edit-last" not in posted[-1]["args"]
    assert posted[-1]["body"].startswith("<!-- nvlfabric-preview -->\n### nvlfabric preview of prod")

    merged = run("up.sh")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    members = {"nvlfabric.io/compute-domain": "train"}
    from nvlfabric.sim.cluster import eventually

    eventually("the bound pods to run", lambda: len([p for p in client.list(Pod, namespace="default", labels=members)
                                                     if p.status and p.status.phase == "Running"]) == 3, timeout=90)

    # Nothing changed: the refreshed preview is clean, the report says so.
    assert run("preview.sh").returncode == 0
    assert "**no changes**" in (proj.workdir / "report.md").read_text()

    # The next pull request replaces the domain: the report names why and the pods it disrupts,
    # and the comment replaces the earlier one.
    proj.run("config", "set", "imexMode", "Dedicated")
    assert run("preview.sh").returncode == 0
    report = (proj.workdir / "report.md").read_text()
    assert "| `default/train` | +- replace | spec.imexMode | 3 |" in report, report
    assert run("comment.sh").returncode == 0
    assert "--edit-last" in json.loads(calls.read_text().splitlines()[-1])["args"]
    proj.run("config", "rm", "imexMode")
    proj.run("destroy", "--yes", "--skip-preview", timeout=600)
    shutil.rmtree(proj.workdir / ".backend", ignore_errors=True)
