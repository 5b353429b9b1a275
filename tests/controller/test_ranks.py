"""The ranks the controller writes on a multi-clique job's pods: every pod one, 0..world size - 1."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.api import names
from nvlfabric.controller.reservationplan import PendingPod, job_rank, ungate_patch


def meta(group: int, size: int, index: int, **extra: str) -> dict[str, object]:
    return {"annotations": {names.CLIQUE_GROUP_ANNOTATION: str(group), names.GROUP_SIZE_ANNOTATION: str(size),
                            names.JOB_COMPLETION_INDEX: str(index), **extra}}


@given(st.integers(1, 16), st.integers(1, 72))
def test_every_pod_of_the_job_gets_its_own_rank(groups: int, size: int) -> None:
    ranks = [job_rank(meta(g, size, i)) for g in range(groups) for i in range(size)]
    assert sorted(r for r in ranks if r is not None) == list(range(groups * size))


def test_no_rank_is_written_twice_nor_made_up() -> None:
    assert job_rank(meta(1, 4, 2, **{names.RANK_ANNOTATION: "6"})) is None  # written already
    assert job_rank({"annotations": {names.GROUP_SIZE_ANNOTATION: "4"}}) is None  # not a multi-clique pod
    assert job_rank(meta(1, 4, 4)) is None and job_rank(meta(1, 0, 0)) is None  # an index outside its group
    ss = {"annotations": {names.CLIQUE_GROUP_ANNOTATION: "2", names.GROUP_SIZE_ANNOTATION: "18"},
          "labels": {names.STATEFULSET_POD_INDEX: "5"}}
    assert job_rank(ss) == 41


def test_the_ungate_patch_carries_the_rank_and_the_pioneers_clique() -> None:
    pod = PendingPod("ns", "p", "u", frozenset({"c"}), gated=True, rank=9)
    patch = ungate_patch(pod, "clique.1")
    assert patch["metadata"] == {"annotations": {names.RANK_ANNOTATION: "9"}}
    assert patch["spec"]["nodeSelector"] == {names.CLIQUE_LABEL: "clique.1"}
    plain = ungate_patch(PendingPod("ns", "q", "v", frozenset({"c"}), gated=True), None)
    assert "metadata" not in plain and "nodeSelector" not in plain["spec"]
