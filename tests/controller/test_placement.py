"""The clique planner: every group placed where all its pods fit, a job's groups all or none, no
clique over-committed by groups placed one after another (hypothesis over random churn)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nvlfabric.api.names import CLIQUE_LABEL
from nvlfabric.controller.placement import (
    Group,
    NodeRoom,
    NoRoom,
    Reserved,
    gpus_of,
    node_rooms,
    place,
    room,
    with_dra_gpus,
)

RACK = 18


def rack(clique: str, free: list[int]) -> list[NodeRoom]:
    return [NodeRoom(f"{clique}-n{i}", clique, f, {CLIQUE_LABEL: clique}) for i, f in enumerate(free)]


def test_eight_whole_rack_domains_get_eight_racks() -> None:
    """The case found on the simulator: 8 domains of 18 pods x 4 GPUs on 8 empty racks."""
    nodes = [n for r in range(8) for n in rack(f"c{r}", [4] * RACK)]
    channels = {f"c{r}": 127 for r in range(8)}
    reserved: list[Reserved] = []
    chosen = []
    for d in range(8):
        got = place([Group(("default", f"d{d}-channel"), 18, 4)], nodes, channels, reserved)
        assert not isinstance(got, NoRoom), got
        (clique,) = got.values()
        chosen.append(clique)
        reserved.append(Reserved(clique, 18, 4))
    assert sorted(chosen) == [f"c{r}" for r in range(8)]
    ninth = place([Group(("default", "d8-channel"), 18, 4)], nodes, channels, reserved)
    assert isinstance(ninth, NoRoom)
    assert "no NVLink clique has room for 18 pods x 4 GPUs: the most is 0" in ninth.message()


def test_best_fit_keeps_whole_racks_free() -> None:
    nodes = rack("a", [4] * RACK) + rack("b", [4] * 4 + [0] * 14)
    got = place([Group(("ns", "small"), 4, 4)], nodes, {"a": 1, "b": 1})
    assert got == {("ns", "small"): "b"}


def test_a_clique_without_a_free_channel_is_not_chosen() -> None:
    nodes = rack("a", [4] * RACK) + rack("b", [4] * RACK)
    assert place([Group(("ns", "x"), 18, 4)], nodes, {"a": 0, "b": 3}) == {("ns", "x"): "b"}
    none = place([Group(("ns", "x"), 1, 1)], nodes, {"a": 0, "b": 0})
    assert isinstance(none, NoRoom) and none.reason == "ChannelPoolExhausted"
    assert "every channel of cliques a, b is allocated (ChannelPoolExhausted)" in none.message()


def test_a_job_of_groups_gets_distinct_cliques_or_nothing() -> None:
    nodes = [n for c in "abc" for n in rack(c, [4] * RACK)]
    job = [Group(("ns", f"j-channel-{i}"), 18, 4) for i in range(3)]
    got = place(job, nodes, dict.fromkeys("abc", 5))
    assert not isinstance(got, NoRoom) and sorted(got.values()) == ["a", "b", "c"]
    assert isinstance(place([*job, Group(("ns", "j-channel-3"), 1, 1)], nodes, dict.fromkeys("abc", 5)), NoRoom)


def test_the_pods_node_selector_narrows_the_nodes() -> None:
    nodes = rack("a", [4] * RACK) + [NodeRoom(f"b{i}", "b", 4, {CLIQUE_LABEL: "b", "pool": "x"}) for i in range(2)]
    assert place([Group(("ns", "g"), 2, 4, {"pool": "x"})], nodes, {"a": 1, "b": 1}) == {("ns", "g"): "b"}


def test_node_rooms_count_what_bound_pods_hold_and_skip_what_cannot_take_pods() -> None:
    def node(name: str, **kw: object) -> dict[str, object]:
        return {"metadata": {"name": name, "labels": {CLIQUE_LABEL: "c"} if kw.get("labelled", True) else {}},
                "spec": {"taints": kw.get("taints", []), "unschedulable": kw.get("unschedulable", False)},
                "status": {"allocatable": {"nvidia.com/gpu": "4"},
                           "conditions": [{"type": "Ready", "status": "True" if kw.get("ready", True) else "False"}]}}

    def pod(node: str, gpus: int, phase: str = "Running") -> dict[str, object]:
        return {"spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
                "status": {"phase": phase}}

    sick = {"key": "nvlfabric.io/fabric-unhealthy", "effect": "NoSchedule"}
    nodes = [node("busy"), node("free"), node("sick", taints=[sick]), node("down", ready=False),
             node("cordoned", unschedulable=True), node("nolabel", labelled=False),
             node("soft", taints=[{"key": "x", "effect": "PreferNoSchedule"}])]
    pods = [pod("busy", 3), pod("busy", 1, "Succeeded")]
    rooms = {r.name: r.free_gpus for r in node_rooms(nodes, pods)}
    assert rooms == {"busy": 1, "free": 4, "soft": 4}
    tolerant = {r.name for r in node_rooms(nodes, pods, [{"key": "nvlfabric.io/fabric-unhealthy",
                                                          "operator": "Exists"}])}
    assert "sick" in tolerant


def test_a_node_with_dra_gpus_has_room_for_its_untainted_ones_and_a_device_plugins_count_wins() -> None:
    """With NvlfabricDriver(gpu_devices="DRA") a node has no nvidia.com/gpu of a device plugin: its
    room is what its GPU slice offers untainted (cache.gpu_slice), less what its pods hold."""
    node = {"metadata": {"name": "n", "labels": {CLIQUE_LABEL: "c"}}, "spec": {},
            "status": {"allocatable": {"cpu": "144"}, "conditions": [{"type": "Ready", "status": "True"}]}}
    pods = [{"spec": {"nodeName": "n", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running"}}]
    assert [r.free_gpus for r in node_rooms([with_dra_gpus(node, 3)], pods)] == [2]
    assert node["status"]["allocatable"] == {"cpu": "144"}  # the cached record is left alone
    assert with_dra_gpus(node, None) is node  # no slice: no GPUs, as before
    plugin = {**node, "status": {**node["status"], "allocatable": {"nvidia.com/gpu": "4"}}}
    assert with_dra_gpus(plugin, 1) is plugin


def test_gpus_of_a_pod_follows_the_schedulers_rule() -> None:
    assert gpus_of({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                                            {"resources": {"requests": {"nvidia.com/gpu": 1}}}],
                             "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}) == 4
    assert gpus_of({"spec": {"containers": [{"name": "cpu"}]}}) == 0


# -- properties -----------------------------------------------------------------------------------

sizes = st.sampled_from([1, 2, 4])
cliques = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=RACK), min_size=1, max_size=5)


def _nodes(free: list[list[int]]) -> list[NodeRoom]:
    return [n for i, f in enumerate(free) for n in rack(f"c{i}", f)]


@settings(max_examples=300, deadline=None)
@given(free=cliques, g=sizes, ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(1, 3)),
                                          max_size=30), channels=st.integers(0, 4))
def test_random_churn_never_over_commits_a_clique_and_jobs_are_all_or_nothing(
        free: list[list[int]], g: int, ops: list[tuple[bool, int, int]], channels: int) -> None:
    """Jobs of 1-3 groups come (placed against what earlier ones hold) and go (their room is
    freed). With one pod size, what is placed in a clique always packs onto its nodes; a job's
    groups are in distinct cliques; a clique's channels are never over-used."""
    nodes = _nodes(free)
    free_channels = {f"c{i}": channels for i in range(len(free))}
    live: list[list[tuple[tuple[str, str], Reserved]]] = []
    for n, (arrive, pods, ngroups) in enumerate(ops):
        if not arrive and live:
            live.pop(0)
            continue
        reserved = [r for job in live for _, r in job]
        used_channels = {c: sum(1 for r in reserved if r.clique == c) for c in free_channels}
        left = {c: free_channels[c] - used_channels[c] for c in free_channels}
        groups = [Group(("ns", f"j{n}-g{i}"), pods, g) for i in range(ngroups)]
        got = place(groups, nodes, left, reserved)
        if isinstance(got, NoRoom):
            # Nothing placed, and the group named really has no room where a channel is free.
            assert all(room(c, nodes, reserved, got.group) < got.group.pods or left[c] <= 0
                       for c in left) or ngroups > 1
            continue
        assert set(got) == {gr.key for gr in groups}
        assert len(set(got.values())) == ngroups
        live.append([(k, Reserved(c, pods, g)) for k, c in got.items()])
        # Pack every live group onto its clique's nodes, pod by pod: each must find a node.
        for i in range(len(free)):
            c = f"c{i}"
            room_left = [f for f in free[i]]
            for r in (r for job in live for _, r in job if r.clique == c):
                for _ in range(r.pods):
                    spot = next((j for j, f in enumerate(room_left) if f >= r.gpus_per_pod), None)
                    assert spot is not None, f"clique {c} over-committed"
                    room_left[spot] -= r.gpus_per_pod
            assert sum(1 for job in live for _, r in job if r.clique == c) <= free_channels[c]


