"""What Nvl72Rack reports about its nodes (nvlfabric/clusterview/racks.py): the cliques the agents discovered,
what disagrees with the declared clique, and the GPUs and nodes still free; and its hot spares (issue 51):
validated at preview, written on the Nodes as nvlfabric.io/spares, nothing written (and nothing changed) for 0."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric.api.names import RACK_LABEL, RACK_NODES_TYPES, SPARES_LABEL
from nvlfabric.clusterview import racks
from nvlfabric.components import ComponentArgsError, Nvl72Rack, program
from nvlfabric.provider import racknodes
from nvlfabric.sim.cluster import delete_nodes, make_ready_nodes
from tests.conftest import Cluster

A, B = "0b6a3ad6-0d1e-4c6e-9d2c-6f0e1f2a3b4c.1", "0b6a3ad6-0d1e-4c6e-9d2c-6f0e1f2a3b4c.2"

MISSING = "{}: no such Node (nothing is labelled or tainted there: check the name)"


def view(name: str, clique: str | None, *, alloc: int = 4, used: int = 0, exists: bool = True) -> racks.NodeView:
    return racks.NodeView(name=name, exists=exists, ready=exists, clique=clique, fabric_ready=clique is not None,
                          gpus_allocatable=alloc, gpus_requested=used)


def test_a_rack_in_its_declared_clique_has_no_mismatch_and_counts_free_gpus() -> None:
    out = racks.summarize([view("n0", A, used=4), view("n1", A, used=1), view("n2", A)], A)
    assert out.mismatches == () and out.free_gpus == 0 + 3 + 4
    assert out.cliques == {"n0": A, "n1": A, "n2": A}


def test_mismatches_name_the_node_and_what_is_wrong() -> None:
    out = racks.summarize([view("n0", A), view("n1", B), view("n2", None), view("n3", None, exists=False)], A)
    assert out.mismatches == (MISSING.format("n3"), "n2: no clique discovered (NVLink fabric not ready)",
                              f"n1: in clique {B}, not the declared {A}")
    undeclared = racks.summarize([view("n0", A), view("n1", B)], None)
    assert len(undeclared.mismatches) == 1 and "report 2 cliques" in undeclared.mismatches[0]


def test_free_nodes_are_the_ready_nodes_none_of_whose_gpus_are_asked_for() -> None:
    nodes = [view("n0", A), view("n1", A, used=1), view("n2", A, used=4), view("n3", A),
             view("n4", A, alloc=0), view("n5", A, exists=False),
             racks.NodeView(name="n6", exists=True, ready=False, clique=A, gpus_allocatable=4)]
    out = racks.summarize(nodes, A)
    assert out.free_nodes == 2 and out.free_gpus == 4 + 3 + 0 + 4  # n0 and n3; n6 is not Ready


RACK_18 = [f"sp-n{i:02}" for i in range(18)]
SPARES_FIX = "declare fewer spares than nodes"


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"nodes": RACK_18[:2], "spares": 2}, f"spares 2 would keep every one of the rack's 2 node(s) free, and no new "
                                          f"ComputeDomain could be placed on the rack: {SPARES_FIX} (at most 1 here)"),
    ({"nodes": RACK_18[:16], "spares": 17}, f"{SPARES_FIX} (at most 15 here)"),
    ({"nodes": RACK_18, "spares": 18}, "Input should be less than or equal to 17 (got 18)"),
    ({"nodes": RACK_18[:4], "spares": -1}, "Input should be greater than or equal to 0 (got -1)"),
    ({"nodes": RACK_18[:4], "spares": 2, "label_nodes": False},
     "spares 2 is written on the rack's Nodes (nvlfabric.io/spares), the one place the controller reads it, and "
     "label_nodes=False writes nothing there: set label_nodes=True (the default), or leave spares at 0"),
    ({"nodes": RACK_18[:4], "spares": True}, "Input should be a valid integer, not a boolean (got True)"),
    ({"nodes": RACK_18[:4], "spares": "2"}, "Input should be a valid integer, not a string (got '2')"),
    ({"nodes": RACK_18[:4], "spares": 2.0}, "Input should be a valid integer, not a float (got 2.0)"),
])
def test_spares_are_refused_at_preview_naming_the_field_and_the_fix(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ComponentArgsError) as err:
        Nvl72Rack("r", observe=False, **kwargs)
    msg = str(err.value)
    assert msg.startswith("Nvl72Rack 'r': invalid arguments\n  spares: ") and words in msg, msg


class _Recorder(pulumi.runtime.Mocks):
    """The inputs each resource was registered with, by name."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[str, dict[str, Any]]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.inputs[args.name] = (args.typ, dict(args.inputs))
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


def _labelling(spares: int | None, suffix: str, nodes: list[str] | None = None) -> tuple[Nvl72Rack, dict[str, Any]]:
    """Rack `rack-<suffix>` (of 18 nodes unless given; spares as given, left out for None) under
    mocks, and the inputs its node labelling resource was registered with."""
    mocks = _Recorder()
    made: list[Nvl72Rack] = []

    @pulumi.runtime.test
    def run() -> Any:
        pulumi.runtime.set_mocks(mocks, preview=True)
        program.reset()  # a fresh program run: the same nodes may be declared again
        extra = {} if spares is None else {"spares": spares}
        made.append(Nvl72Rack(f"rack-{suffix}", nodes=nodes or [f"{suffix}-n{i:02}" for i in range(18)],
                              observe=False, **extra))
        return made[0].spares

    run()
    typ, inputs = mocks.inputs[f"rack-{suffix}-nodes"]
    assert typ in RACK_NODES_TYPES
    return made[0], {k: v for k, v in inputs.items() if k != "__provider"}


