"""The node agent's durable per-claim state: what it prepared, for whom, and how far it got.

The kubelet retries NodePrepareResources after restarts and calls NodeUnprepareResources with only
(namespace, UID, name), so the agent records every claim it touches. Prepare consults this record
first, which makes repeats idempotent, and Unprepare works from it without the API object.

Claim states (one entry per claim UID, so a claim is in exactly one state or absent):

    (absent) --start_prepare--> PrepareStarted --complete_prepare--> PrepareCompleted
                                      |                                     |
                                    abort                                 remove
                                      v                                     v
                                PrepareAborted --expire_aborted (90 s)--> (absent)

`PrepareAborted` is an Unprepare that arrived while Prepare was still running (the kubelet gave up on
it). A Prepare retry for the same allocation that arrives later is stale and is rejected for
`STALE_PREPARE_WINDOW` (90 s = 2 x the kubelet's 45 s budget), after which the entry expires. All
transitions are pure functions returning a new immutable `Checkpoint`; `now` is always passed in.

## On-disk format (`checkpoint.json`)

One JSON object on one line, written atomically (temporary file in the same directory, fsync, rename,
fsync of the directory). Version 1 (shown indented):

    {
      "version": "v1",
      "checksum": "sha256:<hex>",        # of the canonical JSON of this object without "checksum"
      "bootId": "<the node's /proc/sys/kernel/random/boot_id>",
      "claims": {
        "<claim uid>": {
          "namespace": "...", "name": "...",
          "state": "PrepareStarted" | "PrepareCompleted" | "PrepareAborted",
          "computeDomain": {"uid": "...", "name": "..."},
          "channels": [5],               # IMEX channel numbers, sorted
          "imexDomainId": "...",
          "device": "<pool>/<device>",   # the allocated pool device (optional, added in v1)
          "cdi": {"specFile": "...", "deviceIds": ["..."]},      # once completed
          "startedAt": "<RFC 3339>", "completedAt": "...", "abortedAt": "..."   # the ones that apply
        }
      }
    }

The canonical JSON is `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
encoded as UTF-8. The checksum covers the raw object as found in the file, *before* decoding, so a
file written by a newer agent with fields this agent does not know still verifies (the lesson of
NVIDIA's dra-driver issue #1080, where new fields broke the checksum of older checkpoints).

## Compatibility policy

- **Newer agents read every older version.** Each on-disk version has its own model (`CheckpointV1`,
  ...) and a conversion to the internal model (`Checkpoint`); `_DECODERS` maps the version string to it.
- **Our own file is decoded leniently**: unknown fields are ignored, and an entry that does not decode
  (say, a state a newer agent invented) is skipped and reported while every other claim is kept.
  Reason: after a downgrade the older agent must not lose the claims the newer one prepared.
  (User input, such as opaque claim parameters, is decoded strictly elsewhere: a typo there must fail
  loudly rather than be ignored.)
- **Additive changes stay in v1**: a new field must be optional and omitted when empty, so older
  agents read the file unchanged. An older agent that rewrites the file drops fields it does not know;
  new fields must therefore be re-derivable or only an optimisation.
- **A breaking change is a new version** (v2), and agents keep *writing* v1 until every supported
  agent reads v2 (the agent writes a version older agents can read).
- A version this agent does not know, a checksum mismatch, a torn or garbled file: the file is moved
  aside (`checkpoint.json.unsupported-<ts>` / `checkpoint.json.corrupt-<ts>`), the problem is
  reported in the `LoadReport`, and loading returns an empty checkpoint; the caller rebuilds its state
  from the API server. Never fatal.
- The node's boot id is stored; a checkpoint from another boot is discarded (device nodes and IMEX
  state do not survive a reboot; dra-driver issue #951) and that is reported.
- A missing file is an empty checkpoint. Temporary files of an interrupted save are never read as
  state; `load` removes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nvlfabric.api.names import IMEX_CHANNEL_COUNT

__all__ = [
    "CHECKPOINT_VERSION",
    "DEFAULT_BOOT_ID_PATH",
    "STALE_PREPARE_WINDOW",
    "Allocation",
    "BootIdError",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriteError",
    "ClaimEntry",
    "ClaimRef",
    "ClaimState",
    "InvalidTransition",
    "LoadReport",
    "LoadStatus",
    "StalePrepareRejected",
    "abort",
    "complete_prepare",
    "encode",
    "expire_aborted",
    "load",
    "read_boot_id",
    "remove",
    "save",
    "start_prepare",
]

CHECKPOINT_VERSION = "v1"
"""The version this agent writes."""

DEFAULT_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

STALE_PREPARE_WINDOW = timedelta(seconds=90)
"""How long an aborted claim rejects stale Prepare retries: twice the kubelet's 45 s Prepare budget,
so a retry the kubelet sent before it gave up has surely arrived (or been dropped) by then."""


# --------------------------------------------------------------------------------------------------
# Internal model: what the agent reasons about. Strict, frozen; independent of any on-disk version.


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    PREPARE_ABORTED = "PrepareAborted"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# The per-claim records are pydantic dataclasses with __slots__: validated like models, a third of
# a model's memory (no per-instance __dict__ and fields-set), and the agent keeps one per claim.
_RECORD = ConfigDict(extra="forbid")


NonEmpty = Annotated[str, Field(min_length=1)]
Channel = Annotated[int, Field(ge=0, lt=IMEX_CHANNEL_COUNT)]


@pydantic_dataclass(frozen=True, slots=True, kw_only=True, config=_RECORD)
class ClaimRef:
    """The ResourceClaim, as the kubelet names it in Prepare/Unprepare."""

    uid: NonEmpty
    namespace: NonEmpty
    name: NonEmpty


@pydantic_dataclass(frozen=True, slots=True, kw_only=True, config=_RECORD)
class Allocation:
    """What the claim was given: everything non-deterministic that Prepare must remember."""

    compute_domain_uid: NonEmpty
    compute_domain_name: NonEmpty
    channels: tuple[Channel, ...] = Field(min_length=1)
    """IMEX channels, sorted and unique (one for allocation mode Single, the CD's set for All)."""
    imex_domain_id: NonEmpty
    device: str = ""
    """The allocated pool device, `<pool>/<device>` (e.g. `clique-<id>/channel-5`): what the kubelet's
    health stream names. Empty in entries written before it was recorded."""

    def same_as(self, other: Allocation) -> bool:
        """Equal, where an entry written before devices were recorded matches on the rest."""
        if not (self.device and other.device):
            return dataclasses.replace(self, device="") == dataclasses.replace(other, device="")
        return self == other

    @field_validator("channels")
    @classmethod
    def _sorted_unique(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(value)))


