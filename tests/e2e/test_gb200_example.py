"""The example stack for a real GB200 cluster (stacks/gb200) is a working program: with its
documented config it previews against a real API server, and its racks report that the nodes it
names are not there (this cluster has no GB200 racks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "stacks" / "gb200"


@pytest.mark.cluster
@pytest.mark.pulumi
def test_the_gb200_example_previews_with_its_documented_config(cluster: Cluster, tmp_path: Path) -> None:
    proj = project_from_fixture(EXAMPLE, tmp_path / "gb200", kubeconfig=cluster.kubeconfig, venv=Path(sys.prefix))
    project = yaml.safe_load((proj.workdir / "Pulumi.yaml").read_text())
    project["runtime"]["options"]["virtualenv"] = sys.prefix  # the example names its own .venv
    (proj.workdir / "Pulumi.yaml").write_text(yaml.safe_dump(project))
    config = yaml.safe_load((proj.workdir / "Pulumi.prod.yaml").read_text())
    del config["config"]["kubernetes:context"]  # the test cluster comes from $KUBECONFIG
    (proj.workdir / "Pulumi.test.yaml").write_text(yaml.safe_dump(config))
    proj.run("stack", "init", "test")
    res = proj.run("preview", "--diff", timeout=300)
    out = res.stdout + res.stderr
    for urn_part in ("nvlfabric:index:NvlfabricDriver", "nvlfabric:index:Nvl72Rack", "nvlfabric:index:ComputeDomain",
                     "nvlfabric:index:BoundJob", "kubernetes:apps/v1:StatefulSet", "kubernetes:batch/v1:Job"):
        assert urn_part in out, urn_part
    assert "rack rack-a1: the nodes do not form the declared NVLink clique: gb200-a1-01: no such Node" in out, \
        out[-3000:]
    assert 'nvidia.com/gpu: "4"' in out  # real GPU limits, unlike the simulator's stacks
    # the launcher line's variables, rank 0 named under the Job's headless Service
    assert "pretrain-0.pretrain.ml.svc" in out, out[-3000:]
    assert "--node-rank=$(NVLFABRIC_RANK)" in out
