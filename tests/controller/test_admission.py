"""nvlfabric's Kueue admission check, its pure parts (nvlfabric/controller/admission.py): which
workloads it judges, the groups it reads from their pod sets, and what it answers; BoundJob's
`queue_name`. End to end with the real Kueue: tests/e2e/test_kueue_on_sim.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from nvlfabric.api.names import CLIQUE_LABEL, KUEUE_QUEUE_LABEL
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.controller import placement
from nvlfabric.controller.admission import check_patch, groups_of, judge, pending_check
from nvlfabric.controller.reservationplan import ADMITTED_HOLD_S, stale_admissions

TEMPLATE = {"spec": {"containers": [{"name": "w", "image": "i"}]}}


def _workload(*conditions: str, check: str = "Pending", pod_sets: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    return {"metadata": {"name": "jobset-train-1a2b3", "namespace": "ml"},
            "spec": {"podSets": pod_sets or []},
            "status": {"conditions": [{"type": c, "status": "True"} for c in conditions],
                       "admissionChecks": [{"name": "other", "state": "Pending"},
                                           {"name": "nvlfabric-placement", "state": check}]}}


def _pod_set(name: str, claim: str, count: int, gpus: int = 4) -> dict[str, Any]:
    return {"name": name, "count": count, "template": {"spec": {
        "resourceClaims": [{"name": "channel", "resourceClaimName": claim}],
        "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}


@pytest.mark.parametrize(("conditions", "state", "judged"), [
    ((), "Pending", False),  # no quota yet: Kueue has not chosen it
    (("QuotaReserved",), "Pending", True),
    (("QuotaReserved",), "Ready", False),  # answered already
    (("QuotaReserved",), "Retry", False),  # Kueue is requeueing it
    (("QuotaReserved", "Admitted"), "Pending", False),
])
def test_only_a_workload_with_quota_and_our_check_pending_is_judged(
        conditions: tuple[str, ...], state: str, judged: bool) -> None:
    wl = _workload(*conditions, check=state)
    assert pending_check(wl, {"nvlfabric-placement"}) == ("nvlfabric-placement" if judged else None)
    assert pending_check(wl, {"someone-else"}) is None


def test_each_pod_set_naming_a_channel_claim_is_a_group() -> None:
    wl = _workload("QuotaReserved", pod_sets=[
        _pod_set("workers-0", "big-channel-0", 2), _pod_set("workers-1", "big-channel-1", 2),
        {"name": "launcher", "count": 1, "template": {"spec": {"containers": [{"name": "l"}]}}}])
    groups, _ = groups_of(wl, lambda ns, claim: claim.startswith("big-channel"))
    assert groups == [("workers-0", placement.Group(("ml", "big-channel-0"), 2, 4)),
                      ("workers-1", placement.Group(("ml", "big-channel-1"), 2, 4))]


def test_placed_is_ready_with_each_pod_sets_clique_and_no_room_is_retry() -> None:
    groups = [("workers-0", placement.Group(("ml", "c-0"), 2, 4)), ("workers-1", placement.Group(("ml", "c-1"), 2, 4))]
    ready = judge(groups, {("ml", "c-0"): "A.1", ("ml", "c-1"): "B.1"})
    assert ready.state == "Ready" and ready.node_selectors == {"workers-0": {CLIQUE_LABEL: "A.1"},
                                                               "workers-1": {CLIQUE_LABEL: "B.1"}}
    no_room = placement.NoRoom(groups[1][1], "A.1", 1, groups=2, fitted=1)
    retry = judge(groups, no_room)
    assert retry.state == "Retry" and "2 cliques with room, 1 have it" in retry.message
    assert "quota is free for others" in retry.message
    assert judge(groups, "channel claim ml/c-1 does not exist (yet)").state == "Pending"
    assert judge([], {}).state == "Ready"  # nothing of nvlfabric's in it


def test_the_state_is_applied_as_this_checks_entry_alone() -> None:
    wl = _workload("QuotaReserved")
    body = check_patch(wl, "nvlfabric-placement", judge(
        [("workers-0", placement.Group(("ml", "c-0"), 2, 4))], {("ml", "c-0"): "A.1"}),
        datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    assert body["metadata"] == {"name": "jobset-train-1a2b3", "namespace": "ml"}
    (entry,) = body["status"]["admissionChecks"]
    assert entry == {"name": "nvlfabric-placement", "state": "Ready", "message": "placed by nvlfabric: workers-0 in "
                     "clique A.1", "lastTransitionTime": "2026-12-03T12:00:00Z",
                     "podSetUpdates": [{"name": "workers-0", "nodeSelector": {CLIQUE_LABEL: "A.1"}}]}


def test_queue_name_labels_the_job_or_jobset_for_kueue() -> None:
    job = workload_manifests(BoundJobArgs(name="train", pod_template=TEMPLATE, queue_name="team-a"),
                             namespace="ml", claim_name="c", domain="cd")
    assert [o["kind"] for o in job] == ["Service", "Job"]
    assert job[1]["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert KUEUE_QUEUE_LABEL not in job[0]["metadata"]["labels"]  # the Service is not queued
    assert "suspend" not in job[1]["spec"]  # Kueue's webhook suspends it; a suspend of ours would fight Kueue
    js = workload_manifests(BoundJobArgs(name="train", kind="JobSet", pod_template=TEMPLATE, clique_groups=2,
                                         parallelism=4, queue_name="team-a"),
                            namespace="ml", claim_name="c-0", domain="cd", claims=["c-0", "c-1"])
    assert [o["kind"] for o in js] == ["JobSet"] and js[0]["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"queue_name": "Team_A"}, "String should match pattern"),
    ({"queue_name": "team-a", "kind": "StatefulSet"}, "Kueue queues a StatefulSet only through its pod integration"),
    ({"queue_name": "team-a", "clique_groups": 2, "parallelism": 2}, "needs kind JobSet"),
])
def test_a_queue_kueue_cannot_use_is_refused_naming_the_way(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        BoundJobArgs(name="train", pod_template=TEMPLATE, **kwargs)


def test_a_group_placed_at_admission_holds_its_room_until_its_pods_come_or_for_a_while() -> None:
    held = placement.Reserved("A.1", 2, 4)
    admitted = {("ml", "waiting"): (held, 100.0), ("ml", "came"): (held, 100.0), ("ml", "gone"): (held, 0.0)}
    assert sorted(stale_admissions(admitted, [("ml", "came")], now=ADMITTED_HOLD_S + 50.0)) == [
        ("ml", "came"), ("ml", "gone")]


def test_a_workload_without_room_backs_off_until_room_is_given_back() -> None:
    from nvlfabric.controller.admission import RETRY_MAX_S, frees_room, retry_after_s
    from nvlfabric.controller.cache import ClaimRecord

    assert [retry_after_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, RETRY_MAX_S, RETRY_MAX_S]
    # Bound pods as the informer keeps them: (node, GPUs, finished).
    assert frees_room(("n1", 4, False), None), "a pod gone gives its GPUs back"
    assert frees_room(("n1", 4, False), ("n1", 4, True)), "so does one that finished"
    assert not frees_room(None, ("n1", 4, False)), "a new pod takes room, it gives none"
    assert not frees_room(("n1", 4, False), ("n1", 4, False))
    allocated, free = ClaimRecord("1", {}, ("c.1", 5)), ClaimRecord("2", {}, None)
    assert frees_room(allocated, free) and frees_room(allocated, None), "a channel back in the pool"
    assert not frees_room(free, allocated)