@pydantic_dataclass(frozen=True, slots=True, kw_only=True, config=_RECORD)
class ClaimEntry:
    claim: ClaimRef
    state: ClaimState
    allocation: Allocation
    cdi_spec_file: str = ""
    cdi_device_ids: tuple[str, ...] = ()
    started_at: AwareDatetime
    completed_at: AwareDatetime | None = None
    aborted_at: AwareDatetime | None = None

    @model_validator(mode="after")
    def _timestamps_match_state(self) -> ClaimEntry:
        if self.state is ClaimState.PREPARE_COMPLETED and self.completed_at is None:
            raise ValueError("a PrepareCompleted entry needs completedAt")
        if self.state is ClaimState.PREPARE_ABORTED and self.aborted_at is None:
            raise ValueError("a PrepareAborted entry needs abortedAt")
        return self

    @property
    def uid(self) -> str:
        return self.claim.uid

    def expires_at(self) -> datetime | None:
        """When an aborted entry stops rejecting stale prepares and is dropped; None otherwise."""
        if self.state is not ClaimState.PREPARE_ABORTED or self.aborted_at is None:
            return None
        return self.aborted_at + STALE_PREPARE_WINDOW


class Checkpoint(_Frozen):
    """All claims of this node for one boot. Entries are kept sorted by claim UID, one per UID."""

    boot_id: Annotated[str, Field(pattern=r"^\S+$")]
    """The kernel's boot id (a UUID): one word, as read from the boot id file without its newline."""
    claims: tuple[ClaimEntry, ...] = ()

    @field_validator("claims")
    @classmethod
    def _one_entry_per_uid(cls, value: tuple[ClaimEntry, ...]) -> tuple[ClaimEntry, ...]:
        ordered = tuple(sorted(value, key=lambda e: e.uid))
        for a, b in itertools.pairwise(ordered):
            if a.uid == b.uid:
                raise ValueError(f"claim {a.uid} appears twice")
        return ordered

    @classmethod
    def empty(cls, boot_id: str) -> Checkpoint:
        return cls(boot_id=boot_id)

    def get(self, uid: str) -> ClaimEntry | None:
        return next((e for e in self.claims if e.uid == uid), None)

    def by_state(self, state: ClaimState) -> tuple[ClaimEntry, ...]:
        return tuple(e for e in self.claims if e.state is state)

    def _with(self, entry: ClaimEntry) -> Checkpoint:
        return Checkpoint(boot_id=self.boot_id, claims=(*(e for e in self.claims if e.uid != entry.uid), entry))

    def _without(self, uids: Iterable[str]) -> Checkpoint:
        drop = set(uids)
        if not drop.intersection(e.uid for e in self.claims):
            return self
        return Checkpoint(boot_id=self.boot_id, claims=tuple(e for e in self.claims if e.uid not in drop))


