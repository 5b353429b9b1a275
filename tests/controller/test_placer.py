"""Placement as a service (nvlfabric/controller/placer.py), its pure parts: which claims a pass
places together, and the channels each clique has left. The rules of fit: test_placement.py; on
the real scheduler: test_placement_on_cluster.py."""

from __future__ import annotations

from nvlfabric.controller import placement
from nvlfabric.controller.placer import channels_left, jobs_to_place
from nvlfabric.controller.reservationplan import ClaimState, Key


def _group(key: Key) -> placement.Group:
    """Every claim's group complete and still to place."""
    return placement.Group(key, 2, 4)


def _not_the_last(key: Key) -> placement.Group | None:
    """... but the job's third claim's."""
    return None if key == ("ns", "j-2") else _group(key)


def test_a_multi_clique_job_is_placed_only_once_every_claim_exists_and_waits() -> None:
    claims = {("ns", f"j-{g}"): ClaimState(f"u{g}", job="j", groups=3) for g in range(2)}
    assert jobs_to_place([("ns", "j-0")], claims, {}, _group) == [], "a claim of the job is missing"
    claims[("ns", "j-2")] = ClaimState("u2", job="j", groups=3)
    [(groups, taken, keys)] = jobs_to_place([("ns", "j-1")], claims, {}, _group)
    assert keys == [("ns", "j-0"), ("ns", "j-1"), ("ns", "j-2")] and taken == set() and len(groups) == 3
    assert jobs_to_place([("ns", "j-0")], claims, {}, _not_the_last) == [], "all groups at once or none"
    # A group placed before (its domain kept its claim) keeps its clique; the others avoid it.
    [(groups, taken, keys)] = jobs_to_place([("ns", "j-0")], claims, {("ns", "j-2"): "C"}, _not_the_last)
    assert taken == {"C"} and keys == [("ns", "j-0"), ("ns", "j-1")]


def test_a_pool_counts_allocated_devices_and_claims_placed_but_not_allocated() -> None:
    claims = {("ns", "a"): ClaimState("u", allocated=True, ours=True, clique="A", channels=3),
              ("ns", "b"): ClaimState("u"), ("ns", "c"): ClaimState("u")}
    assert channels_left(claims, {("ns", "b"): "A", ("ns", "c"): "B"}, per_clique=4) == {"A": 0, "B": 3}
