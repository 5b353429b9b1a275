"""What reservation keeps between passes (nvlfabric/controller/pendingpods.py,
reservationstate.py), fed as the informers feed it: the pending-pod index by claim, the claims a
pass is owed, and the reservations written here that wait for the claim watch."""

from __future__ import annotations

import time
from typing import Any

from nvlfabric.api.names import RESERVATION_GATE
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ClaimRecord, UnboundPod
from nvlfabric.controller.pendingpods import PendingPods
from nvlfabric.controller.reservationplan import PendingPod, pending_pod
from nvlfabric.controller.reservationstate import ReservationState


def _pod(name: str, claims: tuple[str, ...] = ("a",), *, gated: bool = True, rv: str = "1",
         group: str = "") -> UnboundPod:
    spec: dict[str, Any] = {"resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}
    if gated:
        spec["schedulingGates"] = [{"name": RESERVATION_GATE}]
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    raw = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv}, "spec": spec}
    return UnboundPod(rv, f"uid-{name}", pending_pod(raw))


def _claim(name: str, reserved: tuple[str, ...], rv: str = "1") -> ClaimRecord:
    raw = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv},
           "status": {"reservedFor": [{"resource": "pods", "name": u, "uid": u} for u in reserved],
                      "allocation": {"devices": {"results": [{"driver": pools.DRIVER, "pool": "clique-x.1",
                                                              "device": "channel-1"}]}}}}
    return ClaimRecord(rv, raw)


def test_the_index_finds_a_claims_users_and_forgets_a_pod_everywhere() -> None:
    index = PendingPods()
    both = PendingPod("ns", "p", "u1", frozenset({"a", "b"}), gated=True)
    index.remember(both, now=5.0)
    index.remember(PendingPod("ns", "q", "u2", frozenset({"a"})), now=6.0)
    assert {p.uid for p in index.users(("ns", "a"))} == {"u1", "u2"} and index.newest_user[("ns", "a")] == 6.0
    index.remember(both, now=9.0)
    assert index.newest_user[("ns", "b")] == 5.0, "a pod seen again is no new user"
    index.ungated([both])
    assert [p.gated for p in index.users(("ns", "b"))] == [False] and index.gated_claims() == set()
    index.forget("u1")
    assert index.users(("ns", "b")) == [] and [p.uid for p in index.users(("ns", "a"))] == ["u2"]


def test_every_watched_change_is_owed_a_pass_and_a_pod_group_pod_only_its_gate() -> None:
    state = ReservationState(pools.DRIVER)
    state.pod_changed("ADDED", ("ns", "p"), None, _pod("p", ("a", "b")))
    state.pod_changed("ADDED", ("ns", "g"), None, _pod("g", group="pg"))
    dirty, grouped = state.take()
    assert dirty == {("ns", "a"), ("ns", "b")} and [p.name for p in grouped] == ["g"]
    assert [p.uid for p in state.pods.users(("ns", "a"))] == ["uid-p"] and "uid-g" not in state.pods, \
        "Kubernetes places a pod group's pods: they are no claim's users here"
    state.pod_changed("DELETED", ("ns", "p"), _pod("p", ("a", "b")), None)
    assert state.pods.users(("ns", "a")) == [] and state.take() == (set(), [])


def test_a_reservation_written_here_waits_for_the_claim_watch_or_for_watch_seen_s() -> None:
    state = ReservationState(pools.DRIVER)
    state.pod_changed("ADDED", ("ns", "p"), None, _pod("p"))
    pod = state.pods.users(("ns", "a"))[0]
    with state.lock:
        state.expect(("ns", "a"), [pod])
        assert state.unseen_by_watch(pod, now=time.monotonic(), watch_seen_s=2.0), "its gate waits for the watch"
        assert not state.unseen_by_watch(pod, now=float("inf"), watch_seen_s=2.0), "but not for long"
    state.claim_changed("MODIFIED", ("ns", "a"), None, _claim("a", ("other",)))
    assert state.unseen, "the watch shows another pod's reservation only"
    state.claim_changed("MODIFIED", ("ns", "a"), None, _claim("a", ("uid-p",), rv="2"))
    assert not state.unseen and state.claims[("ns", "a")].reserved == ("uid-p",)
    with state.lock:
        state.expect(("ns", "a"), [pod])
    state.resync(watch_seen_s=0.0)
    assert not state.unseen, "a write the watch never shows is waited for no more"
    state.claim_changed("DELETED", ("ns", "a"), _claim("a", ()), None)
    assert ("ns", "a") not in state.claims