def test_a_job_that_does_not_fit_whole_says_how_many_cliques_it_needs_and_has() -> None:
    nodes = rack("a", [4] * RACK) + rack("b", [4] * RACK) + rack("c", [4] * 9)
    job = [Group(("ns", f"j-channel-{i}"), 18, 4) for i in range(3)]
    got = place(job, nodes, dict.fromkeys("abc", 1))
    assert isinstance(got, NoRoom)
    assert got.message().startswith("a job of 3 clique groups needs 3 cliques with room, 2 have it; no NVLink "
                                    "clique has room for 18 pods x 4 GPUs: the most is 9 such pods, in clique c")
    # Its groups placed before (a restarted controller) keep their cliques; the rest go elsewhere.
    rest = place(job[1:2], nodes, dict.fromkeys("abc", 1), exclude={"a"})
    assert rest == {("ns", "j-channel-1"): "b"}


class _CountedNodes(list[NodeRoom]):
    """The nodes, counting how often placement walks all of them."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_placing_a_fleets_jobs_walks_its_nodes_once_not_once_per_clique() -> None:
    """64 racks of 18 nodes, a job of 8 whole-rack groups: placement reads the node list once (it
    read it once per clique for every group: 64 x 8 walks of 1,152 nodes, the controller's CPU
    growing faster than the fleet; docs/architecture.md, Scale)."""
    nodes = _CountedNodes(NodeRoom(f"r{r}-n{i}", f"clique-{r:02}", 4) for r in range(64) for i in range(18))
    _CountedNodes.walks = 0
    groups = [Group(("default", f"job-{k}"), 18, 4) for k in range(8)]
    got = place(groups, nodes, {f"clique-{r:02}": 1 for r in range(64)})
    assert isinstance(got, dict) and len(set(got.values())) == 8
    assert _CountedNodes.walks == 1
