"""What the node agent's checkpoint holds: per-claim records, their states, and the pure transitions.

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
`STALE_PREPARE_WINDOW` (twice the kubelet's budget, names.KUBELET_PREPARE_TIMEOUT_S: 90 s), after which
the entry expires. All transitions are pure functions returning a new immutable `Checkpoint`; `now` is
always passed in.

The file these records are kept in, its format and compatibility policy are checkpoint.py's.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nvlfabric.api.names import IMEX_CHANNEL_COUNT, KUBELET_PREPARE_TIMEOUT_S

__all__ = [
    "STALE_PREPARE_WINDOW",
    "Allocation",
    "Checkpoint",
    "CheckpointError",
    "ClaimEntry",
    "ClaimRef",
    "ClaimState",
    "InvalidTransition",
    "StalePrepareRejected",
    "abort",
    "complete_prepare",
    "expire_aborted",
    "remove",
    "rewrite",
    "start_prepare",
]

STALE_PREPARE_WINDOW = timedelta(seconds=2 * KUBELET_PREPARE_TIMEOUT_S)
"""How long an aborted claim rejects stale Prepare retries: twice the kubelet's Prepare budget,
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
    """IMEX channels, sorted and unique: the claim's own channel, in either allocation mode (All
    means every channel of the claim's ComputeDomain on this node, never another domain's)."""
    imex_domain_id: NonEmpty
    device: str = ""
    """The allocated pool device, `<pool>/<device>` (e.g. `clique-<id>/channel-5`): what the kubelet's
    health stream names. Empty in entries written before it was recorded."""
    all_channels: bool = False
    """Allocation mode All: the claim's CDI device is the set `<claimUID>-channels` (cdi.py), whatever
    the number of channels in it."""

    def same_as(self, other: Allocation) -> bool:
        """Equal, where an entry written before devices were recorded matches on the rest."""
        if not (self.device and other.device):
            return dataclasses.replace(self, device="") == dataclasses.replace(other, device="")
        return self == other

    @field_validator("channels")
    @classmethod
    def _sorted_unique(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(value)))

    @property
    def every_channel_of_the_node(self) -> bool:
        """The form an agent before issue 49 recorded for allocation mode All: channels 0..2047, every
        channel of the node, other ComputeDomains' included (narrowed at start, PreparedClaims)."""
        return len(self.channels) == IMEX_CHANNEL_COUNT


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


def rewrite(cp: Checkpoint, entry: ClaimEntry) -> Checkpoint:
    """Put `entry` in place of the claim's entry, in the same state (an upgrade narrowing what an
    earlier agent recorded; PreparedClaims.narrow_every_channel)."""
    current = cp.get(entry.uid)
    if current is None or current.state is not entry.state:
        raise InvalidTransition(entry.uid, current.state if current else None, "rewrite",
                                f"the entry to rewrite is {entry.state.value}")
    return cp._with(entry)


def expire_aborted(cp: Checkpoint, *, now: datetime) -> Checkpoint:
    """Drop the aborted entries whose stale-prepare window has passed."""
    return cp._without(e.uid for e in cp.claims if (x := e.expires_at()) is not None and x <= now)
