"""The node agent's durable per-claim state: what it prepared, for whom, and how far it got.

The kubelet retries NodePrepareResources after restarts and calls NodeUnprepareResources with only
(namespace, UID, name), so the agent records every claim it touches. Prepare consults this record
first, which makes repeats idempotent, and Unprepare works from it without the API object.

The records, their states and transitions are checkpointstate.py's (importable from here too);
this module is the file: its format, `load` and `save`.

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
          "channelAllocationMode": "All",  # allocation mode All (optional, added in v1; absent: Single)
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
import enum
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api.computedomain import ChannelAllocationMode
from nvlfabric.nodeagent.checkpointstate import (
    STALE_PREPARE_WINDOW,
    Allocation,
    Checkpoint,
    CheckpointError,
    ClaimEntry,
    ClaimRef,
    ClaimState,
    InvalidTransition,
    StalePrepareRejected,
    abort,
    complete_prepare,
    expire_aborted,
    remove,
    rewrite,
    start_prepare,
)

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
    "entry_json",
    "expire_aborted",
    "load",
    "read_boot_id",
    "remove",
    "rewrite",
    "save",
    "start_prepare",
]

CHECKPOINT_VERSION = "v1"
"""The version this agent writes."""

DEFAULT_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


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


_SINGLE, _ALL = ChannelAllocationMode.SINGLE.value, ChannelAllocationMode.ALL.value


class ClaimV1(_Lenient):
    namespace: str
    name: str
    state: str
    compute_domain: ComputeDomainRefV1 = Field(alias="computeDomain")
    channels: list[int]
    imex_domain_id: str = Field(alias="imexDomainId")
    device: str | None = None
    channel_allocation_mode: str | None = Field(default=None, alias="channelAllocationMode")
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
        device=entry.allocation.device or None,
        channel_allocation_mode=_ALL if entry.allocation.all_channels else None, cdi=cdi,
        started_at=entry.started_at, completed_at=entry.completed_at, aborted_at=entry.aborted_at,
    )


def _entry_from_v1(uid: str, raw: Mapping[str, Any]) -> ClaimEntry:
    v1 = ClaimV1.model_validate(raw)
    if v1.channel_allocation_mode not in (None, _SINGLE, _ALL):
        raise ValueError(f"channelAllocationMode {v1.channel_allocation_mode!r} is not one this agent knows")
    return ClaimEntry(
        claim=ClaimRef(uid=uid, namespace=v1.namespace, name=v1.name),
        state=ClaimState(v1.state),
        allocation=Allocation(compute_domain_uid=v1.compute_domain.uid, compute_domain_name=v1.compute_domain.name,
                              channels=tuple(v1.channels), imex_domain_id=v1.imex_domain_id,
                              device=v1.device or "", all_channels=v1.channel_allocation_mode == _ALL),
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


def entry_json(entry: ClaimEntry) -> Mapping[str, Any]:
    """One entry as the v1 object under "claims" (camelCase, empty optional fields left out)."""
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
            (e, _canonical(entry_json(e)).decode())
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
