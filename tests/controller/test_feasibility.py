"""A domain the cluster or the driver can never satisfy is said to be so, with the reason and the
way out, and one that can be satisfied never is (pure rules; the cluster test is in
test_placement_on_cluster.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.api import computedomain as api
from nvlfabric.controller import feasibility
from nvlfabric.controller.feasibility import Inventory, verdict
from nvlfabric.controller.reconcile import free_channels, summarize

ALL = frozenset(api.IMEXMode)
A, B, C, D, E = (f"{c * 8}-{c * 4}-{c * 4}-{c * 4}-{c * 12}.{i}" for i, c in enumerate("abcde", 1))


def inv(nodes: dict[str, int], free: dict[str, int] | None = None, modes: frozenset[api.IMEXMode] = ALL,
        channels: int = 4) -> Inventory:
    return Inventory(nodes=nodes, free_channels=free or {}, modes=modes, channels_per_clique=channels)


def spec(**kw: Any) -> api.ComputeDomainSpec:
    return api.ComputeDomainSpec.model_validate(kw)


@pytest.mark.parametrize(("the_spec", "inventory", "reason", "words"), [
    pytest.param(spec(imexMode="Dedicated"), inv({A: 18}, modes=frozenset({api.IMEXMode.CLIQUE_SCOPED})),
                 "IMEXModeNotAllowed", ["imexMode Dedicated is not allowed", "NvlfabricDriver imex_modes: CliqueScoped",
                                        "recreate the ComputeDomain with imexMode CliqueScoped"], id="mode"),
    pytest.param(spec(), inv({}), "NoCliques", ["no node of this cluster is in an NVLink clique",
                                                "kubectl get nodes -L nvlfabric.io/clique"], id="no-cliques"),
    pytest.param(spec(placement={"clique": C}), inv({A: 18, B: 4}), "UnknownClique",
                 [f"placement.clique {C} is not a clique of this cluster", f"{A} (18 nodes), {B} (4 nodes)"],
                 id="unknown-clique"),
    pytest.param(spec(numNodes=72, placement={"scope": "MultiClique", "cliques": 4}), inv({A: 18, B: 18}),
                 "NotEnoughCliques", ["placement.cliques 4 needs 4 NVLink cliques; the cluster has 2"], id="cliques"),
    pytest.param(spec(numNodes=18), inv({A: 16, B: 4}), "TooManyNodes",
                 [f"numNodes 18 needs 18 nodes in one clique; the largest clique, {A}, has 16"], id="nodes"),
    pytest.param(spec(numNodes=8, placement={"clique": B}), inv({A: 16, B: 4}), "TooManyNodes",
                 [f"the largest allowed clique, {B}, has 4"], id="nodes-pinned"),
    pytest.param(spec(numNodes=36, placement={"scope": "MultiClique", "cliques": 2}), inv({A: 18, B: 17, C: 18}),
                 None, [], id="multi-nodes-fits"),
    pytest.param(spec(numNodes=36, placement={"scope": "MultiClique", "cliques": 2}), inv({A: 18, B: 17}),
                 "TooManyNodes", ["needs 18 nodes in each of 2 cliques (1 have that many)"], id="multi-nodes"),
    pytest.param(spec(), inv({A: 18, B: 18}, free={A: 0, B: 0}), "ChannelPoolExhausted",
                 [f"every channel of cliques {A}, {B} is allocated (4 per clique", "raise channels_per_clique"],
                 id="pool"),
    pytest.param(spec(placement={"clique": A}), inv({A: 18, B: 18}, free={A: 0}), "ChannelPoolExhausted",
                 [f"every channel of clique {A} is allocated"], id="pool-pinned"),
])
def test_an_unsatisfiable_domain_is_told_why_and_the_way_out(the_spec: api.ComputeDomainSpec, inventory: Inventory,
                                                            reason: str | None, words: list[str]) -> None:
    got = verdict(the_spec, inventory)
    if reason is None:  # the control case: three cliques, two of 18 nodes: it fits
        assert got is None
        return
    assert got is not None and got.reason == reason, got
    for w in words:
        assert w in got.message


def test_a_mode_verdict_fails_at_once_an_inventory_one_after_the_grace_and_a_full_pool_never() -> None:
    mode = verdict(spec(imexMode="Dedicated"), inv({A: 2}, modes=frozenset({api.IMEXMode.CLIQUE_SCOPED})))
    unknown = verdict(spec(placement={"clique": C}), inv({A: 2}))
    pool = verdict(spec(), inv({A: 2}, free={A: 0}))
    assert mode and unknown and pool
    grace = feasibility.INVENTORY_GRACE_S
    assert feasibility.phase_of(mode, 0) is api.Phase.FAILED
    assert feasibility.phase_of(unknown, grace - 1) is api.Phase.PENDING
    assert feasibility.phase_of(unknown, grace) is api.Phase.FAILED
    assert feasibility.phase_of(pool, 10 * grace) is api.Phase.PENDING


def test_the_summary_of_a_blocked_domain_carries_its_reason_until_it_has_a_channel() -> None:
    blocked = (api.Phase.FAILED, "UnknownClique", "placement.clique x is not a clique of this cluster")
    out = summarize(spec(), api.ComputeDomainStatus(), 3, None, blocked=blocked)
    ready = out["conditions"][0]
    assert (out["phase"], ready["reason"], ready["status"]) == ("Failed", "UnknownClique", "False")
    assert ready["message"] == blocked[2]
    # Once the claim has a channel the verdict no longer applies (the controller stops asking).
    out = summarize(spec(), api.ComputeDomainStatus(), 3, (A, 5), blocked=blocked)
    assert out["phase"] == "Allocating"


def test_free_channels_count_the_devices_claims_hold_per_clique() -> None:
    assert free_channels([(A, 1), (A, 2), (B, 1)], 4) == {A: 2, B: 3}
    assert free_channels([(A, n) for n in range(1, 9)], 4) == {A: 0}


def test_a_claim_of_many_channels_counts_each_of_them_and_exhausts_the_pool() -> None:
    """Issue 49: one hand-written claim holding 3 of a 4-channel pool left 3 free by the old count
    (one per claim): the domain waiting for a channel then read NoChannel, not ChannelPoolExhausted."""
    one_claim = [(A, 1), (A, 2), (A, 3)]  # the devices of a single claim's allocation
    assert free_channels([*one_claim, (A, 4)], 4) == {A: 0}
    why = verdict(spec(), Inventory(nodes={A: 2}, free_channels=free_channels([*one_claim, (A, 4)], 4),
                                    modes=frozenset(api.IMEXMode), channels_per_clique=4))
    assert why is not None and why.reason == "ChannelPoolExhausted", why


# -- the rule against the search it stands for ------------------------------------------------------

cliques = st.dictionaries(st.sampled_from([A, B, C, D]), st.integers(1, 18), max_size=4)


@st.composite
def cases(draw: st.DrawFn) -> tuple[api.ComputeDomainSpec, Inventory]:
    nodes = draw(cliques)
    free = draw(st.dictionaries(st.sampled_from(sorted(nodes) or [A]), st.integers(0, 2)))
    groups = draw(st.integers(1, 4))
    per = draw(st.integers(1, 18))
    raw: dict[str, Any] = {"numNodes": per * groups} if draw(st.booleans()) else {}
    if groups > 1:
        raw["placement"] = {"scope": "MultiClique", "cliques": groups}
    elif draw(st.booleans()):
        raw["placement"] = {"clique": draw(st.sampled_from([A, B, C, D, E]))}
    return spec(**raw), inv(nodes, free)


@given(cases())
def test_a_domain_is_judged_satisfiable_exactly_when_enough_distinct_cliques_have_the_nodes_and_a_channel(
        case: tuple[api.ComputeDomainSpec, Inventory]) -> None:
    s, inventory = case
    allowed = [c for c in inventory.nodes if s.placement.clique in (None, c)]
    need = (s.num_nodes or 0) // s.groups

    def fits(c: str) -> bool:
        return inventory.nodes[c] >= need and inventory.free_channels.get(c, inventory.channels_per_clique) > 0

    satisfiable = any(all(fits(c) for c in pick) for pick in itertools.combinations(allowed, s.groups))
    got = verdict(s, inventory)
    assert (got is None) == satisfiable, (got, inventory)
