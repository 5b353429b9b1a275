"""Which member nodes a domain lost and when it is healed (controller/nodeloss.py, pure)."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.api import computedomain as api
from nvlfabric.controller import nodeloss, placement
from nvlfabric.controller.reconcile import summarize

NOW = datetime.datetime(2026, 12, 7, 1, 0, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(seconds=30)
REPLACE, KEEP = api.NodeLossPolicy.REPLACE, api.NodeLossPolicy.KEEP


def entry(name: str, ready: bool = True) -> api.NodeStatus:
    return api.NodeStatus(name=name, ready=ready)


def judge(status: api.ComputeDomainStatus, entries: list[api.NodeStatus], *, down: dict[str, str] | None = None,
          sick: dict[str, str] | None = None, known: set[str] | None = None, policy: api.NodeLossPolicy = REPLACE,
          num_nodes: int | None = None, now: datetime.datetime = NOW) -> nodeloss.NodeLoss:
    names = {e.name for e in entries} | {n.name for n in status.nodes}
    return nodeloss.judge(status, entries, down=down or {}, sick=sick or {},
                          known=known if known is not None else names, policy=policy, num_nodes=num_nodes, now=now)


def test_a_notready_member_is_lost_and_out_of_the_members_until_replaced() -> None:
    ready = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry("a"), entry("b"), entry("c")])
    loss = judge(ready, [entry("a"), entry("b"), entry("c")], down={"b": "Ready Unknown: NodeStatusUnknown"})
    assert [(n.name, n.reason, n.ready_before) for n in loss.lost] == [("b", api.LostReason.NODE_NOT_READY, 3)]
    assert [e.name for e in loss.members] == ["a", "c"] and not loss.healed and loss.new == loss.lost
    # Next pass: the status holds the loss; a replacement joins on d, not ready yet, then ready.
    after = api.ComputeDomainStatus(phase=api.Phase.DEGRADED, nodes=list(loss.members), lost_nodes=list(loss.lost))
    joining = judge(after, [entry("a"), entry("b"), entry("c"), entry("d", ready=False)], down={"b": "x"},
                    now=LATER)
    assert not joining.healed and joining.new == () and joining.lost[0].lost_at == NOW.replace(microsecond=0)
    healed = judge(after, [entry("a"), entry("b"), entry("c"), entry("d")], down={"b": "x"}, now=LATER)
    assert healed.healed
    # b still reports (a dead node withdraws nothing): still listed, not a member.
    assert [n.name for n in healed.lost] == ["b"] and [e.name for e in healed.members] == ["a", "c", "d"]
    # b is back and no longer reports: forgotten.
    back = judge(after, [entry("a"), entry("c"), entry("d")], known={"a", "b", "c", "d"}, now=LATER)
    assert back.lost == () and back.healed


def test_a_deleted_node_is_remembered_by_the_status_until_replaced() -> None:
    ready = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry("a"), entry("b")])
    loss = judge(ready, [entry("a")], known={"a"})
    assert [(n.name, n.reason) for n in loss.lost] == [("b", api.LostReason.NODE_DELETED)] and not loss.healed
    after = api.ComputeDomainStatus(phase=api.Phase.DEGRADED, nodes=list(loss.members), lost_nodes=list(loss.lost))
    assert [n.name for n in judge(after, [entry("a")], known={"a"}).lost] == ["b"]
    healed = judge(after, [entry("a"), entry("c")], known={"a", "c"})
    assert healed.healed and healed.lost == ()
    # A member that left while its Node stays (a pod finished) is not lost.
    assert judge(ready, [entry("a")], known={"a", "b"}).lost == ()


def test_members_joining_or_leaving_a_ready_domain_are_told_but_not_losses_or_a_forming_domain() -> None:
    ready = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry("a"), entry("b")])
    grown = judge(ready, [entry("a"), entry("b"), entry("c", ready=False)])
    assert nodeloss.membership_change(ready, grown) == (["c"], [])
    shrunk = judge(ready, [entry("a")], known={"a", "b"})
    assert nodeloss.membership_change(ready, shrunk) == ([], ["b"])
    # A lost node has its own Event (NodeLost): not told as left.
    lost = judge(ready, [entry("a"), entry("b")], down={"b": "Ready Unknown"})
    assert nodeloss.membership_change(ready, lost) == ([], [])
    # A domain still forming (members arriving as they are placed) is no news.
    forming = api.ComputeDomainStatus(phase=api.Phase.ALLOCATING, nodes=[entry("a")])
    assert nodeloss.membership_change(forming, judge(forming, [entry("a"), entry("b")])) == ([], [])


def test_a_sick_fabric_is_a_loss_only_under_replace() -> None:
    ready = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry("a"), entry("b")])
    assert [n.reason for n in judge(ready, [entry("a"), entry("b")], sick={"a": "FabricDegraded"}).lost] == [
        api.LostReason.FABRIC_UNHEALTHY]
    kept = judge(ready, [entry("a"), entry("b")], sick={"a": "FabricDegraded"}, policy=KEEP)
    assert kept.lost == () and len(kept.members) == 2


def test_two_losses_need_two_replacements_and_num_nodes_counts() -> None:
    ready = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry(n) for n in "abcd"])
    first = judge(ready, [entry(n) for n in "abcd"], down={"a": "x"})
    mid = api.ComputeDomainStatus(phase=api.Phase.DEGRADED, nodes=list(first.members), lost_nodes=list(first.lost))
    second = judge(mid, [entry(n) for n in "abcd"], down={"a": "x", "b": "y"})
    assert [n.ready_before for n in second.lost] == [4, 3]
    both = api.ComputeDomainStatus(phase=api.Phase.DEGRADED, nodes=list(second.members), lost_nodes=list(second.lost))
    assert not judge(both, [entry(n) for n in "cde"], known=set("cde")).healed
    assert judge(both, [entry(n) for n in "cdef"], known=set("cdef")).healed
    assert not judge(both, [entry(n) for n in "cdef"], known=set("cdef"), num_nodes=5).healed


def test_the_summary_is_degraded_with_the_loss_and_ready_once_healed() -> None:
    spec = api.ComputeDomainSpec(num_nodes=2)
    ready = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry("a"), entry("b")])
    loss = judge(ready, [entry("a"), entry("b")], down={"b": "Ready Unknown"})
    told = nodeloss.describe(loss, policy=REPLACE, clique="c.1", free_nodes=0)
    out = summarize(spec, ready.model_copy(update={"nodes": list(loss.members)}), 1, ("c.1", 3), now=NOW,
                    loss=(loss.lost, loss.healed, told))
    assert out["phase"] == "Degraded" and out["lostNodes"][0]["name"] == "b"
    ready_cond = next(c for c in out["conditions"] if c["type"] == "Ready")
    assert ready_cond["reason"] == "NodeLost" and "waiting for a node" in ready_cond["message"]
    available = next(c for c in out["conditions"] if c["type"] == "NodesAvailable")
    assert (available["status"], available["reason"]) == ("False", "NodeNotReady")
    fine = summarize(spec, ready, 1, ("c.1", 3), now=NOW)
    assert fine["phase"] == "Ready" and "lostNodes" not in fine
    assert next(c for c in fine["conditions"] if c["type"] == "NodesAvailable")["status"] == "True"


names_ = st.sampled_from("abcdef")


@given(st.lists(st.tuples(names_, st.booleans()), unique_by=lambda t: t[0], max_size=6),
       st.lists(st.tuples(names_, st.booleans()), unique_by=lambda t: t[0], max_size=6),
       st.sets(names_), st.sets(names_), st.sets(names_), st.sampled_from([REPLACE, KEEP]),
       st.one_of(st.none(), st.integers(1, 6)))
def test_a_lost_node_is_never_a_member_and_nothing_lost_is_healed(
        before: list[tuple[str, bool]], now: list[tuple[str, bool]], down: set[str], sick: set[str],
        deleted: set[str], policy: api.NodeLossPolicy, num_nodes: int | None) -> None:
    status = api.ComputeDomainStatus(phase=api.Phase.READY, nodes=[entry(n, r) for n, r in before])
    entries = [entry(n, r) for n, r in now if n not in deleted]
    loss = nodeloss.judge(status, entries, down={n: "x" for n in down}, sick={n: "y" for n in sick},
                          known=set("abcdef") - deleted, policy=policy, num_nodes=num_nodes, now=NOW)
    lost = {n.name for n in loss.lost}
    assert not lost & {e.name for e in loss.members}
    assert {e.name for e in loss.members} <= {e.name for e in entries}
    assert all(n.name not in deleted or n.reason is api.LostReason.NODE_DELETED or n.name in down or n.name in sick
               for n in loss.lost)
    if not lost:
        assert loss.healed
    if policy is KEEP:
        assert all(n.reason is not api.LostReason.FABRIC_UNHEALTHY for n in loss.lost)


def test_spares_keep_idle_nodes_out_of_a_new_group_but_not_a_joiner() -> None:
    spare = {"nvlfabric.io/spares": "2"}
    rooms = [placement.NodeRoom(f"n{i}", "c.1", 4, spare, idle=True) for i in range(4)]
    group = placement.Group(("default", "claim"), pods=3, gpus_per_pod=4)
    got = placement.place([group], rooms, {"c.1": 10})
    assert isinstance(got, placement.NoRoom) and got.best_room == 2 and got.spares == 2
    assert "2 idle nodes kept there as spares" in got.message()
    assert placement.place([group.__class__(group.key, 2, 4)], rooms, {"c.1": 10}) == {group.key: "c.1"}
    # A joiner (Placer.joiners) counts every node: slots over all four.
    assert placement.slots(rooms, 4) == 4
    # Busy nodes are not spares: with two of four busy, none of the idle two may be taken.
    busy = [placement.NodeRoom("n0", "c.1", 0, spare), placement.NodeRoom("n1", "c.1", 0, spare), *rooms[2:]]
    assert isinstance(placement.place([group.__class__(group.key, 1, 4)], busy, {"c.1": 10}), placement.NoRoom)