# --------------------------------------------------------------------------------------------------
# Transitions: pure, each returns a new Checkpoint (or the same one when nothing changes).


class CheckpointError(Exception):
    """Base of this module's errors."""


class InvalidTransition(CheckpointError):
    """The requested transition is not allowed from the claim's current state."""

    def __init__(self, uid: str, state: ClaimState | None, action: str, why: str) -> None:
        self.uid = uid
        self.state = state
        self.action = action
        super().__init__(f"claim {uid}: cannot {action} ({state.value if state else 'absent'}): {why}")


class StalePrepareRejected(InvalidTransition):
    """A Prepare retry for a claim that was unprepared while it was being prepared (#1162)."""

    def __init__(self, uid: str, retry_after: timedelta) -> None:
        self.retry_after = retry_after
        super().__init__(
            uid, ClaimState.PREPARE_ABORTED, "start prepare",
            f"unprepared while being prepared; a retry of that prepare is stale and is rejected for another "
            f"{retry_after.total_seconds():.0f} s",
        )


def start_prepare(cp: Checkpoint, claim: ClaimRef, allocation: Allocation, *, now: datetime) -> Checkpoint:
    """Record that Prepare of `claim` begins; call and save *before* any side effect.

    Absent or expired-aborted: a new PrepareStarted entry. PrepareStarted again (a retry after a crash
    or a timeout): the entry is refreshed with this allocation, keeping `startedAt` when the allocation
    is the same. PrepareAborted with the same allocation within the window: StalePrepareRejected
    (a different allocation under the same UID is a new request and starts afresh). PrepareCompleted:
    InvalidTransition; the caller returns the stored devices instead (look the claim up first).
    """
    current = cp.get(claim.uid)
    started_at = now
    if current is not None:
        if current.state is ClaimState.PREPARE_COMPLETED:
            raise InvalidTransition(claim.uid, current.state, "start prepare",
                                    "already prepared; return the recorded devices")
        expires = current.expires_at()
        if expires is not None and now < expires and current.allocation.same_as(allocation):
            raise StalePrepareRejected(claim.uid, expires - now)
        if current.state is ClaimState.PREPARE_STARTED and current.allocation.same_as(allocation):
            started_at = current.started_at
    return cp._with(ClaimEntry(claim=claim, state=ClaimState.PREPARE_STARTED, allocation=allocation,
                               started_at=started_at))


def complete_prepare(cp: Checkpoint, uid: str, *, cdi_spec_file: str, cdi_device_ids: Iterable[str],
                     now: datetime) -> Checkpoint:
    """PrepareStarted -> PrepareCompleted with the CDI spec written for it (idempotent)."""
    current = cp.get(uid)
    ids = tuple(cdi_device_ids)
    if current is None:
        raise InvalidTransition(uid, None, "complete prepare", "prepare was never started")
    if current.state is ClaimState.PREPARE_COMPLETED:
        if (current.cdi_spec_file, current.cdi_device_ids) == (cdi_spec_file, ids):
            return cp
        raise InvalidTransition(uid, current.state, "complete prepare", "already completed with other devices")
    if current.state is ClaimState.PREPARE_ABORTED:
        raise InvalidTransition(uid, current.state, "complete prepare",
                                "unprepared while being prepared; undo the side effects instead")
    return cp._with(dataclasses.replace(current, state=ClaimState.PREPARE_COMPLETED, cdi_spec_file=cdi_spec_file,
                                        cdi_device_ids=ids, completed_at=now))


def abort(cp: Checkpoint, uid: str, *, now: datetime) -> Checkpoint:
    """Unprepare arrived while Prepare had only started: PrepareStarted -> PrepareAborted.

    Absent or already aborted: unchanged. PrepareCompleted: InvalidTransition (undo the claim's side
    effects and `remove` it instead).
    """
    current = cp.get(uid)
    if current is None or current.state is ClaimState.PREPARE_ABORTED:
        return cp
    if current.state is ClaimState.PREPARE_COMPLETED:
        raise InvalidTransition(uid, current.state, "abort", "completed claims are removed, not aborted")
    return cp._with(dataclasses.replace(current, state=ClaimState.PREPARE_ABORTED, aborted_at=now))


