"""What Nvl72Rack reports about its nodes (nvlfabric/clusterview/racks.py): the cliques the agents discovered,
what disagrees with the declared clique, and the GPUs still free."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric.clusterview import racks
from nvlfabric.components import ComponentArgsError, Nvl72Rack
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
