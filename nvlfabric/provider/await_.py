"""Awaiting ComputeDomains: small composable conditions, one deadline, a readiness table.

The shape follows pulumi-kubernetes' newer await code (`condition/`, `checker/`):

- A **`Condition`** is a named, pure function from one observation to `Seen` (satisfied or not,
  a one-line description of what was seen, and whether waiting further is pointless). Conditions
  never fetch, sleep or start clocks. `all_of` chains them in order; the first unmet one is what
  a progress line or a timeout reports, so the order is the order of the steps a ComputeDomain
  goes through.
- **`wait`** polls an `observe` callable (the only thing that talks to the API server) until the
  condition holds, the condition says it never will (`AwaitFailed`, or the verdict's own error),
  or the caller's one `Deadline` passes (`AwaitTimeout`, naming what was awaited and what was last
  seen). Temporary API errors while observing are retried until the deadline; permanent ones end
  the wait at once. Polling backs off from `POLL.initial_s` to `POLL.max_s` (`backoff`); at one
  GET per object per two seconds at most it costs the API server little, and it keeps the loop
  deterministic under an injected `Clock` (tests use `ManualClock`, so nothing really sleeps).
- **`retry`** is the same deadline and back-off for one request rather than an observation: it
  is tried again after a temporary error until the deadline, then that error is raised.
- **`READINESS`** maps what a user asked to wait for (`AwaitFor`) to the ordered conditions. `None`
  has an explicit empty entry: "known, nothing to wait for".

| await_for  | conditions, in order                                                                   |
|------------|----------------------------------------------------------------------------------------|
| `None`     | (none)                                                                                 |
| `Accepted` | CRD established; ComputeDomain exists; its channel ResourceClaim exists                 |
| `Ready`    | the above; `status.observedGeneration == metadata.generation` and `status.phase == Ready` |

`Ready` fails fast on phase `Failed` (at the current generation): the controller has said the spec
cannot be satisfied, and its Ready condition's message says why.
On the `nvidia` backend (nvlfabric/provider/nvidiadomain.py) the same table holds with NVIDIA's
objects (`NVIDIA_READINESS`): its CRD, its ComputeDomain, the workload ResourceClaimTemplate its
controller makes (proof that the controller runs), and for `Ready` NVIDIA's `status.status: Ready`
with at least `numNodes` entries in `status.nodes` (its spec is immutable: no generation to match).

Deletion has its own condition, `deleted`, whose description names the finalizers that hold an
object back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Generic, Protocol, TypeVar

from nvlfabric.api import nvidia
from nvlfabric.api.computedomain import CRD_NAME, Phase
from nvlfabric.api.errors import TemporaryError
from nvlfabric.provider.errors import AwaitFailed, AwaitTimeout

T = TypeVar("T")
Obj = Mapping[str, Any]


# -- time ----------------------------------------------------------------------------------------------


class Clock(Protocol):
    """Where `wait` gets the time and how it sleeps; injected so tests need not sleep."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Final = SystemClock()


@dataclass
class ManualClock:
    """A clock that only moves when slept on: `sleep` advances it instantly and records the call.

    `on_sleep`, if set, runs after each sleep with the sleep's index (0, 1, ...), so a test can
    change the world "while" an await is waiting, deterministically.
    """

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)
    on_sleep: Callable[[int], None] | None = None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps) - 1)


