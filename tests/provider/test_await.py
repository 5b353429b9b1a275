"""The await logic on its own: conditions, the readiness table, one deadline, and the messages.

Everything here is pure: observations are plain API dicts, time is a `ManualClock`, and a guard
makes any real `time.sleep` fail the test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from nvlfabric.api.errors import Forbidden, ServerError
from nvlfabric.provider import await_
from nvlfabric.provider.await_ import (
    AwaitFor,
    Condition,
    Deadline,
    ManualClock,
    Poll,
    Seen,
    Snapshot,
    all_of,
    readiness,
    retry,
    wait,
)
from nvlfabric.provider.errors import AwaitFailed, AwaitTimeout

CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(seconds: float) -> None:
        raise AssertionError(f"really slept {seconds}s")

    monkeypatch.setattr(time, "sleep", refuse)


# -- observations, as the API server returns them ------------------------------------------------------

CRD_OK = {"metadata": {"name": "computedomains.nvlfabric.io"},
          "status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                    {"type": "Established", "status": "True"}]}}
CRD_PENDING = {"metadata": {"name": "computedomains.nvlfabric.io"},
               "status": {"conditions": [{"type": "Established", "status": "False", "reason": "Installing",
                                          "message": "the initial names have not been accepted"}]}}


def cd(*, generation: int = 1, status: dict[str, Any] | None = None, deleting: bool = False,
       num_nodes: int | None = None, finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train", "namespace": "ml", "generation": generation, "uid": "u1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizers:
        meta["finalizers"] = finalizers
    spec: dict[str, Any] = {"imexMode": "CliqueScoped"}
    if num_nodes is not None:
        spec["numNodes"] = num_nodes
    return {"metadata": meta, "spec": spec, **({"status": status} if status is not None else {})}


def node(name: str, ready: bool, message: str | None = None) -> dict[str, Any]:
    return {"name": name, "ready": ready, **({"message": message} if message else {})}


def claim(*, allocated: bool = False, reserved: int = 0, deleting: bool = False,
          finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train-channel", "namespace": "ml"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizers:
        meta["finalizers"] = finalizers
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "channel", "driver": "channel.nvlfabric.io", "pool": f"clique-{CLIQUE}",
             "device": "channel-7"}]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": f"p{i}", "uid": str(i)} for i in range(reserved)]
    return {"metadata": meta, "status": status}


def snap(**kw: Any) -> Snapshot:
    kw.setdefault("crd", CRD_OK)
    return Snapshot(namespace="ml", name="train", claim_name="train-channel", **kw)


ALLOCATING = {"phase": "Allocating", "observedGeneration": 1, "clique": CLIQUE, "channel": 7,
              "nodes": [node("rack-0-node-01", True), node("rack-0-node-02", True), node("rack-0-node-03", True),
                        node("rack-0-node-07", False, "IMEX daemon not ready")]}
READY = {**ALLOCATING, "phase": "Ready", "nodes": [node(f"n{i}", True) for i in range(4)]}

# -- the readiness table -------------------------------------------------------------------------------

TABLE = [
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(), claim=claim()), True, False,
                 "ResourceClaim ml/train-channel exists", id="accepted"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(), claim=claim(), crd=None, crd_readable=False), True, False,
                 "ResourceClaim ml/train-channel exists", id="accepted-crd-unreadable"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(), claim=claim(), crd=None), False, False,
                 "CRD computedomains.nvlfabric.io is not installed (install nvlfabric's CRDs first)",
                 id="crd-missing"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(), claim=claim(), crd=CRD_PENDING), False, False,
                 "CRD computedomains.nvlfabric.io not established: the initial names have not been accepted",
                 id="crd-not-established"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=None, claim=None), False, False,
                 "ComputeDomain ml/train does not exist", id="cd-missing-first"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(), claim=None), False, False,
                 "ResourceClaim ml/train-channel does not exist", id="claim-missing"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(deleting=True), claim=claim()), False, True,
                 "ComputeDomain ml/train is being deleted", id="cd-being-deleted-is-fatal"),
    pytest.param(AwaitFor.ACCEPTED, snap(cd=cd(), claim=claim(deleting=True)), False, True,
                 "ResourceClaim ml/train-channel is being deleted", id="claim-being-deleted-is-fatal"),
    pytest.param(AwaitFor.READY, snap(cd=cd(), claim=claim()), False, False,
                 "status not reported yet; phase Pending (not reported yet); no member nodes reported yet; "
                 "claim ml/train-channel not allocated yet (no pod that uses it has been scheduled)",
                 id="no-status"),
    pytest.param(AwaitFor.READY, snap(cd=cd(status=ALLOCATING), claim=claim(allocated=True, reserved=4)),
                 False, False,
                 "phase Allocating; 3 of 4 nodes ready; node rack-0-node-07: IMEX daemon not ready; "
                 "claim ml/train-channel allocated (clique-9f410827-489f-46fd-8203-51266ca08eb7.32766/channel-7), "
                 "reserved for 4 pods",
                 id="allocating"),
    pytest.param(AwaitFor.READY, snap(cd=cd(generation=2, status=READY), claim=claim(allocated=True, reserved=1)),
                 False, False,
                 "status is for generation 1, the spec is at generation 2; phase Ready; 4 of 4 nodes ready; "
                 "claim ml/train-channel allocated (clique-9f410827-489f-46fd-8203-51266ca08eb7.32766/channel-7), "
                 "reserved for 1 pod",
                 id="ready-but-stale-generation"),
    pytest.param(AwaitFor.READY, snap(cd=cd(num_nodes=6, status={**ALLOCATING, "phase": "Degraded"}),
                                      claim=claim(allocated=True)), False, False,
                 "phase Degraded; 3 of 4 nodes ready (numNodes 6); node rack-0-node-07: IMEX daemon not ready; "
                 "claim ml/train-channel allocated (clique-9f410827-489f-46fd-8203-51266ca08eb7.32766/channel-7), "
                 "reserved for 0 pods",
                 id="degraded-short-of-numNodes"),
    pytest.param(AwaitFor.READY, snap(cd=cd(status={"phase": "Allocating", "observedGeneration": 1,
                                                    "readyNodes": 1, "totalNodes": 2}), claim=claim()),
                 False, False,
                 "phase Allocating; 1 of 2 nodes ready; claim ml/train-channel not allocated yet (no pod that uses "
                 "it has been scheduled)", id="summary-counts-only"),
    pytest.param(AwaitFor.READY, snap(cd=cd(status=READY), claim=claim(allocated=True, reserved=4)), True, False,
                 "phase Ready; 4 of 4 nodes ready; claim ml/train-channel allocated "
                 "(clique-9f410827-489f-46fd-8203-51266ca08eb7.32766/channel-7), reserved for 4 pods", id="ready"),
    pytest.param(AwaitFor.READY, snap(cd=cd(status={"phase": "Failed", "observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "False", "reason": "NoSuchClique", "message": "clique x does not exist"}]}),
        claim=claim()), False, True, "phase Failed: clique x does not exist", id="failed-is-fatal"),
    pytest.param(AwaitFor.READY, snap(cd=cd(generation=2, status={"phase": "Failed", "observedGeneration": 1}),
                                      claim=claim()), False, False,
                 "status is for generation 1, the spec is at generation 2; phase Failed; no member nodes reported "
                 "yet; claim ml/train-channel not allocated yet (no pod that uses it has been scheduled)",
                 id="failed-for-an-older-spec-is-not-fatal"),
]


@pytest.mark.parametrize(("level", "observed", "ok", "fatal", "detail"), TABLE)
def test_readiness_table(level: AwaitFor, observed: Snapshot, ok: bool, fatal: bool, detail: str) -> None:
    seen = readiness(level)(observed)
    assert (seen.ok, seen.fatal, seen.detail) == (ok, fatal, detail)


def test_every_level_has_an_entry_and_none_waits_for_nothing() -> None:
    assert set(await_.READINESS) == set(AwaitFor)
    assert await_.READINESS[AwaitFor.NONE] == ()
    assert readiness(AwaitFor.NONE)(snap()).ok
    # Ready is Accepted plus more, in order.
    assert await_.READINESS[AwaitFor.READY][: len(await_.READINESS[AwaitFor.ACCEPTED])] == \
        await_.READINESS[AwaitFor.ACCEPTED]


def test_awaited_names_the_object_and_the_level() -> None:
    assert await_.awaited(snap(), AwaitFor.READY) == "ComputeDomain ml/train to be Ready"
    assert await_.awaited_deletion(snap()) == \
        "ComputeDomain ml/train and its ResourceClaim ml/train-channel to be deleted"


# -- composing conditions ------------------------------------------------------------------------------


def _const(name: str, ok: bool) -> Condition[int]:
    return Condition(name, lambda _: Seen(ok, f"{name} {'met' if ok else 'unmet'}"))


def test_all_of_reports_the_first_unmet_condition_in_order() -> None:
    cond = all_of(_const("a", True), _const("b", False), _const("c", False))
    assert cond.name == "a and b and c"
    assert cond(0) == Seen(False, "b unmet")
    assert all_of(_const("a", True), _const("b", True))(0) == Seen(True, "b met")


# -- wait: one deadline, back-off, messages ------------------------------------------------------------


def _sequence(*observations: Snapshot) -> Iterator[Snapshot]:
    yield from observations
    while True:
        yield observations[-1]


def test_wait_returns_at_once_when_satisfied() -> None:
    clock = ManualClock()
    got = wait(awaited="x", observe=lambda: snap(cd=cd(), claim=claim()), condition=readiness(AwaitFor.ACCEPTED),
               deadline=Deadline.after(30, clock=clock))
    assert got.cd is not None and clock.sleeps == []


def test_wait_backs_off_and_stops_at_the_deadline() -> None:
    clock = ManualClock()
    deadline = Deadline.after(5, clock=clock)
    observed = iter(_sequence(snap(cd=cd(status=ALLOCATING), claim=claim(allocated=True, reserved=4))))
    with pytest.raises(AwaitTimeout) as exc:
        wait(awaited="ComputeDomain ml/train to be Ready", observe=lambda: next(observed),
             condition=readiness(AwaitFor.READY), deadline=deadline, poll=Poll(initial_s=0.5, max_s=2, factor=2),
             hint="raise timeout_s")
    assert clock.sleeps == [0.5, 1.0, 2.0, 1.5]  # the last sleep is cut to the time that is left
    assert clock.now == 5
    assert str(exc.value) == (
        "timed out after 5s waiting for ComputeDomain ml/train to be Ready: phase Allocating; 3 of 4 nodes ready; "
        "node rack-0-node-07: IMEX daemon not ready; claim ml/train-channel allocated "
        "(clique-9f410827-489f-46fd-8203-51266ca08eb7.32766/channel-7), reserved for 4 pods (raise timeout_s)")
    assert exc.value.awaited == "ComputeDomain ml/train to be Ready"
    assert exc.value.seen.startswith("phase Allocating; 3 of 4 nodes ready")
    assert isinstance(exc.value.last, Snapshot) and exc.value.timeout_s == 5


def test_the_deadline_is_shared_not_restarted() -> None:
    clock = ManualClock()
    deadline = Deadline.after(10, clock=clock)
    clock.now = 9.5  # the caller already spent most of it (e.g. creating objects)
    with pytest.raises(AwaitTimeout):
        wait(awaited="x", observe=lambda: snap(), condition=_const("never", False), deadline=deadline)
    assert clock.sleeps == [0.25, 0.25]
    assert clock.now == 10


def test_wait_sees_the_world_change_while_it_sleeps() -> None:
    world = {"status": ALLOCATING}
    clock = ManualClock(on_sleep=lambda i: world.update(status=READY) if i == 2 else None)
    got = wait(awaited="x", observe=lambda: snap(cd=cd(status=world["status"]), claim=claim(allocated=True)),
               condition=readiness(AwaitFor.READY), deadline=Deadline.after(60, clock=clock))
    assert got.cd is not None and got.cd["status"]["phase"] == "Ready"
    assert len(clock.sleeps) == 3


def test_fatal_conditions_end_the_wait_at_once() -> None:
    clock = ManualClock()
    with pytest.raises(AwaitFailed) as exc:
        wait(awaited="ComputeDomain ml/train to be Accepted", observe=lambda: snap(cd=cd(deleting=True)),
             condition=readiness(AwaitFor.ACCEPTED), deadline=Deadline.after(60, clock=clock))
    assert str(exc.value) == ("gave up waiting for ComputeDomain ml/train to be Accepted: "
                              "ComputeDomain ml/train is being deleted")
    assert clock.sleeps == []


def test_temporary_errors_are_retried_and_reported_if_they_last() -> None:
    clock = ManualClock()
    calls = {"n": 0}

    def flaky() -> Snapshot:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ServerError(action="read ComputeDomain ml/train", code=503, reason="ServiceUnavailable",
                              message="etcd leader changed")
        return snap(cd=cd(), claim=claim())

    assert wait(awaited="x", observe=flaky, condition=readiness(AwaitFor.ACCEPTED),
                deadline=Deadline.after(60, clock=clock)).cd is not None
    assert calls["n"] == 3

    def down() -> Snapshot:
        raise ServerError(action="read ComputeDomain ml/train", code=503, reason="ServiceUnavailable",
                          message="etcd leader changed")

    with pytest.raises(AwaitTimeout) as exc:
        wait(awaited="x", observe=down, condition=readiness(AwaitFor.ACCEPTED), deadline=Deadline.after(1, clock=clock))
    assert exc.value.seen == ("could not observe: read ComputeDomain ml/train: etcd leader changed "
                              "(503 ServiceUnavailable)")


def test_permanent_errors_end_the_wait() -> None:
    def forbidden() -> Snapshot:
        raise Forbidden(action="read ComputeDomain ml/train", code=403, reason="Forbidden", message="no")

    clock = ManualClock()
    with pytest.raises(Forbidden):
        wait(awaited="x", observe=forbidden, condition=readiness(AwaitFor.ACCEPTED),
             deadline=Deadline.after(60, clock=clock))
    assert clock.sleeps == []


def test_progress_is_reported_when_what_is_seen_changes() -> None:
    states = iter([ALLOCATING, ALLOCATING, {**ALLOCATING, "nodes": READY["nodes"]}, READY])
    lines: list[str] = []
    wait(awaited="ComputeDomain ml/train to be Ready", observe=lambda: snap(cd=cd(status=next(states)), claim=claim()),
         condition=readiness(AwaitFor.READY), deadline=Deadline.after(60, clock=ManualClock()),
         on_progress=lines.append)
    assert len(lines) == 2
    assert lines[0].startswith("waiting for ComputeDomain ml/train to be Ready: phase Allocating; 3 of 4 nodes ready")
    assert "4 of 4 nodes ready" in lines[1]


def _unavailable(delay_s: float | None = None) -> ServerError:
    return ServerError(action="create ComputeDomain ml/train", code=503, reason="ServiceUnavailable",
                       message="etcd leader changed", delay_s=delay_s)


def test_retry_backs_off_as_wait_does_and_takes_the_servers_delay() -> None:
    clock = ManualClock()
    lines: list[str] = []
    failures = iter([_unavailable(), _unavailable(delay_s=3.0), _unavailable()])

    def flaky() -> str:
        for exc in failures:
            raise exc
        return "made"

    assert retry(flaky, deadline=Deadline.after(60, clock=clock), poll=Poll(initial_s=0.5, max_s=2, factor=2),
                 on_progress=lines.append) == "made"
    assert clock.sleeps == [0.5, 3.0, 2.0]  # the back-off goes on beneath the server's Retry-After
    assert lines == ["create ComputeDomain ml/train: etcd leader changed (503 ServiceUnavailable); trying again "
                     "until the timeout (60 s)"]  # once per kind of failure, not every try


def test_retry_raises_the_last_temporary_error_at_the_deadline_and_a_permanent_one_at_once() -> None:
    clock = ManualClock()

    def down() -> str:
        raise _unavailable()

    with pytest.raises(ServerError):
        retry(down, deadline=Deadline.after(1, clock=clock))
    assert clock.now == 1 and sum(clock.sleeps) == 1

    def forbidden() -> str:
        raise Forbidden(action="create ComputeDomain ml/train", code=403, reason="Forbidden", message="no")

    clock = ManualClock()
    with pytest.raises(Forbidden):
        retry(forbidden, deadline=Deadline.after(60, clock=clock))
    assert clock.sleeps == []


def test_a_verdict_can_end_the_wait_with_its_own_error_and_word_its_own_progress() -> None:
    looks = iter([("", False), ("2 departing", False), ("2 departing", False), ("one stays", True)])
    lines: list[str] = []

    def check(look: tuple[str, bool]) -> Seen:
        line, refused = look
        if refused:
            return Seen(False, "refused", fatal=True, error=KeyError("in use"))
        return Seen(False, "waiting", progress=line)

    with pytest.raises(KeyError):
        wait(awaited="x", observe=lambda: next(looks), condition=Condition("c", check),
             deadline=Deadline.after(60, clock=ManualClock()), on_progress=lines.append)
    assert lines == ["2 departing"]  # "" says nothing; a line already said is not said again


def test_a_wait_can_leave_temporary_errors_to_its_caller() -> None:
    def down() -> Snapshot:
        raise _unavailable()

    clock = ManualClock()
    with pytest.raises(ServerError):
        wait(awaited="x", observe=down, condition=readiness(AwaitFor.ACCEPTED),
             deadline=Deadline.after(60, clock=clock), retried=())
    assert clock.sleeps == []


def test_the_system_clock_really_moves() -> None:
    clock = await_.SystemClock()
    before = clock.monotonic()
    assert clock.monotonic() >= before
    assert Deadline.after(60).remaining() > 59 and not Deadline.after(60).expired()


# -- deletion --------------------------------------------------------------------------------------------


DELETION = [
    pytest.param(snap(), False, True, "both are gone", id="gone"),
    pytest.param(snap(cd=cd()), False, False, "ComputeDomain ml/train is not marked for deletion yet", id="not-yet"),
    pytest.param(snap(cd=cd(deleting=True, finalizers=["example.com/hold", "example.com/audit"])), False, False,
                 "ComputeDomain ml/train is marked for deletion but still has finalizers example.com/hold, "
                 "example.com/audit (the controllers that set them must remove them; remove them by hand only if "
                 "those controllers are gone)", id="finalizers-named"),
    pytest.param(snap(claim=claim(deleting=True)), False, False,
                 "ResourceClaim ml/train-channel is marked for deletion", id="claim-going"),
    pytest.param(snap(claim=claim(deleting=True, finalizers=["resource.kubernetes.io/delete-protection"])), True,
                 True, "both are gone", id="forced-claim-may-linger"),
    pytest.param(snap(claim=claim()), True, False, "ResourceClaim ml/train-channel is not marked for deletion yet",
                 id="forced-claim-must-be-deleting"),
]


@pytest.mark.parametrize(("observed", "linger", "ok", "detail"), DELETION)
def test_deleted(observed: Snapshot, linger: bool, ok: bool, detail: str) -> None:
    seen = await_.deleted(claim_may_linger=linger)(observed)
    assert (seen.ok, seen.detail) == (ok, detail)