def remove(cp: Checkpoint, uid: str) -> Checkpoint:
    """Forget the claim, whatever its state (Unprepare of a completed claim, after its cleanup)."""
    return cp._without([uid])


def expire_aborted(cp: Checkpoint, *, now: datetime) -> Checkpoint:
    """Drop the aborted entries whose stale-prepare window has passed."""
    return cp._without(e.uid for e in cp.claims if (x := e.expires_at()) is not None and x <= now)


# --------------------------------------------------------------------------------------------------
# On-disk version 1. Lenient (unknown fields ignored), camelCase, optional fields omitted when empty.


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class ComputeDomainRefV1(_Lenient):
    uid: str
    name: str


class CdiV1(_Lenient):
    spec_file: str = Field(default="", alias="specFile")
    device_ids: list[str] = Field(default_factory=list, alias="deviceIds")


class ClaimV1(_Lenient):
    namespace: str
    name: str
    state: str
    compute_domain: ComputeDomainRefV1 = Field(alias="computeDomain")
    channels: list[int]
    imex_domain_id: str = Field(alias="imexDomainId")
    device: str | None = None
    cdi: CdiV1 | None = None
    started_at: datetime = Field(alias="startedAt")
    completed_at: datetime | None = Field(default=None, alias="completedAt")
    aborted_at: datetime | None = Field(default=None, alias="abortedAt")


class CheckpointV1(_Lenient):
    """The v1 envelope; claims stay raw here and are decoded one by one (see `_decode_v1`)."""

    version: str
    boot_id: str = Field(alias="bootId")
    claims: dict[str, Any] = Field(default_factory=dict)


def _entry_to_v1(entry: ClaimEntry) -> ClaimV1:
    cdi = (CdiV1(spec_file=entry.cdi_spec_file, device_ids=list(entry.cdi_device_ids))
           if entry.cdi_spec_file or entry.cdi_device_ids else None)
    return ClaimV1(
        namespace=entry.claim.namespace, name=entry.claim.name, state=entry.state.value,
        compute_domain=ComputeDomainRefV1(uid=entry.allocation.compute_domain_uid,
                                          name=entry.allocation.compute_domain_name),
        channels=list(entry.allocation.channels), imex_domain_id=entry.allocation.imex_domain_id,
        device=entry.allocation.device or None, cdi=cdi,
        started_at=entry.started_at, completed_at=entry.completed_at, aborted_at=entry.aborted_at,
    )


def _entry_from_v1(uid: str, raw: Mapping[str, Any]) -> ClaimEntry:
    v1 = ClaimV1.model_validate(raw)
    return ClaimEntry(
        claim=ClaimRef(uid=uid, namespace=v1.namespace, name=v1.name),
        state=ClaimState(v1.state),
        allocation=Allocation(compute_domain_uid=v1.compute_domain.uid, compute_domain_name=v1.compute_domain.name,
                              channels=tuple(v1.channels), imex_domain_id=v1.imex_domain_id,
                              device=v1.device or ""),
        cdi_spec_file=v1.cdi.spec_file if v1.cdi else "",
        cdi_device_ids=tuple(v1.cdi.device_ids) if v1.cdi else (),
        started_at=v1.started_at, completed_at=v1.completed_at, aborted_at=v1.aborted_at,
    )


@dataclass(frozen=True)
class _Decoded:
    boot_id: str
    entries: tuple[ClaimEntry, ...]
    skipped: tuple[tuple[str, str], ...]


def _decode_v1(obj: Mapping[str, Any]) -> _Decoded:
    envelope = CheckpointV1.model_validate(obj)
    entries: list[ClaimEntry] = []
    skipped: list[tuple[str, str]] = []
    for uid, raw in envelope.claims.items():
        try:
            entries.append(_entry_from_v1(uid, raw))
        except (ValidationError, ValueError) as exc:
            skipped.append((uid, _first_line(exc)))
    return _Decoded(envelope.boot_id, tuple(entries), tuple(skipped))


_DECODERS: dict[str, Callable[[Mapping[str, Any]], _Decoded]] = {"v1": _decode_v1}


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _checksum(obj: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical({k: v for k, v in obj.items() if k != "checksum"})).hexdigest()