@dataclass(frozen=True)
class Deadline:
    """The one time limit of an operation, started by the caller and handed down; never restarted."""

    timeout_s: float
    started: float
    clock: Clock

    @classmethod
    def after(cls, timeout_s: float, *, clock: Clock = SYSTEM_CLOCK) -> Deadline:
        return cls(timeout_s=timeout_s, started=clock.monotonic(), clock=clock)

    def remaining(self) -> float:
        return max(0.0, self.started + self.timeout_s - self.clock.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


@dataclass(frozen=True)
class Poll:
    """Polling intervals: start at `initial_s`, multiply by `factor` after each poll, cap at `max_s`."""

    initial_s: float = 0.25
    max_s: float = 2.0
    factor: float = 1.5


#: Fast first polls (an Accepted await is usually satisfied at once), then at most one poll per 2 s.
POLL: Final = Poll()


def backoff(poll: Poll = POLL) -> Iterator[float]:
    """The pauses between tries: `poll.initial_s`, then each `poll.factor` times the last, at most `poll.max_s`."""
    delay = poll.initial_s
    while True:
        yield delay
        delay = min(delay * poll.factor, poll.max_s)


# -- conditions ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """The verdict of a condition on one observation."""

    ok: bool
    detail: str
    #: True when the awaited state can no longer come (waiting further is pointless).
    fatal: bool = False
    #: With `fatal`: the error that ends the wait, when `AwaitFailed` is not the one (delete's
    #: `InUse` names the pods and the fix).
    error: Exception | None = None
    #: The progress line, where "waiting for <awaited>: <detail>" is not the one to report; "":
    #: nothing to report.
    progress: str | None = None


@dataclass(frozen=True)
class Condition(Generic[T]):
    """A named, pure check of one observation."""

    name: str
    check: Callable[[T], Seen]

    def __call__(self, observed: T) -> Seen:
        return self.check(observed)


def all_of(*conditions: Condition[T]) -> Condition[T]:
    """Every condition, in order; the first unmet one's `Seen` is the verdict."""

    def check(observed: T) -> Seen:
        seen = Seen(True, "nothing to wait for")
        for cond in conditions:
            seen = cond(observed)
            if not seen.ok:
                return seen
        return seen

    return Condition(" and ".join(c.name for c in conditions) or "nothing", check)


def wait(*, awaited: str, observe: Callable[[], T], condition: Condition[T], deadline: Deadline,
         poll: Poll = POLL, on_progress: Callable[[str], None] | None = None, hint: str = "",
         retried: tuple[type[Exception], ...] = (TemporaryError,)) -> T:
    """Observe until `condition` holds and return that observation.

    Raises `AwaitFailed` (or the verdict's `error`) when the condition says the state cannot come,
    `AwaitTimeout` when `deadline` passes (the message: what was `awaited`, what was last seen, and
    `hint`), and any error of `observe` but the `retried` ones (by default temporary API errors),
    which count as "could not observe". `on_progress` gets each new progress line.
    """
    pauses = backoff(poll)
    said = ""
    last: T | None = None
    while True:
        try:
            last = observe()
        except retried as exc:
            seen = Seen(False, f"could not observe: {exc}")
        else:
            seen = condition(last)
            if seen.ok:
                return last
            if seen.fatal:
                raise seen.error or AwaitFailed(awaited=awaited, seen=seen.detail, last=last)
        line = f"waiting for {awaited}: {seen.detail}" if seen.progress is None else seen.progress
        if line and line != said:
            said = line
            if on_progress is not None:
                on_progress(line)
        remaining = deadline.remaining()
        if remaining <= 0.0:
            raise AwaitTimeout(awaited=awaited, seen=seen.detail, timeout_s=deadline.timeout_s, last=last,
                               hint=hint)
        deadline.clock.sleep(min(next(pauses), remaining))


def retry(call: Callable[[], T], *, deadline: Deadline, poll: Poll = POLL,
          on_progress: Callable[[str], None] | None = None) -> T:
    """`call()`, tried again after each `TemporaryError` (the API server unreachable, overloaded or
    failing) until `deadline`; then that error is raised. The pauses are `wait`'s, or what the
    server asked for (the error's `delay_s`); `on_progress` hears of each new kind of failure, not
    of every try."""
    pauses = backoff(poll)
    said = ""
    while True:
        try:
            return call()
        except TemporaryError as exc:
            remaining = deadline.remaining()
            if remaining <= 0.0:
                raise
            if str(exc) != said:
                said = str(exc)
                if on_progress is not None:
                    on_progress(f"{exc}; trying again until the timeout ({deadline.timeout_s:.0f} s)")
            pause = next(pauses)  # taken whether or not the server named its own
            deadline.clock.sleep(min(exc.delay_s or pause, remaining))


# -- what is observed ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One observation of a ComputeDomain and its channel claim, as plain API objects (None: absent)."""

    namespace: str
    name: str
    claim_name: str
    cd: Obj | None = None
    claim: Obj | None = None
    crd: Obj | None = None
    #: False when the CRD could not be read (no RBAC on CRDs): then it is not part of the verdict.
    crd_readable: bool = True
    #: Whose objects these are: nvlfabric's (a ComputeDomain and its ResourceClaim) or, on the
    #: nvidia backend, NVIDIA's (its ComputeDomain and the ResourceClaimTemplate its controller makes).
    crd_name: str = CRD_NAME
    crd_hint: str = "install nvlfabric's CRDs first"
    claim_kind: str = "ResourceClaim"

    @property
    def cd_ref(self) -> str:
        return f"ComputeDomain {self.namespace}/{self.name}"

    @property
    def claim_ref(self) -> str:
        return f"{self.claim_kind} {self.namespace}/{self.claim_name}"


def _get(obj: Obj | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _crd_established(s: Snapshot) -> Seen:
    if not s.crd_readable:
        return Seen(True, f"CRD {s.crd_name} not readable with these credentials (not checked)")
    if s.crd is None:
        return Seen(False, f"CRD {s.crd_name} is not installed ({s.crd_hint})")
    for cond in _get(s.crd, "status", "conditions") or []:
        if cond.get("type") == "Established":
            if cond.get("status") == "True":
                return Seen(True, f"CRD {s.crd_name} established")
            return Seen(False, f"CRD {s.crd_name} not established: {cond.get('message') or cond.get('reason')}")
    return Seen(False, f"CRD {s.crd_name} not established yet")


def _exists(ref: str, obj: Obj | None) -> Seen:
    if obj is None:
        return Seen(False, f"{ref} does not exist")
    if _get(obj, "metadata", "deletionTimestamp"):
        return Seen(False, f"{ref} is being deleted", fatal=True)
    return Seen(True, f"{ref} exists")


def describe_claim(s: Snapshot) -> str:
    """The channel claim's allocation state in a few words."""
    claim = s.claim
    if claim is None:
        return f"claim {s.namespace}/{s.claim_name} does not exist"
    ref = f"claim {s.namespace}/{s.claim_name}"
    results = _get(claim, "status", "allocation", "devices", "results") or []
    if not results:
        return f"{ref} not allocated yet (no pod that uses it has been scheduled)"
    devices = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in results)
    users = sum(1 for c in _get(claim, "status", "reservedFor") or [] if c.get("resource") == "pods")
    return f"{ref} allocated ({devices}), reserved for {users} pod{'s' if users != 1 else ''}"


def describe_status(s: Snapshot) -> str:
    """What the ComputeDomain's status says: phase, members, the first member not ready, the claim."""
    status = _get(s.cd, "status") or {}
    parts = [f"phase {status.get('phase') or 'Pending (not reported yet)'}"]
    nodes = status.get("nodes") or []
    ready = sum(1 for n in nodes if n.get("ready") is True)
    total = len(nodes)
    if not nodes and status.get("totalNodes") is not None:
        ready, total = int(status.get("readyNodes") or 0), int(status["totalNodes"])
    wanted = _get(s.cd, "spec", "numNodes")
    members = f"{ready} of {total} nodes ready" if total else "no member nodes reported yet"
    if isinstance(wanted, int) and wanted > total:
        members += f" (numNodes {wanted})"
    parts.append(members)
    laggard = next((n for n in nodes if n.get("ready") is not True), None)
    if laggard is not None:
        parts.append(f"node {laggard.get('name')}: {laggard.get('message') or 'not ready'}")
    parts.append(describe_claim(s))
    return "; ".join(parts)


def _ready_condition_message(cd: Obj | None) -> str:
    for cond in _get(cd, "status", "conditions") or []:
        if cond.get("type") == "Ready" and cond.get("message"):
            return str(cond["message"])
    return "no reason given"


def _cd_ready(s: Snapshot) -> Seen:
    generation = _get(s.cd, "metadata", "generation")
    observed = _get(s.cd, "status", "observedGeneration")
    phase = _get(s.cd, "status", "phase")
    if observed is None or observed != generation:
        lag = ("status not reported yet" if observed is None
               else f"status is for generation {observed}, the spec is at generation {generation}")
        return Seen(False, f"{lag}; {describe_status(s)}")
    if phase == Phase.READY:
        return Seen(True, describe_status(s))
    if phase == Phase.FAILED:
        return Seen(False, f"phase Failed: {_ready_condition_message(s.cd)}", fatal=True)
    return Seen(False, describe_status(s))


def _nvidia_ready(s: Snapshot) -> Seen:
    """NVIDIA's global status (its controller: Ready once every listed daemon is, and at least
    numNodes are listed), in the same words as ours."""
    status = nvidia.DomainStatus.model_validate(_get(s.cd, "status") or {})
    wanted = int(_get(s.cd, "spec", "numNodes") or 0)
    ready = sum(1 for n in status.nodes if n.status == nvidia.READY)
    members = f"{ready} of {len(status.nodes)} IMEX daemons ready" if status.nodes else "no IMEX daemon reported yet"
    if wanted > len(status.nodes):
        members += f" (numNodes {wanted})"
    laggard = next((n.name for n in status.nodes if n.status != nvidia.READY), None)
    seen = f"status {status.status}; {members}" + (f"; node {laggard} not ready" if laggard else "")
    return Seen(status.status == nvidia.READY and len(status.nodes) >= wanted, seen)


CRD_ESTABLISHED: Final = Condition[Snapshot]("CRD established", _crd_established)
CD_EXISTS: Final = Condition[Snapshot]("ComputeDomain exists", lambda s: _exists(s.cd_ref, s.cd))
CLAIM_EXISTS: Final = Condition[Snapshot]("channel claim exists", lambda s: _exists(s.claim_ref, s.claim))
CD_READY: Final = Condition[Snapshot]("ComputeDomain Ready at its generation", _cd_ready)


class AwaitFor(StrEnum):
    """What create and update wait for (the `await_for` input)."""

    NONE = "None"
    ACCEPTED = "Accepted"
    READY = "Ready"


#: The readiness table: what each `AwaitFor` level waits for, in order.
READINESS: Final[Mapping[AwaitFor, tuple[Condition[Snapshot], ...]]] = MappingProxyType({
    AwaitFor.NONE: (),
    AwaitFor.ACCEPTED: (CRD_ESTABLISHED, CD_EXISTS, CLAIM_EXISTS),
    AwaitFor.READY: (CRD_ESTABLISHED, CD_EXISTS, CLAIM_EXISTS, CD_READY),
})


NVIDIA_READY: Final = Condition[Snapshot]("NVIDIA's ComputeDomain Ready", _nvidia_ready)
NVIDIA_READINESS: Final[Mapping[AwaitFor, tuple[Condition[Snapshot], ...]]] = MappingProxyType({
    AwaitFor.NONE: (),
    AwaitFor.ACCEPTED: (CRD_ESTABLISHED, CD_EXISTS, CLAIM_EXISTS),
    AwaitFor.READY: (CRD_ESTABLISHED, CD_EXISTS, CLAIM_EXISTS, NVIDIA_READY),
})


def readiness(level: AwaitFor, table: Mapping[AwaitFor, tuple[Condition[Snapshot], ...]] = READINESS,
              ) -> Condition[Snapshot]:
    """The table row for `level` as one condition."""
    return all_of(*table[level])


def awaited(s: Snapshot, level: AwaitFor) -> str:
    """'ComputeDomain ml/train to be Ready'."""
    return f"{s.cd_ref} to be {level.value}"


# -- deletion ------------------------------------------------------------------------------------------


def still_there(ref: str, obj: Obj) -> str:
    """Why an object that should be gone is still there: not marked for deletion yet, or held by its finalizers."""
    finalizers: Sequence[str] = _get(obj, "metadata", "finalizers") or []
    if not _get(obj, "metadata", "deletionTimestamp"):
        return f"{ref} is not marked for deletion yet"
    if finalizers:
        return (f"{ref} is marked for deletion but still has finalizers {', '.join(finalizers)} "
                "(the controllers that set them must remove them; remove them by hand only if those "
                "controllers are gone)")
    return f"{ref} is marked for deletion"


def deleted(*, claim_may_linger: bool = False) -> Condition[Snapshot]:
    """Both the ComputeDomain and its claim are gone.

    `claim_may_linger`: a claim already marked for deletion counts as gone (a forced delete: the
    claim's own protection keeps it until the pods still using it stop).
    """

    def check(s: Snapshot) -> Seen:
        left = []
        if s.cd is not None:
            left.append(still_there(s.cd_ref, s.cd))
        if s.claim is not None and not (claim_may_linger and _get(s.claim, "metadata", "deletionTimestamp")):
            left.append(still_there(s.claim_ref, s.claim))
        return Seen(not left, "; ".join(left) or "both are gone")

    return Condition("deleted", check)


def awaited_deletion(s: Snapshot) -> str:
    """'ComputeDomain ml/train and its ResourceClaim ml/train-channel to be deleted'."""
    return f"{s.cd_ref} and its {s.claim_ref} to be deleted"
