"""The pure rules of channel reservation (nvlfabric/controller/reservationplan.py): which pods are
reserved ahead, how many, the domain's hold on its claim, the pioneer and whose gate lifts. The
passes that apply them: test_reservations.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.claimhold import hold_consumer, release_hold_patch
from nvlfabric.api.names import RESERVATION_GATE
from nvlfabric.controller import pools, reservationplan
from nvlfabric.controller.reservationplan import (
    ClaimState,
    PendingPod,
    claim_state,
    hold_change,
    pending_pod,
    pioneer,
    releasable,
    reservation_patch,
    to_reserve,
)


def _pod(name: str, *, claims: tuple[str, ...] = ("cd-channel",), ns: str = "default", **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", **extra.pop("meta", {})}
    spec = {"resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)],
            **extra.pop("spec", {})}
    return {"metadata": meta, "spec": spec, "status": extra.pop("status", {"phase": "Pending"})}


@pytest.mark.parametrize(("pod", "why"), [
    pytest.param(_pod("p", spec={"nodeName": "n1"}), "bound: the scheduler has reserved it", id="bound"),
    pytest.param(_pod("p", meta={"deletionTimestamp": "2026-11-29T12:00:00Z"}), "being deleted", id="deleting"),
    pytest.param(_pod("p", status={"phase": "Succeeded"}), "finished", id="done"),
    pytest.param(_pod("p", claims=()), "uses no named claim", id="no-claim"),
    pytest.param({"metadata": {"name": "p", "uid": "u"}, "spec": {"resourceClaims": [
        {"name": "c", "resourceClaimTemplateName": "t"}]}}, "per-pod claims are not shared", id="template-claim"),
])
def test_only_unbound_live_pods_that_name_a_claim_are_reserved_ahead(pod: dict[str, Any], why: str) -> None:
    assert pending_pod(pod) is None, why


pending_pods = st.lists(st.builds(
    PendingPod, namespace=st.sampled_from(["default", "other"]), name=st.text("abc", min_size=1, max_size=3),
    uid=st.text("uvwxyz", min_size=1, max_size=3),
    claims=st.frozensets(st.sampled_from(["cd-channel", "x-channel"]), max_size=2)), max_size=60)


@given(pending_pods, st.lists(st.text("uvwxyz", min_size=1, max_size=3), max_size=20, unique=True),
       st.integers(min_value=0, max_value=30))
def test_reservation_adds_each_waiting_user_of_the_claim_once_and_never_overfills(
        pods: list[PendingPod], reserved: list[str], limit: int) -> None:
    out = to_reserve("default", "cd-channel", reserved, pods, limit=limit)
    uids = [p.uid for p in out]
    assert len(uids) == len(set(uids)), "a pod reserved twice"
    assert not set(uids) & set(reserved), "a pod reserved again"
    assert all(p.namespace == "default" and "cd-channel" in p.claims for p in out)
    assert len(reserved) + len(out) <= max(limit, len(reserved))
    eligible = {p.uid for p in pods if p.namespace == "default" and "cd-channel" in p.claims} - set(reserved)
    assert len(out) == min(len(eligible), max(0, limit - len(reserved))), "room left but a waiting pod left out"
    test, *adds = reservation_patch("claim-uid", out)
    assert test == {"op": "test", "path": "/metadata/uid", "value": "claim-uid"}
    assert all(op["op"] == "add" and op["path"] == "/status/reservedFor/-" for op in adds)
    assert [op["value"]["uid"] for op in adds] == uids


def _claim(reserved: list[dict[str, str]], *, deleting: bool = False, owner: bool = True) -> dict[str, Any]:
    """A channel claim allocated from our pools, reserved for `reserved`."""
    meta: dict[str, Any] = {"name": "cd-channel", "namespace": "default", "uid": "claim-uid",
                            "labels": {names.COMPUTE_DOMAIN_LABEL: "cd"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "cd", "uid": "cd-uid",
                                    "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T12:00:00Z"
    return {"metadata": meta, "status": {"reservedFor": reserved, "allocation": {"devices": {"results": [
        {"driver": pools.DRIVER, "pool": "pool-x", "device": "channel-1", "request": "channel"}]}}}}


POD_ENTRY = {"resource": "pods", "name": "p0", "uid": "p0-uid"}
HOLD = hold_consumer("cd", "cd-uid")


@given(reserved=st.integers(0, 256), unreserved=st.integers(0, 300), adding=st.integers(0, 300),
       held=st.booleans(), deleting=st.booleans())
def test_the_domains_hold_never_takes_a_place_a_pod_needs_and_goes_with_the_claim(
        reserved: int, unreserved: int, adding: int, held: bool, deleting: bool) -> None:
    entries = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(reserved)]
    if held and entries:
        entries[0] = HOLD
    claim = claim_state(_claim(entries, deleting=deleting), pools.DRIVER)
    adding = min(adding, unreserved)
    add, release = hold_change(claim, unreserved, adding)
    assert not (add and release)
    if claim.hold_at is not None:
        assert not add
        assert release == (deleting or reserved + unreserved > reservationplan.MAX_RESERVED)
    else:
        assert not release
        # added only to a claim in use, with every waiting pod reserved and a place left beside them
        assert add == (reserved > 0 and not deleting and adding == unreserved
                       and reserved + adding < reservationplan.MAX_RESERVED)


def test_a_claim_of_no_domain_or_of_a_pod_group_gets_no_hold() -> None:
    assert hold_change(claim_state(_claim([POD_ENTRY], owner=False), pools.DRIVER), 0, 0) == (False, False)
    group = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g", "uid": "g-uid"}
    assert hold_change(claim_state(_claim([group]), pools.DRIVER), 0, 0) == (False, False)
    assert hold_change(claim_state(_claim([POD_ENTRY]), pools.DRIVER), 0, 0) == (True, False)


def test_the_hold_is_added_last_and_released_first_with_its_place_tested() -> None:
    claim = claim_state(_claim([HOLD, POD_ENTRY]), pools.DRIVER)
    assert claim.domain == ("cd", "cd-uid") and claim.hold_at == 0
    pod = PendingPod("default", "p1", "p1-uid", frozenset({"cd-channel"}))
    assert reservation_patch("claim-uid", [pod], hold=HOLD) == [
        {"op": "test", "path": "/metadata/uid", "value": "claim-uid"},
        {"op": "add", "path": "/status/reservedFor/-", "value": {"resource": "pods", "name": "p1", "uid": "p1-uid"}},
        {"op": "add", "path": "/status/reservedFor/-", "value": HOLD}]
    assert reservation_patch("claim-uid", [pod], release=(0, "cd-uid"))[:3] == [
        {"op": "test", "path": "/metadata/uid", "value": "claim-uid"},
        {"op": "test", "path": "/status/reservedFor/0/uid", "value": "cd-uid"},
        {"op": "remove", "path": "/status/reservedFor/0"}]
    assert release_hold_patch(_claim([POD_ENTRY, HOLD])) == [
        {"op": "test", "path": "/metadata/uid", "value": "claim-uid"},
        {"op": "test", "path": "/status/reservedFor/1/uid", "value": "cd-uid"},
        {"op": "remove", "path": "/status/reservedFor/1"}]
    assert release_hold_patch(_claim([POD_ENTRY])) is None


def _pp(name: str, *, gated: bool = True, created: str = "t1", claims: tuple[str, ...] = ("a",)) -> PendingPod:
    return PendingPod("default", name, f"uid-{name}", frozenset(claims), gated, created)


def test_the_pioneer_is_the_oldest_gated_pod_and_only_while_no_pod_is_ungated() -> None:
    assert pioneer([_pp("b", created="t2"), _pp("c", created="t1"), _pp("a", created="t3")]).name == "c"
    assert pioneer([_pp("b"), _pp("a")]).name == "a", "equal ages: by name"
    assert pioneer([_pp("b", created="t0"), _pp("x", gated=False)]) is None, "an ungated pod will allocate the claim"
    assert pioneer([]) is None


ALLOCATED = ClaimState("c-uid", ("uid-p",), allocated=True, ours=True)


@pytest.mark.parametrize(("claims", "pioneer_of", "release"), [
    pytest.param({"a": ALLOCATED}, frozenset(), True, id="reserved-on-its-channel-claim"),
    pytest.param({"a": ClaimState("c-uid", ("uid-x",), True, True)}, frozenset(), False, id="not-reserved-yet"),
    pytest.param({}, frozenset(), False, id="claim-missing"),
    pytest.param({"a": ClaimState("c-uid")}, frozenset(), False, id="unallocated-not-pioneer"),
    pytest.param({"a": ClaimState("c-uid")}, frozenset({"a"}), True, id="unallocated-pioneer"),
    pytest.param({"a": ClaimState("c-uid", (), True, False)}, frozenset(), True, id="another-drivers-claim"),
])
def test_a_gate_lifts_once_the_pod_is_reserved_on_each_channel_claim(
        claims: dict[str, ClaimState], pioneer_of: frozenset[str], release: bool) -> None:
    assert releasable(_pp("p"), claims, pioneer_of) is release


def test_a_pod_of_two_claims_waits_for_both() -> None:
    pod = _pp("p", claims=("a", "b"))
    assert not releasable(pod, {"a": ALLOCATED, "b": ClaimState("b-uid", (), True, True)})
    assert releasable(pod, {"a": ALLOCATED, "b": ClaimState("b-uid", ("uid-p",), True, True)})


def test_a_pending_pod_knows_whether_it_waits_for_the_reservation_gate() -> None:
    gated = pending_pod(_pod("p", spec={"schedulingGates": [{"name": "x/other"}, {"name": RESERVATION_GATE}]},
                             meta={"creationTimestamp": "2026-11-29T12:00:00Z"}))
    assert gated is not None and gated.gated and gated.created == "2026-11-29T12:00:00Z"
    other = pending_pod(_pod("p", spec={"schedulingGates": [{"name": "x/other"}]}))
    assert other is not None and not other.gated