def test_spares_are_written_on_every_node_of_the_rack_as_a_label() -> None:
    rack, inputs = _labelling(2, "spr")
    assert inputs["labels"] == {RACK_LABEL: "rack-spr", SPARES_LABEL: "2"}
    assert inputs["nodes"] == [f"spr-n{i:02}" for i in range(18)]
    assert rack.args.spares == 2 and rack.labelled_nodes == inputs["nodes"]


@pytest.mark.parametrize("spares", [None, 0])
def test_a_rack_without_spares_writes_no_label_and_its_preview_shows_no_change(spares: int | None) -> None:
    """What a rack applied before spares existed, recorded as it was: the same inputs now, so an
    existing stack's preview shows its racks unchanged (the provider's diff is of inputs)."""
    suffix = "unset" if spares is None else "zero"
    _, inputs = _labelling(spares, suffix)
    rack = f"rack-{suffix}"
    assert inputs["labels"] == {RACK_LABEL: rack}
    before = {"rack": rack, "manager": f"nvlfabric-rack-{rack}", "nodes": [f"{suffix}-n{i:02}" for i in range(18)],
              "labels": {"nvlfabric.io/rack": rack}, "taints": [], "missing": [], "drift": []}
    assert not racknodes.RackNodesProvider().diff(rack, before, inputs).changes
    # ... and declaring spares on such a rack is a change of its labels (what the next `up` applies).
    _, with_spares = _labelling(2, f"more-{suffix}")
    more = f"rack-more-{suffix}"
    was = {**before, "rack": more, "manager": f"nvlfabric-rack-{more}", "nodes": with_spares["nodes"],
           "labels": {"nvlfabric.io/rack": more}}
    assert racknodes.RackNodesProvider().diff(more, was, with_spares).changes


def test_taints_are_validated_naming_the_field() -> None:
    with pytest.raises(ComponentArgsError) as err:
        Nvl72Rack("r", nodes=["n0"], observe=False, taints=[{"key": "nvidia.com/gpu", "effect": "Sometimes"}])
    assert "taints[0].effect" in str(err.value) and "NoSchedule" in str(err.value)


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[list[str]]:
    suffix = uuid.uuid4().hex[:5]
    names = [f"rk-{suffix}-0", f"rk-{suffix}-1"]
    # The second as on a cluster that runs NVIDIA's driver: its clique in GPU Feature Discovery's label.
    make_ready_nodes(cluster.client, {names[0]: {racks.CLIQUE_LABEL: A}, names[1]: {racks.NVIDIA_CLIQUE_LABEL: B}})
    for n in names:
        cluster.client.patch(Node.Status, n, {"status": {"allocatable": {"nvidia.com/gpu": "4"},
                                                         "capacity": {"nvidia.com/gpu": "4"}}})
    yield names
    for p in cluster.client.list(Pod, namespace="default", labels={"rk-test": suffix}):
        cluster.client.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
    delete_nodes(cluster.client, names)


@pytest.mark.cluster
def test_observe_reads_cliques_and_gpu_use_from_the_api_server(cluster: Cluster, nodes: list[str]) -> None:
    client = cluster.client
    suffix = nodes[0].split("-")[1]
    client.create(Pod(metadata=ObjectMeta(name=f"rk-{suffix}-gpu", namespace="default", labels={"rk-test": suffix}),
                      spec=PodSpec(nodeName=nodes[0], containers=[Container(
                          name="w", image="registry.invalid/w:1",
                          resources=ResourceRequirements(limits={"nvidia.com/gpu": "3"}))])))
    out = racks.summarize(racks.observe(client, [*nodes, "rk-missing"], gpu_resource="nvidia.com/gpu"), A)
    assert out.cliques == {nodes[0]: A, nodes[1]: B, "rk-missing": None}
    assert out.free_gpus == 1 + 4
    assert out.mismatches == (MISSING.format("rk-missing"), f"{nodes[1]}: in clique {B}, not the declared {A}")


@pytest.mark.cluster
def test_spares_reach_the_nodes_and_leave_them_when_set_back_to_0(cluster: Cluster, nodes: list[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The rack's own labelling inputs applied to real Nodes: `kubectl get nodes -L nvlfabric.io/spares`
    shows 1 on each; set back to 0, the rack's apply leaves no spares label (its manager owned it)."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    client, suffix = cluster.client, nodes[0].split("-")[1]
    provider = racknodes.RackNodesProvider()
    _, one = _labelling(1, f"rk{suffix}", nodes)
    created = provider.create(one)
    for n in nodes:
        labels = client.get(Node, n).metadata.labels
        assert labels[SPARES_LABEL] == "1" and labels[RACK_LABEL] == f"rack-rk{suffix}", labels
    _, none = _labelling(0, f"rk{suffix}", nodes)
    assert provider.diff(f"rack-rk{suffix}", created.outs, none).changes
    provider.update(f"rack-rk{suffix}", created.outs, none)
    for n in nodes:
        labels = client.get(Node, n).metadata.labels
        assert SPARES_LABEL not in labels and labels[RACK_LABEL] == f"rack-rk{suffix}", labels
    # Both nodes are fully free (nothing asks for their GPUs): each could be a spare.
    out = racks.summarize(racks.observe(client, nodes, gpu_resource="nvidia.com/gpu"), None)
    assert out.free_nodes == 2
    provider.delete(f"rack-rk{suffix}", created.outs)