def _entry_json(entry: ClaimEntry) -> Mapping[str, Any]:
    return _entry_to_v1(entry).model_dump(mode="json", by_alias=True, exclude_none=True)


_fragments: dict[str, tuple[ClaimEntry, str]] = {}
"""uid -> (entry, its canonical JSON) of the entries last encoded. Entries are immutable and a save
changes one or two of them, so the others' text is reused: a save costs one entry's conversion, not
every entry's, and no thousand temporary dicts that would fragment the agent's heap."""


def _claims_json(entries: Iterable[ClaimEntry]) -> str:
    global _fragments
    fresh: dict[str, tuple[ClaimEntry, str]] = {}
    for e in entries:
        cached = _fragments.get(e.uid)
        fresh[e.uid] = cached if cached is not None and cached[0] is e else \
            (e, _canonical(_entry_json(e)).decode())
    _fragments = fresh  # only the current entries stay cached
    return "{" + ",".join(f"{json.dumps(uid, ensure_ascii=False)}:{fresh[uid][1]}" for uid in sorted(fresh)) + "}"


def encode(cp: Checkpoint) -> str:
    """The file text for `cp` in the current on-disk version (v1), checksum included.

    Compact, one line (`jq . checkpoint.json` shows it indented): the checkpoint is rewritten at every
    claim transition. The text is exactly `_canonical` of the body (sorted keys: bootId, checksum,
    claims, version), assembled from per-entry fragments; the checksum covers the body without it.
    """
    head = f'{{"bootId":{json.dumps(cp.boot_id, ensure_ascii=False)},'
    tail = f'"claims":{_claims_json(cp.claims)},"version":{json.dumps(CHECKPOINT_VERSION)}}}'
    checksum = "sha256:" + hashlib.sha256((head + tail).encode()).hexdigest()
    return f'{head}"checksum":{json.dumps(checksum)},{tail}\n'


# --------------------------------------------------------------------------------------------------
# Files.


class BootIdError(CheckpointError):
    """The node's boot id cannot be read; without it a checkpoint cannot be trusted."""


class CheckpointWriteError(CheckpointError):
    """Saving failed at `step`; the previous checkpoint file is unchanged."""

    def __init__(self, path: Path, step: str, cause: BaseException) -> None:
        self.path = path
        self.step = step
        super().__init__(f"saving checkpoint {path}: {step}: {cause}")


class LoadStatus(enum.StrEnum):
    MISSING = "missing"
    """No file: an empty checkpoint (first start on this node)."""
    LOADED = "loaded"
    CORRUPT = "corrupt"
    """Unreadable, torn, garbled or checksum mismatch: moved aside, empty checkpoint returned."""
    UNSUPPORTED_VERSION = "unsupported-version"
    """Written by an agent whose format this one cannot read: moved aside, empty checkpoint returned."""
    BOOT_ID_CHANGED = "boot-id-changed"
    """From an earlier boot of this node: discarded, empty checkpoint returned."""


