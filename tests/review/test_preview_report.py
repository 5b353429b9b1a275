"""The preview report: real previews of the dev stack (recorded on the simulator, slimmed by
tests/review/slim.py) with what runs on the cluster, rendered as Markdown against golden files;
bad input; and the facts read from a real API server.

Regenerate the Markdown after an intended change with
`NVLFABRIC_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/review`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric.api.names import RACK_LABEL, SPARES_LABEL
from nvlfabric.review import cluster as cluster_facts
from nvlfabric.review import impact, markdown, preview
from nvlfabric.review.impact import Facts
from tests.conftest import Cluster

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "report"
RACKS = {"rack-0": (8, 32, 4), "rack-1": (8, 32, 32)}  # as the recording's cluster had them
RUNNING = Facts(running_by_domain={("default", "eval"): 1, ("default", "pretrain"): 4},
                running_by_workload={("default", "eval"): 1, ("default", "pretrain"): 4}, rack_gpus=RACKS)
SCENARIOS = {
    "create": None,  # no cluster read: what is unknown says so
    "update": RUNNING,  # the driver's controller: channels_per_clique 128 -> 64
    "replace": RUNNING,  # the eval domain's imexMode: its running pod loses its channel
    "delete": RUNNING,  # the eval domain and its Job removed
    "shortfall": RUNNING,  # one more job: the asked GPUs against the free ones, the capacity warning
}


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NVLFABRIC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} is missing; run with NVLFABRIC_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file; if intended, regenerate. Got:\n{text}"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_real_preview_reads_as_the_golden_report(scenario: str) -> None:
    pv = preview.load((GOLDEN / f"{scenario}.json").read_text())
    _golden(f"{scenario}.md", markdown.render(impact.build(pv, SCENARIOS[scenario])))


def test_a_replace_names_its_reason_and_the_running_pods_it_disrupts() -> None:
    report = impact.build(preview.load((GOLDEN / "replace.json").read_text()), RUNNING)
    (domain,) = report.domains
    assert (domain.ref, domain.op, domain.reasons, domain.running) == ("default/eval", "replace", ("spec.imexMode",), 1)
    assert "1 running pods disrupted" in markdown.render(report)


def test_a_delete_counts_the_domains_and_the_workloads_pods_once() -> None:
    text = markdown.render(impact.build(preview.load((GOLDEN / "delete.json").read_text()), RUNNING))
    assert "; **1 running pods disrupted**" in text


def _rack_step(op: str, rack: str, spares: int, before: int | None) -> dict[str, Any]:
    """A rack's node labelling step as `pulumi preview --json` lists it (spares 0: no label, as written)."""
    def state(n: int) -> dict[str, Any]:
        labels = {RACK_LABEL: rack} | ({SPARES_LABEL: str(n)} if n else {})
        return {"type": "pulumi-python:dynamic/nvlfabric:RackNodes",
                "inputs": {"rack": rack, "nodes": [f"{rack}-node-{i:02}" for i in range(8)], "labels": labels}}
    step = {"op": op, "urn": f"urn:pulumi:dev::nvlfabric-dev::nvlfabric:index:Nvl72Rack$pulumi-python:dynamic/"
                             f"nvlfabric:RackNodes::{rack}-nodes", "newState": state(spares)}
    return step | ({"oldState": state(before)} if before is not None else {})


