"""The node agent's checkpoint: states, the on-disk format, its versions, and surviving bad files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nvlfabric.nodeagent import checkpoint as ckpt
from nvlfabric.nodeagent.checkpoint import Allocation, Checkpoint, ClaimRef, ClaimState, LoadStatus

FIXTURES = Path(__file__).parent / "fixtures"
BOOT = "0f3c5e5a-6d2b-4f0e-9c1a-2b7d8e9f0a11"
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def checksum(obj: dict[str, Any]) -> str:
    """The checksum as the module docstring specifies it, computed independently of the module."""
    body = {k: v for k, v in obj.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def write_obj(path: Path, obj: dict[str, Any], *, fix_checksum: bool = True) -> None:
    if fix_checksum:
        obj = {**obj, "checksum": checksum(obj)}
    path.write_text(json.dumps(obj, indent=2))


@pytest.fixture
def boot_id_file(tmp_path: Path) -> Path:
    path = tmp_path / "boot_id"
    path.write_text(BOOT + "\n")
    return path


@pytest.fixture
def cp_path(tmp_path: Path) -> Path:
    return tmp_path / "plugin" / "checkpoint.json"


def ref(uid: str = "claim-1") -> ClaimRef:
    return ClaimRef(uid=uid, namespace="ns", name=f"{uid}-name")


def alloc(*channels: int, cd: str = "cd-a") -> Allocation:
    return Allocation(compute_domain_uid=f"{cd}-uid", compute_domain_name=cd, channels=channels or (1,),
                      imex_domain_id="clique-0")


def sample() -> Checkpoint:
    cp = Checkpoint.empty(BOOT)
    cp = ckpt.start_prepare(cp, ref("a"), alloc(3), now=T0)
    cp = ckpt.complete_prepare(cp, "a", cdi_spec_file="/var/run/cdi/a.json",
                               cdi_device_ids=["k8s.channel.nvlfabric.io/claim=a-channel-3"], now=T0 + timedelta(1))
    cp = ckpt.start_prepare(cp, ref("b"), alloc(4, 5, cd="cd-b"), now=T0)
    cp = ckpt.start_prepare(cp, ref("c"), alloc(9, cd="cd-c"), now=T0)
    return ckpt.abort(cp, "c", now=T0 + timedelta(seconds=3))


# ----------------------------------------------------------------------------------------------
# Round trips and the v1 format


def test_save_then_load_returns_the_same_checkpoint(cp_path: Path, boot_id_file: Path) -> None:
    cp = sample()
    ckpt.save(cp_path, cp)
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert report.status is LoadStatus.LOADED and report.ok
    assert loaded == cp
    assert ckpt.encode(loaded) == cp_path.read_text()


def test_a_missing_file_is_an_empty_checkpoint_for_this_boot(cp_path: Path, boot_id_file: Path) -> None:
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert loaded == Checkpoint.empty(BOOT)
    assert report.status is LoadStatus.MISSING and report.ok and str(cp_path) in str(report)


def test_the_file_is_the_documented_v1_json(cp_path: Path) -> None:
    ckpt.save(cp_path, sample())
    obj = json.loads(cp_path.read_text())
    assert obj["version"] == "v1" and obj["bootId"] == BOOT
    assert obj["checksum"] == checksum(obj)
    assert sorted(obj["claims"]) == ["a", "b", "c"]
    a = obj["claims"]["a"]
    assert a["state"] == "PrepareCompleted" and a["channels"] == [3]
    assert a["computeDomain"] == {"uid": "cd-a-uid", "name": "cd-a"}
    assert a["cdi"] == {"specFile": "/var/run/cdi/a.json", "deviceIds": ["k8s.channel.nvlfabric.io/claim=a-channel-3"]}
    # empty optional fields are omitted, so adding optional fields later never changes old files
    assert "cdi" not in obj["claims"]["b"] and "completedAt" not in obj["claims"]["b"]
    assert obj["claims"]["c"]["abortedAt"].startswith("2026-03-01T10:00:03")


def test_a_hand_written_v1_file_loads(cp_path: Path, boot_id_file: Path) -> None:
    # Regression guard for the compatibility policy: every later agent must read this v1 file.
    cp_path.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "checkpoint-v1.json", cp_path)
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert report.status is LoadStatus.LOADED, report.message
    assert report.file_version == "v1" and not report.skipped_entries
    done = loaded.get("2f1d0c4e-9b8a-4c3d-8e7f-6a5b4c3d2e1f")
    assert done is not None and done.state is ClaimState.PREPARE_COMPLETED
    assert done.claim == ClaimRef(uid="2f1d0c4e-9b8a-4c3d-8e7f-6a5b4c3d2e1f", namespace="training",
                                  name="llm-cd-channel")
    assert done.allocation.channels == (5,) and done.allocation.compute_domain_name == "llm-cd"
    assert done.cdi_device_ids == ("k8s.channel.nvlfabric.io/claim=2f1d0c4e-9b8a-4c3d-8e7f-6a5b4c3d2e1f-channel-5",)
    assert done.completed_at == datetime(2026, 3, 1, 10, 0, 1, 250000, tzinfo=UTC)
    started = loaded.get("9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b")
    assert started is not None and started.state is ClaimState.PREPARE_STARTED
    assert started.allocation.channels == (12, 13)
    aborted = loaded.get("c0ffee00-1111-4222-8333-444455556666")
    assert aborted is not None and aborted.expires_at() == datetime(2026, 3, 1, 10, 8, 10, tzinfo=UTC)


def test_unknown_fields_in_our_own_file_are_ignored(cp_path: Path, boot_id_file: Path) -> None:
    # A newer agent added fields (top level, per claim, nested); after a downgrade they must not cost claims.
    ckpt.save(cp_path, sample())
    obj = json.loads(cp_path.read_text())
    obj["nodeName"] = "gb200-r0-n3"
    obj["claims"]["a"]["healthCheckedAt"] = "2026-03-01T11:00:00Z"
    obj["claims"]["a"]["computeDomain"]["namespace"] = "ns"
    obj["claims"]["a"]["cdi"]["commonSpec"] = "x.json"
    write_obj(cp_path, obj)
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert report.status is LoadStatus.LOADED and not report.skipped_entries
    assert loaded == sample()


def test_an_entry_that_does_not_decode_is_skipped_and_the_rest_kept(cp_path: Path, boot_id_file: Path) -> None:
    ckpt.save(cp_path, sample())
    obj = json.loads(cp_path.read_text())
    obj["claims"]["b"]["state"] = "PrepareFrozen"  # a state a future agent might invent
    obj["claims"]["c"] = "not an object"
    write_obj(cp_path, obj)
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert report.status is LoadStatus.LOADED
    assert [e.uid for e in loaded.claims] == ["a"]
    assert [uid for uid, _ in report.skipped_entries] == ["b", "c"]
    assert "PrepareFrozen" in report.message


def test_allocation_mode_all_is_recorded_and_the_old_every_channel_form_recognised(cp_path: Path,
                                                                                    boot_id_file: Path) -> None:
    """Issue 49: an All claim holds its own channel, marked `channelAllocationMode: All` (an optional
    v1 field: Single entries are written as before); the form agents before it wrote (channels
    0..2047, no mode) still loads, and is recognised so the agent can narrow it; a mode this agent
    does not know skips the entry, like an unknown state."""
    own = Allocation(compute_domain_uid="cd-a-uid", compute_domain_name="cd-a", channels=(7,),
                     imex_domain_id="cd-cd-a-uid", device="clique-x.1/channel-7", all_channels=True)
    cp = ckpt.start_prepare(sample(), ref("d"), own, now=T0)
    ckpt.save(cp_path, cp)
    obj = json.loads(cp_path.read_text())
    assert obj["claims"]["d"]["channelAllocationMode"] == "All" and obj["claims"]["d"]["channels"] == [7]
    assert all("channelAllocationMode" not in obj["claims"][u] for u in ("a", "b", "c"))
    loaded, _ = ckpt.load(cp_path, boot_id_file)
    assert loaded == cp and not own.every_channel_of_the_node and not alloc(3).all_channels

    del obj["claims"]["d"]["channelAllocationMode"]
    obj["claims"]["d"]["channels"] = list(range(2048))
    obj["claims"]["a"]["channelAllocationMode"] = "Some"
    write_obj(cp_path, obj)
    loaded, report = ckpt.load(cp_path, boot_id_file)
    old = loaded.get("d")
    assert old is not None and old.allocation.every_channel_of_the_node and not old.allocation.all_channels
    assert [uid for uid, _ in report.skipped_entries] == ["a"] and "Some" in report.message
    narrowed = ckpt.rewrite(loaded, dataclasses.replace(old, allocation=own))
    assert narrowed.get("d") == dataclasses.replace(old, allocation=own)
    with pytest.raises(ckpt.InvalidTransition):
        ckpt.rewrite(loaded, dataclasses.replace(old, state=ClaimState.PREPARE_COMPLETED, completed_at=T0))


# ----------------------------------------------------------------------------------------------
# Bad files: reported, moved aside, never fatal


@dataclass(frozen=True)
class Damage:
    name: str
    apply: Callable[[Path], None]
    status: LoadStatus
    says: str


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _garble(p: Path) -> None:
    p.write_bytes(b"\x00\xff\xfe garbage \x81" * 10)


def _edit_without_checksum(p: Path) -> None:
    obj = json.loads(p.read_text())
    obj["claims"]["a"]["channels"] = [4]
    write_obj(p, obj, fix_checksum=False)


def _drop_checksum(p: Path) -> None:
    obj = json.loads(p.read_text())
    del obj["checksum"]
    write_obj(p, obj, fix_checksum=False)


def _future_version(p: Path) -> None:
    obj = json.loads(p.read_text())
    obj["version"] = "v9"
    write_obj(p, obj)


def _not_an_object(p: Path) -> None:
    p.write_text("[1, 2, 3]")


def _wrong_types_with_good_checksum(p: Path) -> None:
    obj = json.loads(p.read_text())
    obj["claims"] = ["a"]
    write_obj(p, obj)


def _empty(p: Path) -> None:
    p.write_bytes(b"")


DAMAGES = [
    Damage("truncated", _truncate, LoadStatus.CORRUPT, "not valid JSON"),
    Damage("garbled", _garble, LoadStatus.CORRUPT, "not valid JSON"),
    Damage("empty", _empty, LoadStatus.CORRUPT, "not valid JSON"),
    Damage("edited", _edit_without_checksum, LoadStatus.CORRUPT, "checksum mismatch"),
    Damage("no-checksum", _drop_checksum, LoadStatus.CORRUPT, "checksum mismatch"),
    Damage("not-an-object", _not_an_object, LoadStatus.CORRUPT, "expected a JSON object"),
    Damage("bad-structure", _wrong_types_with_good_checksum, LoadStatus.CORRUPT, "does not decode as v1"),
    Damage("future-version", _future_version, LoadStatus.UNSUPPORTED_VERSION, "version 'v9'"),
]


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.name for d in DAMAGES])
def test_a_bad_file_is_reported_and_moved_aside(cp_path: Path, boot_id_file: Path, damage: Damage) -> None:
    ckpt.save(cp_path, sample())
    damage.apply(cp_path)
    bad_bytes = cp_path.read_bytes()
    loaded, report = ckpt.load(cp_path, boot_id_file, clock=lambda: datetime(2026, 3, 2, 8, 0, tzinfo=UTC))
    assert report.status is damage.status and not report.ok
    assert damage.says in report.message and str(cp_path) in report.message
    assert loaded == Checkpoint.empty(BOOT)
    reason = "unsupported" if damage.status is LoadStatus.UNSUPPORTED_VERSION else "corrupt"
    assert report.moved_to == cp_path.with_name(f"checkpoint.json.{reason}-20260302T080000.000000Z")
    assert report.moved_to.read_bytes() == bad_bytes and not cp_path.exists()
    # the next start finds no file, and a save after that works normally
    assert ckpt.load(cp_path, boot_id_file)[1].status is LoadStatus.MISSING
    ckpt.save(cp_path, loaded)
    assert ckpt.load(cp_path, boot_id_file)[1].status is LoadStatus.LOADED


def test_moving_aside_twice_in_one_instant_keeps_both_files(cp_path: Path, boot_id_file: Path) -> None:
    fixed = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    cp_path.parent.mkdir(parents=True)
    moved = []
    for text in ("{", "[]"):
        cp_path.write_text(text)
        moved.append(ckpt.load(cp_path, boot_id_file, clock=lambda: fixed)[1].moved_to)
    assert moved[0] != moved[1] and all(m is not None and m.exists() for m in moved)


def test_a_checkpoint_from_another_boot_is_discarded(cp_path: Path, boot_id_file: Path) -> None:
    ckpt.save(cp_path, sample())
    boot_id_file.write_text("11111111-2222-4333-8444-555555555555\n")
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert report.status is LoadStatus.BOOT_ID_CHANGED and not report.ok
    assert report.discarded_claims == 3 and BOOT in report.message
    assert loaded == Checkpoint.empty("11111111-2222-4333-8444-555555555555")


def test_an_unreadable_boot_id_is_an_error_naming_the_file(cp_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ckpt.BootIdError, match="no-such-boot-id"):
        ckpt.load(cp_path, tmp_path / "no-such-boot-id")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ckpt.BootIdError, match="empty"):
        ckpt.load(cp_path, tmp_path / "empty")
    (tmp_path / "two").write_text("a b\n")
    with pytest.raises(ckpt.BootIdError, match="not a single word"):
        ckpt.load(cp_path, tmp_path / "two")


# ----------------------------------------------------------------------------------------------
# Crash safety of save


def test_a_crash_before_the_rename_leaves_the_old_checkpoint(cp_path: Path, boot_id_file: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    old = sample()
    ckpt.save(cp_path, old)
    newer = ckpt.remove(old, "a")

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(ckpt.CheckpointWriteError) as err:
        ckpt.save(cp_path, newer)
    monkeypatch.undo()
    assert str(cp_path) in str(err.value) and "renaming" in str(err.value) and err.value.step.startswith("renaming")
    assert sorted(p.name for p in cp_path.parent.iterdir()) == ["checkpoint.json"]
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert report.status is LoadStatus.LOADED and loaded == old


def test_a_temp_file_left_by_a_killed_agent_is_never_read_as_state(cp_path: Path, boot_id_file: Path) -> None:
    # A SIGKILL between write and rename leaves a complete-looking temp file beside the real one.
    old = sample()
    ckpt.save(cp_path, old)
    leftover = cp_path.with_name(".checkpoint.json.tmp-abc123")
    leftover.write_text(ckpt.encode(ckpt.remove(old, "a")))
    half = cp_path.with_name(".checkpoint.json.tmp-def456")
    half.write_text('{"version": "v1", "boo')
    loaded, report = ckpt.load(cp_path, boot_id_file)
    assert loaded == old and report.status is LoadStatus.LOADED
    assert set(report.removed_temp_files) == {leftover, half}
    assert not leftover.exists() and not half.exists()


def test_a_crash_before_the_first_rename_leaves_no_checkpoint(cp_path: Path, boot_id_file: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail_fsync)
    with pytest.raises(ckpt.CheckpointWriteError, match=r"checkpoint\.json: fsync of .*No space left"):
        ckpt.save(cp_path, sample())
    monkeypatch.undo()
    assert list(cp_path.parent.iterdir()) == []
    assert ckpt.load(cp_path, boot_id_file)[1].status is LoadStatus.MISSING


def test_a_save_error_names_the_path_and_the_step(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ckpt.CheckpointWriteError, match=r"file/sub/checkpoint\.json: creating the directory"):
        ckpt.save(blocker / "sub" / "checkpoint.json", sample())


# ----------------------------------------------------------------------------------------------
# Transitions


def test_prepare_then_unprepare_of_a_completed_claim() -> None:
    cp = ckpt.start_prepare(Checkpoint.empty(BOOT), ref(), alloc(7), now=T0)
    assert cp.get("claim-1") is not None and cp.get("claim-1").state is ClaimState.PREPARE_STARTED  # type: ignore[union-attr]
    done = ckpt.complete_prepare(cp, "claim-1", cdi_spec_file="f", cdi_device_ids=["k/c=d"], now=T0)
    entry = done.get("claim-1")
    assert entry is not None and entry.state is ClaimState.PREPARE_COMPLETED and entry.cdi_device_ids == ("k/c=d",)
    assert ckpt.complete_prepare(done, "claim-1", cdi_spec_file="f", cdi_device_ids=["k/c=d"], now=T0) is done
    assert ckpt.remove(done, "claim-1").claims == ()
    assert ckpt.remove(done, "unknown") is done


def test_transitions_return_new_objects_and_never_modify_the_old_one() -> None:
    before = sample()
    snapshot = before.model_dump()
    after = ckpt.remove(ckpt.abort(before, "b", now=T0), "a")
    assert before.model_dump() == snapshot and after != before
    with pytest.raises(ValidationError):
        before.boot_id = "x"  # type: ignore[misc]


def test_a_stale_prepare_after_an_abort_is_rejected_for_90_seconds() -> None:
    cp = ckpt.start_prepare(Checkpoint.empty(BOOT), ref(), alloc(7), now=T0)
    cp = ckpt.abort(cp, "claim-1", now=T0 + timedelta(seconds=10))
    with pytest.raises(ckpt.StalePrepareRejected) as err:
        ckpt.start_prepare(cp, ref(), alloc(7), now=T0 + timedelta(seconds=40))
    assert err.value.retry_after == timedelta(seconds=60) and "claim-1" in str(err.value)
    # still aborted at 99.9 s; expired (and preparable again) at exactly 10 + 90 s
    assert ckpt.expire_aborted(cp, now=T0 + timedelta(seconds=99.9)) is cp
    assert ckpt.expire_aborted(cp, now=T0 + timedelta(seconds=100)).claims == ()
    again = ckpt.start_prepare(cp, ref(), alloc(7), now=T0 + timedelta(seconds=100))
    assert again.get("claim-1").state is ClaimState.PREPARE_STARTED  # type: ignore[union-attr]


def test_a_prepare_with_a_different_allocation_is_not_stale() -> None:
    cp = ckpt.start_prepare(Checkpoint.empty(BOOT), ref(), alloc(7), now=T0)
    cp = ckpt.abort(cp, "claim-1", now=T0)
    cp = ckpt.start_prepare(cp, ref(), alloc(8), now=T0 + timedelta(seconds=1))
    entry = cp.get("claim-1")
    assert entry is not None and entry.state is ClaimState.PREPARE_STARTED and entry.allocation.channels == (8,)


def test_a_repeated_start_keeps_the_original_start_time() -> None:
    cp = ckpt.start_prepare(Checkpoint.empty(BOOT), ref(), alloc(7), now=T0)
    cp = ckpt.start_prepare(cp, ref(), alloc(7), now=T0 + timedelta(seconds=30))
    assert cp.get("claim-1").started_at == T0  # type: ignore[union-attr]


@pytest.mark.parametrize(("state", "action"), [
    ("completed", "start"), ("completed", "abort"), ("aborted", "complete"), ("absent", "complete"),
])
def test_transitions_that_are_not_allowed(state: str, action: str) -> None:
    cp = Checkpoint.empty(BOOT)
    if state != "absent":
        cp = ckpt.start_prepare(cp, ref(), alloc(7), now=T0)
    if state == "completed":
        cp = ckpt.complete_prepare(cp, "claim-1", cdi_spec_file="f", cdi_device_ids=["k/c=d"], now=T0)
    if state == "aborted":
        cp = ckpt.abort(cp, "claim-1", now=T0)
    with pytest.raises(ckpt.InvalidTransition, match="claim-1"):
        if action == "start":
            ckpt.start_prepare(cp, ref(), alloc(7), now=T0)
        elif action == "abort":
            ckpt.abort(cp, "claim-1", now=T0)
        else:
            ckpt.complete_prepare(cp, "claim-1", cdi_spec_file="f", cdi_device_ids=[], now=T0)


def test_abort_of_an_unknown_or_aborted_claim_changes_nothing() -> None:
    cp = ckpt.abort(ckpt.start_prepare(Checkpoint.empty(BOOT), ref(), alloc(7), now=T0), "claim-1", now=T0)
    assert ckpt.abort(cp, "claim-1", now=T0 + timedelta(seconds=5)) is cp
    assert ckpt.abort(cp, "other", now=T0) is cp


def test_the_internal_model_rejects_inconsistent_entries() -> None:
    with pytest.raises(ValidationError, match="channels"):
        alloc(2048)
    with pytest.raises(ValidationError, match="completedAt"):
        ckpt.ClaimEntry(claim=ref(), state=ClaimState.PREPARE_COMPLETED, allocation=alloc(1), started_at=T0)
    with pytest.raises(ValidationError, match="timezone"):
        ckpt.ClaimEntry(claim=ref(), state=ClaimState.PREPARE_STARTED, allocation=alloc(1),
                        started_at=datetime(2026, 1, 1))
    entry = ckpt.ClaimEntry(claim=ref(), state=ClaimState.PREPARE_STARTED, allocation=alloc(1), started_at=T0)
    with pytest.raises(ValidationError, match="twice"):
        Checkpoint(boot_id=BOOT, claims=(entry, entry))
    assert alloc(5, 3, 5).channels == (3, 5)


# ----------------------------------------------------------------------------------------------
# Properties over random histories


def plain_encoding(cp: Checkpoint) -> str:
    body: dict[str, Any] = {"version": ckpt.CHECKPOINT_VERSION, "bootId": cp.boot_id,
                            "claims": {e.uid: ckpt.entry_json(e) for e in cp.claims}}
    body["checksum"] = "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                             ensure_ascii=False).encode()).hexdigest()
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


UIDS = ["u1", "u2", "u3"]
ALLOCS = [alloc(1), alloc(2), alloc(3, 4, cd="cd-b")]

ops = st.lists(
    st.tuples(
        st.sampled_from(["start", "complete", "abort", "remove", "expire"]),
        st.sampled_from(UIDS),
        st.sampled_from(range(len(ALLOCS))),
        st.integers(min_value=0, max_value=120),  # seconds that pass before the operation
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=ops)
def test_random_histories_follow_the_state_machine(history: list[tuple[str, str, int, int]], tmp_path: Path,
                                                   boot_id_file: Path) -> None:
    cp = Checkpoint.empty(BOOT)
    now = T0
    # the reference model: uid -> (state, allocation index, aborted_at)
    model: dict[str, tuple[ClaimState, int, datetime | None]] = {}
    for op, uid, a, dt in history:
        now += timedelta(seconds=dt)
        cur = model.get(uid)
        before = cp.get(uid)
        try:
            if op == "start":
                cp = ckpt.start_prepare(cp, ref(uid), ALLOCS[a], now=now)
            elif op == "complete":
                cp = ckpt.complete_prepare(cp, uid, cdi_spec_file=f"/cdi/{uid}.json",
                                           cdi_device_ids=[f"k/c={uid}"], now=now)
            elif op == "abort":
                cp = ckpt.abort(cp, uid, now=now)
            elif op == "remove":
                cp = ckpt.remove(cp, uid)
            else:
                cp = ckpt.expire_aborted(cp, now=now)
        except ckpt.StalePrepareRejected:
            assert cur is not None and cur[0] is ClaimState.PREPARE_ABORTED and cur[1] == a
            assert cur[2] is not None and now < cur[2] + ckpt.STALE_PREPARE_WINDOW
            continue
        except ckpt.InvalidTransition:
            state = cur[0] if cur else None
            assert (op, state) in {("start", ClaimState.PREPARE_COMPLETED), ("abort", ClaimState.PREPARE_COMPLETED),
                                   ("complete", None), ("complete", ClaimState.PREPARE_ABORTED)}
            continue
        # advance the reference model
        if op == "start":
            model[uid] = (ClaimState.PREPARE_STARTED, a, None)
        elif op == "complete" and cur is not None:
            model[uid] = (ClaimState.PREPARE_COMPLETED, cur[1], None)
        elif op == "abort" and cur is not None and cur[0] is ClaimState.PREPARE_STARTED:
            model[uid] = (ClaimState.PREPARE_ABORTED, cur[1], now)
        elif op == "remove":
            model.pop(uid, None)
        elif op == "expire":
            model = {u: s for u, s in model.items()
                     if not (s[2] is not None and s[2] + ckpt.STALE_PREPARE_WINDOW <= now)}
        # invariants: one entry per claim, matching the model; completed claims keep their channels
        assert [e.uid for e in cp.claims] == sorted(model)
        for entry in cp.claims:
            state, ai, _ = model[entry.uid]
            assert entry.state is state and entry.allocation == ALLOCS[ai]
        after = cp.get(uid)
        if before is not None and before.state is ClaimState.PREPARE_COMPLETED and after is not None:
            assert after.state is ClaimState.PREPARE_COMPLETED
            assert after.allocation.channels == before.allocation.channels
            assert after.cdi_device_ids == before.cdi_device_ids
        # the incremental encoder (per-entry fragments reused across saves) = the plain canonical dump
        assert ckpt.encode(cp) == plain_encoding(cp)
        if op == "expire":
            assert all(e.aborted_at + ckpt.STALE_PREPARE_WINDOW > now for e in cp.by_state(ClaimState.PREPARE_ABORTED)
                       if e.aborted_at is not None)
    # an aborted entry is gone once its 90 s have passed
    later = ckpt.expire_aborted(cp, now=now + ckpt.STALE_PREPARE_WINDOW)
    assert later.by_state(ClaimState.PREPARE_ABORTED) == ()
    path = tmp_path / "prop" / "checkpoint.json"
    ckpt.save(path, cp)
    assert ckpt.load(path, boot_id_file)[0] == cp


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)
aware_times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                           timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]))


@st.composite
def entries(draw: st.DrawFn, uid: str) -> ckpt.ClaimEntry:
    state = draw(st.sampled_from(list(ClaimState)))
    started = draw(aware_times)
    return ckpt.ClaimEntry(
        claim=ClaimRef(uid=uid, namespace=draw(names), name=draw(names)),
        state=state,
        allocation=Allocation(compute_domain_uid=draw(names), compute_domain_name=draw(names),
                              channels=tuple(draw(st.lists(st.integers(0, 2047), min_size=1, max_size=4))),
                              imex_domain_id=draw(names), all_channels=draw(st.booleans())),
        cdi_spec_file=draw(st.one_of(st.just(""), names)),
        cdi_device_ids=tuple(draw(st.lists(names, max_size=2))),
        started_at=started,
        completed_at=draw(aware_times) if state is ClaimState.PREPARE_COMPLETED else draw(st.none() | aware_times),
        aborted_at=draw(aware_times) if state is ClaimState.PREPARE_ABORTED else None,
    )


@st.composite
def checkpoints(draw: st.DrawFn) -> Checkpoint:
    uids = draw(st.lists(names, max_size=4, unique=True))
    return Checkpoint(boot_id=str(draw(st.uuids())),
                      claims=tuple(draw(entries(u)) for u in uids))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cp=checkpoints())
def test_save_then_load_is_the_identity(cp: Checkpoint, tmp_path: Path) -> None:
    boot = tmp_path / "boot"
    boot.write_text(cp.boot_id + "\n", encoding="utf-8")
    path = tmp_path / "any" / "checkpoint.json"
    ckpt.save(path, cp)
    loaded, report = ckpt.load(path, boot)
    assert report.status is LoadStatus.LOADED, report.message
    assert loaded == cp
    assert ckpt.encode(loaded) == ckpt.encode(cp)
