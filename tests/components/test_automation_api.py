"""A platform team's service that drives its stacks through Pulumi's Automation API runs an inline
program again and again in one Python process. Each run is a program of its own: the checks that
span components (names taken, racks' taints and capacity, drivers' modes) see only that run's
declarations. Before, the second `preview` of the same program refused its ComputeDomain as
"already declared" by the first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pulumi import automation as auto

from nvlfabric.components import ComputeDomain
from nvlfabric.sim.environment import simulator_env
from nvlfabric.sim.paths import load_tools
from nvlfabric.testbed.pulumi_cli import OFFLINE
from tests.conftest import Cluster


def _stack(tmp_path: Path, cluster: Cluster, program: auto.PulumiFn) -> auto.Stack:
    tools = load_tools()
    backend = tmp_path / "backend"
    backend.mkdir()
    env = {**simulator_env(tools=tools, kubeconfig=cluster.kubeconfig, backend_dir=backend), **OFFLINE}
    settings = auto.ProjectSettings(name="platform", runtime=auto.ProjectRuntimeInfo(
        name="python", options={"virtualenv": sys.prefix}))
    return auto.create_stack("dev", project_name="platform", program=program, opts=auto.LocalWorkspaceOptions(
        work_dir=str(tmp_path), env_vars=env, project_settings=settings,
        pulumi_command=auto.PulumiCommand(root=str(tools.bin_dir.parent), skip_version_check=True)))


@pytest.mark.pulumi
def test_an_inline_program_previews_again_in_the_same_process(cluster: Cluster, tmp_path: Path) -> None:
    def program() -> None:
        ComputeDomain("train", spec={"numNodes": 2})

    stack = _stack(tmp_path, cluster, program)
    for run in (1, 2, 3):
        result = stack.preview()
        assert result.change_summary.get("create") == 3, f"run {run}: {result.change_summary}\n{result.stderr}"


@pytest.mark.pulumi
def test_two_domains_of_one_name_in_one_run_are_still_refused(cluster: Cluster, tmp_path: Path) -> None:
    def program() -> None:
        ComputeDomain("a", name="train")
        ComputeDomain("b", name="train")

    stack = _stack(tmp_path, cluster, program)
    with pytest.raises(auto.CommandError) as err:
        stack.preview()
    assert "ComputeDomain default/train is already declared by ComputeDomain 'a'" in str(err.value)
