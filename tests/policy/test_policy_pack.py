"""nvlfabric's policy pack as a platform repo runs it: `pulumi preview --policy-pack "$(nvlfabric
policy-pack)"` from a virtualenv with nvlfabric[policy] installed from this checkout's wheel (the
dev venv cannot hold pulumi-policy: it pins protobuf 5), against the real API server."""

from __future__ import annotations

import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from nvlfabric.sim.cluster import delete_nodes, make_ready_nodes
from nvlfabric.sim.environment import simulator_env
from nvlfabric.sim.paths import load_tools
from nvlfabric.testbed.pulumi_cli import OFFLINE, PulumiProject
from tests.conftest import Cluster
from tests.support import installed
from tests.support.installed import clean_env

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]

PROGRAM = '''\
import pulumi
from nvlfabric import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver

config = pulumi.Config()
bad = config.get_bool("bad")
driver = NvlfabricDriver("nvlfabric", channels_per_clique=1 if bad else 16)
Nvl72Rack("rack", name=config.require("rack"), nodes=[config.require("node")], observe=False)
for i in range(3 if bad else 1):
    cd = ComputeDomain(f"cd{i}", name=f"{config.require('rack')}-{i}", force_delete=bool(bad and i == 0),
                       opts=pulumi.ResourceOptions(depends_on=[driver]))
    BoundJob(f"job{i}", name=f"{config.require('rack')}-{i}", compute_domain=cd, parallelism=1,
             gpu_resource=None if bad else "nvidia.com/gpu", gpus_per_pod=0 if bad else 1,
             pod_template={"spec": {"containers": [{"name": "w", "image": "registry.invalid/w:1"}]}})
'''


def test_the_policy_pack_refuses_what_its_rules_say_and_passes_a_clean_stack(
        cluster: Cluster, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    installed.venv(venv, "policy")
    pack = subprocess.run([str(venv / "bin" / "nvlfabric"), "policy-pack"], capture_output=True, text=True,
                          env=clean_env(venv), cwd=tmp_path, timeout=60, check=True).stdout.strip()
    assert Path(pack).is_relative_to(venv) and (Path(pack) / "PulumiPolicy.yaml").exists()

    work = tmp_path / "platform"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(textwrap.dedent(f"""\
        name: platform
        runtime:
          name: python
          options:
            virtualenv: {venv}
        """))
    (work / "__main__.py").write_text(PROGRAM)
    (work / ".backend").mkdir()
    tools = load_tools()
    env = {**clean_env(venv), **simulator_env(tools=tools, kubeconfig=cluster.kubeconfig,
                                              backend_dir=work / ".backend"), **OFFLINE}
    env["PATH"] = f"{venv / 'bin'}:{tools.bin_dir}:{env['PATH']}"  # the pack runs with the venv's python
    proj = PulumiProject(workdir=work, env=env)
    run = f"pol-{uuid.uuid4().hex[:5]}"
    node = f"{run}-n0"
    make_ready_nodes(cluster.client, {node: {"nvlfabric.io/rack": run}})
    try:
        proj.run("stack", "init", "test")
        proj.run("config", "set", "rack", run)
        proj.run("config", "set", "node", node)
        clean = proj.run("preview", "--policy-pack", pack, check=False, timeout=600)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "nvlfabric@" in clean.stdout  # the pack ran

        proj.run("config", "set", "bad", "true")
        bad = proj.run("preview", "--policy-pack", pack, check=False, timeout=600)
        assert bad.returncode != 0
        out = bad.stdout
        assert "[mandatory]  bound-workloads-request-gpus" in out, out
        assert "but no container asks for nvidia.com/gpu" in out
        assert "[mandatory]  no-force-delete" in out and f"ComputeDomain default/{run}-0 has force_delete=True" in out
        assert "[mandatory]  channels-within-the-driver" in out
        assert "the program's ComputeDomains need 3 channels (one per clique group), but its 1 rack(s) have 1" in out
    finally:
        delete_nodes(cluster.client, [node])