def test_a_rack_whose_spares_change_is_listed_with_them() -> None:
    """rack-0 declares 2 spares (an update of its labels), rack-1 keeps none: the rack table shows,
    with a spares column saying what changes, although no workload changes."""
    pv = preview.Preview.model_validate({"steps": [_rack_step("update", "rack-0", 2, 0),
                                                   _rack_step("same", "rack-1", 0, 0)],
                                         "changeSummary": {"update": 1, "same": 1}})
    report = impact.build(pv, RUNNING)
    assert [(r.name, r.spares, r.spares_before) for r in report.racks] == [("rack-0", 2, 0), ("rack-1", 0, None)]
    text = markdown.render(report)
    assert "| rack | nodes | GPUs | free GPUs | spare nodes |\n|---|---|---|---|---|\n" in text, text
    assert "| rack-0 | 8 | 32 | 4 | 0 → 2 |\n| rack-1 | 8 | 32 | 32 | 0 |\n" in text, text
    assert "no new domain is placed on them, so of the free GPUs, 4 per spare node are not for new workloads" in text
    # Back to none: the column says so, and then is gone once no rack has any.
    back = impact.build(preview.Preview.model_validate({"steps": [_rack_step("update", "rack-0", 0, 2)]}), RUNNING)
    assert "| rack-0 | 8 | 32 | 4 | 2 → 0 |" in markdown.render(back)
    unchanged = preview.Preview.model_validate({"steps": [_rack_step("same", "rack-0", 0, 0)]})
    assert "spare" not in markdown.render(impact.build(unchanged, RUNNING))


def test_the_spares_the_cluster_says_are_shown_beside_the_free_gpus() -> None:
    """A rack the preview does not change: its spares from its Nodes' labels (Facts.rack_spares)."""
    pv = preview.load((GOLDEN / "shortfall.json").read_text())
    text = markdown.render(impact.build(pv, dataclasses.replace(RUNNING, rack_spares={"rack-1": 2})))
    assert "| rack-0 | 8 | 32 | 4 | 0 |\n| rack-1 | 8 | 32 | 32 | 2 |\n" in text, text
    # (racks without spares have no such column: the golden reports, test_a_real_preview_reads_as_the_golden_report)


@pytest.mark.parametrize(("text", "words"), [
    ("not json", "not JSON (Expecting value at line 1)"),
    ('{"resources": []}', "no 'steps' in the JSON"),
    ('{"steps": [{"urn": "x"}]}', "unexpected preview JSON at steps.0.op: Field required"),
])
def test_input_that_is_not_a_preview_is_one_line_and_exit_2(text: str, words: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nvlfabric.cli.main", "preview-report", "--no-cluster"],
                          input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("nvlfabric preview-report: -: ") and words in line, line


@pytest.mark.cluster
def test_the_report_reads_running_pods_and_rack_gpus_from_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """The CLI against a real API server: a Running pod of the replaced domain, and a rack whose
    Nodes are labelled so, with GPUs allocatable and some taken."""
    from nvlfabric.sim.cluster import delete_nodes, make_ready_nodes

    client = cluster.client
    run = uuid.uuid4().hex[:5]
    rack, nodes = f"rack-{run}", [f"rpt-{run}-{i}" for i in range(2)]
    # Spares 2 and 1 on its Nodes (as two declarations left them): the rack's is the largest.
    make_ready_nodes(client, {n: {"nvlfabric.io/rack": rack, SPARES_LABEL: str(2 - i)} for i, n in enumerate(nodes)})
    pod = f"eval-{run}"
    try:
        for n in nodes:
            client.patch(Node.Status, n, {"status": {"allocatable": {"nvidia.com/gpu": "4"},
                                                     "capacity": {"nvidia.com/gpu": "4"}}})
        client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default", labels={
            "nvlfabric.io/compute-domain": "eval", "nvlfabric.io/workload": "eval"}), spec=PodSpec(
            nodeName=nodes[0], containers=[Container(name="c", image="registry.invalid/c:1", resources={
                "limits": {"nvidia.com/gpu": "4"}})])))
        client.patch(Pod.Status, pod, {"status": {"phase": "Running"}}, namespace="default")
        facts = cluster_facts.read(client, {})
        assert facts.running_by_domain[("default", "eval")] >= 1 and facts.rack_gpus[rack] == (2, 8, 4)
        assert facts.rack_spares[rack] == 2
        kubeconfig = cluster.kubeconfig
        proc = subprocess.run([sys.executable, "-m", "nvlfabric.cli.main", "preview-report",
                               str(GOLDEN / "replace.json"), "--kubeconfig", str(kubeconfig)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "| `default/eval` | +- replace | spec.imexMode | 1 |" in proc.stdout, proc.stdout
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod, namespace="default", grace_period=0)
        delete_nodes(client, nodes)
