"""An Nvl72Rack's node labelling (nvlfabric/provider/racknodes.py) on the real API server: one
resource per rack applies its labels and taints with a field manager of its own, lets go of them
cleanly, never creates a Node, shows drift on refresh, and takes over from the NodePatch per node
that racks made before 0.2 without the labels ever leaving the Nodes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node

from nvlfabric.api.names import RACK_LABEL
from nvlfabric.clusterview.racks import label_owner
from nvlfabric.provider import racknodes
from nvlfabric.sim.cluster import delete_nodes, make_ready_nodes
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def nodes(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    names = [f"rn-{uuid.uuid4().hex[:5]}-{i}" for i in range(3)]
    make_ready_nodes(cluster.client, {n: {} for n in names})
    yield names
    delete_nodes(cluster.client, names)


def props(nodes: list[str], rack: str = "r0", **extra: Any) -> dict[str, Any]:
    return {"rack": rack, "manager": racknodes.field_manager(f"rack-{rack}"), "nodes": nodes,
            "labels": {RACK_LABEL: rack}, "taints": [], **extra}


def labels(cluster: Cluster, node: str) -> dict[str, str]:
    return dict(cluster.client.get(Node, node).metadata.labels or {})


def test_a_rack_labels_its_nodes_lets_go_of_them_and_creates_none(cluster: Cluster, nodes: list[str]) -> None:
    p = racknodes.RackNodesProvider()
    ghost = f"rn-ghost-{uuid.uuid4().hex[:5]}"
    created = p.create(props([*nodes[:2], ghost], taints=[TAINT]))
    assert created.outs["missing"] == [ghost]
    with pytest.raises(ApiError):
        cluster.client.get(Node, ghost)  # a Node deleted since the preview is not made again
    for n in nodes[:2]:
        assert labels(cluster, n)[RACK_LABEL] == "r0"
        assert label_owner(cluster.client.get(Node, n), RACK_LABEL) == "nvlfabric-rack-rack-r0"
        assert [t.key for t in cluster.client.get(Node, n).spec.taints] == ["nvidia.com/gpu"]
    assert RACK_LABEL not in labels(cluster, nodes[2])

    # A node taken out of the rack, another put in, the taints no longer declared: one update.
    old, new = created.outs, props([nodes[1], nodes[2]])
    assert p.diff("r0", old, new).changes
    p.update("r0", old, new)
    assert RACK_LABEL not in labels(cluster, nodes[0]) and not cluster.client.get(Node, nodes[0]).spec.taints
    assert labels(cluster, nodes[2])[RACK_LABEL] == "r0"
    assert not p.diff("r0", p.create(new).outs, new).changes, "an unchanged rack is no change (no cluster read)"

    p.delete("r0", new)
    assert all(RACK_LABEL not in labels(cluster, n) for n in nodes)


def test_refresh_shows_a_label_removed_by_hand_and_up_puts_it_back(cluster: Cluster, nodes: list[str]) -> None:
    p = racknodes.RackNodesProvider()
    outs = p.create(props(nodes)).outs
    assert p.read("r0", outs).outs["drift"] == []
    cluster.client.patch(Node, nodes[1], {"metadata": {"labels": {RACK_LABEL: None}}})  # kubectl label ... -
    refreshed = p.read("r0", outs).outs
    assert refreshed["drift"] == [nodes[1]]
    assert p.diff("r0", refreshed, props(nodes)).changes
    p.update("r0", refreshed, props(nodes))
    assert labels(cluster, nodes[1])[RACK_LABEL] == "r0"
    p.delete("r0", props(nodes))


def test_it_takes_over_from_a_node_patch_without_the_label_leaving(cluster: Cluster, nodes: list[str]) -> None:
    """Upgrading a stack whose racks made a NodePatch per node: the engine creates the rack's new
    resource, then deletes the NodePatches (pulumi-kubernetes lets go of its manager's fields)."""
    old_manager = "pulumi-kubernetes-0a1b2c3d"  # what a NodePatch applies as
    for n in nodes:
        cluster.client.apply(Node.from_dict({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": n, "labels": {RACK_LABEL: "r0"}}, "spec": {"taints": [TAINT]}}), field_manager=old_manager)
    p = racknodes.RackNodesProvider()
    p.create(props(nodes, taints=[TAINT]))
    for n in nodes:  # the NodePatch deleted: an apply of nothing under its manager
        cluster.client.apply(Node.from_dict({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
                             field_manager=old_manager)
        node = cluster.client.get(Node, n)
        assert node.metadata.labels[RACK_LABEL] == "r0" and [t.key for t in node.spec.taints] == ["nvidia.com/gpu"]
        assert label_owner(node, RACK_LABEL) == "nvlfabric-rack-rack-r0"
    p.delete("r0", props(nodes, taints=[TAINT]))
    assert all(RACK_LABEL not in labels(cluster, n) for n in nodes)


def test_bad_inputs_are_named() -> None:
    failures = racknodes.RackNodesProvider().check({}, {**props(["n"]), "rack": "Not A Label"}).failures
    assert [f.property for f in failures] == ["rack"]
