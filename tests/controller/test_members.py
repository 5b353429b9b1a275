"""The controller's index of the agents' reports (controller/members.py): whatever order Nodes
come, change and go in, it holds what a walk over every Node would find, and a domain's version
changes exactly when its members' entries or their fabric health do, so a pass skips a domain only
when its summary would not change."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nvlfabric.api import computedomain as api
from nvlfabric.controller.cache import AgentNode
from nvlfabric.controller.informer import Key, Listener
from nvlfabric.controller.members import Members

NODES = [f"n{i}" for i in range(5)]
U1, U2 = "5f0c2a4e-1b3d-4c5e-8f70-0123456789ab.1", "5f0c2a4e-1b3d-4c5e-8f70-0123456789ab.2"
DOMAINS = [("default", "a"), ("default", "b"), ("team", "a")]


class Source:
    """The Node informer as the index sees it: its items and its listeners' calls."""

    def __init__(self) -> None:
        self.items_: dict[Key, AgentNode] = {}
        self.listeners: list[Listener] = []

    def listen(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def items(self) -> dict[Key, AgentNode]:
        return dict(self.items_)

    def set(self, name: str, node: AgentNode | None) -> None:
        key = ("", name)
        old = self.items_.pop(key, None) if node is None else self.items_.get(key)
        if node is not None:
            self.items_[key] = node
        if old != node:
            for listener in self.listeners:
                listener("MODIFIED", key, old, node)


def node(name: str, clique: str | None, sick: str | None, reports: dict[tuple[str, str], bool]) -> AgentNode:
    return AgentNode(name=name, clique=clique, unhealthy=sick, placement={},
                     reports=tuple((ns, d, api.NodeStatus(name=name, ready=ready, clique=clique))
                                   for (ns, d), ready in sorted(reports.items())))


nodes = st.builds(node, st.sampled_from(NODES), st.sampled_from([None, U1, U2]),
                  st.sampled_from([None, "FabricDown: link 3"]),
                  st.dictionaries(st.sampled_from(DOMAINS), st.booleans(), max_size=3))
changes = st.lists(st.one_of(nodes, st.sampled_from(NODES)), max_size=30)  # a bare name: the Node is deleted


def walk(held: dict[Key, AgentNode]) -> tuple[dict[tuple[str, str], list[Any]], dict[str, str], dict[str, int]]:
    """What a pass found by walking every Node (the controller before the index)."""
    entries: dict[tuple[str, str], list[Any]] = {}
    sick: dict[str, str] = {}
    cliques: dict[str, int] = {}
    for n in held.values():
        if n.clique:
            cliques[n.clique] = cliques.get(n.clique, 0) + 1
        if n.unhealthy:
            sick[n.name] = n.unhealthy
        for ns, d, e in n.reports:
            entries.setdefault((ns, d), []).append(e)
    return {k: sorted(v, key=lambda e: e.name) for k, v in entries.items()}, sick, cliques


def view(n: AgentNode | None, domain: tuple[str, str]) -> Any:
    """What a domain's summary reads of one Node: its entry and, if it is a member, its health."""
    if n is None:
        return None
    entry = next((e for ns, d, e in n.reports if (ns, d) == domain), None)
    return None if entry is None else (entry, n.unhealthy)


@settings(max_examples=300, deadline=None)
@given(st.lists(nodes, max_size=4), changes)
def test_the_index_holds_what_a_walk_over_every_node_finds(seed: list[AgentNode], steps: list[Any]) -> None:
    source = Source()
    for n in seed:  # Nodes the informer held before the index was made
        source.items_[("", n.name)] = n
    index = Members(source)
    for step in steps:
        before = {d: index.of(d) for d in DOMAINS}
        old = dict(source.items_)
        if isinstance(step, str):
            source.set(step, None)
        else:
            source.set(step.name, step)
        entries, sick, cliques = walk(source.items_)
        assert index.unhealthy() == sick and index.cliques() == cliques
        for d in DOMAINS:
            version, members = index.of(d)
            assert members == entries.get(d, [])
            touched = {name for name in NODES
                       if view(old.get(("", name)), d) != view(source.items_.get(("", name)), d)}
            assert (version != before[d][0]) == bool(touched), f"{d}: nodes that changed for it: {touched}"


def test_a_change_told_twice_counts_once() -> None:
    source = Source()
    index = Members(source)
    n = node("n0", U1, None, {DOMAINS[0]: True})
    source.set("n0", n)
    index._changed("MODIFIED", ("", "n0"), n, n)  # a seed racing the watch: the same record again
    assert index.cliques() == {U1: 1}
    assert [e.name for e in index.of(DOMAINS[0])[1]] == ["n0"]