@dataclass(frozen=True)
class LoadReport:
    """What `load` found; `str(report)` is one log line. Only MISSING and LOADED are `ok`."""

    status: LoadStatus
    path: Path
    message: str
    moved_to: Path | None = None
    file_version: str | None = None
    discarded_claims: int = 0
    skipped_entries: tuple[tuple[str, str], ...] = ()
    """(claim uid, reason) of entries that did not decode and were dropped (lenient decoding)."""
    removed_temp_files: tuple[Path, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.status in (LoadStatus.MISSING, LoadStatus.LOADED)

    def __str__(self) -> str:
        return self.message


def read_boot_id(boot_id_path: Path = DEFAULT_BOOT_ID_PATH) -> str:
    try:
        boot_id = Path(boot_id_path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BootIdError(f"reading the boot id from {boot_id_path}: {exc}") from exc
    if not boot_id:
        raise BootIdError(f"reading the boot id from {boot_id_path}: the file is empty")
    if len(boot_id.split()) != 1:
        raise BootIdError(f"reading the boot id from {boot_id_path}: {boot_id!r} is not a single word")
    return boot_id


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_aside(path: Path, reason: str, now: datetime) -> tuple[Path | None, str]:
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = path.with_name(f"{path.name}.{reason}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{reason}-{stamp}.{n}")
        n += 1
    try:
        os.replace(path, target)
    except OSError as exc:
        return None, f"; moving it aside to {target} failed: {exc}"
    with contextlib.suppress(OSError):
        _fsync_dir(path.parent)
    return target, f"; moved aside to {target}"


def _remove_temp_files(path: Path) -> tuple[Path, ...]:
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for leftover in path.parent.glob(f"{_temp_prefix(path)}*"):
            with contextlib.suppress(OSError):
                leftover.unlink()
                removed.append(leftover)
    return tuple(removed)


def load(path: str | os.PathLike[str], boot_id_path: str | os.PathLike[str] = DEFAULT_BOOT_ID_PATH, *,
         clock: Callable[[], datetime] = _utcnow) -> tuple[Checkpoint, LoadReport]:
    """The checkpoint at `path` for this boot, and what was found.

    Never raises for a bad file: a missing file, a corrupt one, an unknown version or another boot's
    file all yield an empty checkpoint for the current boot, with the reason in the report. Only an
    unreadable boot id raises (BootIdError).
    """
    target = Path(path)
    boot_id = read_boot_id(Path(boot_id_path))
    empty = Checkpoint.empty(boot_id)
    removed = _remove_temp_files(target)

    def bad(status: LoadStatus, why: str, version: str | None = None) -> tuple[Checkpoint, LoadReport]:
        reason = "unsupported" if status is LoadStatus.UNSUPPORTED_VERSION else "corrupt"
        moved, note = _move_aside(target, reason, clock())
        message = f"checkpoint {target}: {why}{note}; starting empty (state is rebuilt from the API server)"
        return empty, LoadReport(status, target, message, moved_to=moved, file_version=version,
                                 removed_temp_files=removed)

    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return empty, LoadReport(LoadStatus.MISSING, target, f"checkpoint {target}: no file; starting empty",
                                 removed_temp_files=removed)
    except OSError as exc:
        return bad(LoadStatus.CORRUPT, f"reading failed: {exc}")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return bad(LoadStatus.CORRUPT, f"not valid JSON (torn or garbled write?): {_first_line(exc)}")
    if not isinstance(obj, dict):
        return bad(LoadStatus.CORRUPT, f"expected a JSON object, found {type(obj).__name__}")
    version = obj.get("version")
    if not isinstance(version, str) or version not in _DECODERS:
        return bad(LoadStatus.UNSUPPORTED_VERSION,
                   f"version {version!r} is not one this agent reads ({', '.join(sorted(_DECODERS))})",
                   version if isinstance(version, str) else None)
    if obj.get("checksum") != _checksum(obj):
        return bad(LoadStatus.CORRUPT, "checksum mismatch (the file was torn or edited)", version)
    try:
        decoded = _DECODERS[version](obj)
    except (ValidationError, ValueError) as exc:
        return bad(LoadStatus.CORRUPT, f"does not decode as {version}: {_first_line(exc)}", version)
    if decoded.boot_id != boot_id:
        message = (f"checkpoint {target}: written during boot {decoded.boot_id}, this is boot {boot_id}; "
                   f"discarding its {len(decoded.entries)} claim(s) (device nodes do not survive a reboot)")
        return empty, LoadReport(LoadStatus.BOOT_ID_CHANGED, target, message, file_version=version,
                                 discarded_claims=len(decoded.entries), removed_temp_files=removed)
    cp = Checkpoint(boot_id=boot_id, claims=decoded.entries)
    message = f"checkpoint {target}: loaded {len(cp.claims)} claim(s) ({version})"
    if decoded.skipped:
        message += "; skipped undecodable entries: " + "; ".join(f"{u}: {why}" for u, why in decoded.skipped)
    return cp, LoadReport(LoadStatus.LOADED, target, message, file_version=version,
                          skipped_entries=decoded.skipped, removed_temp_files=removed)


def save(path: str | os.PathLike[str], cp: Checkpoint) -> None:
    """Write `cp` atomically: temp file in the same directory, fsync, rename over `path`, fsync the dir.

    On any failure the previous file is left as it was, the temporary file is removed, and
    CheckpointWriteError names the path and the step.
    """
    target = Path(path)
    text = encode(cp).encode("utf-8")
    step = "creating the directory"
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        step = "creating the temporary file"
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            step = f"writing {tmp}"
            fh.write(text)
            fh.flush()
            step = f"fsync of {tmp}"
            os.fsync(fh.fileno())
        step = f"renaming {tmp} over it"
        os.replace(tmp, target)
        tmp = None
        step = f"fsync of the directory {target.parent}"
        _fsync_dir(target.parent)
    except OSError as exc:
        raise CheckpointWriteError(target, step, exc) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
