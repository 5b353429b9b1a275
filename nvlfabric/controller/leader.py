"""Leader election on a coordination.k8s.io/v1 Lease: one controller replica works, the others wait.

Only the holder of the Lease (`nvlfabric-system/nvlfabric-controller` in the Deployment) runs the
passes and the Reserver; a standby reads the Lease every `retry_s` and takes it once it has not
been renewed for `duration_s`. Timings (defaults in the controller's settings, `__main__.py`):

- `duration_s` (10): how long a Lease nobody renews still holds; the worst-case failover after the
  leader dies is about duration + retry.
- `renew_s` (3): how often the holder renews.
- `deadline_s` (7): a holder that could not renew for this long stops working (below the duration,
  so it has stopped before a standby can take the Lease over).
- `retry_s` (2): how often a standby reads the Lease, and how soon a holder retries a failed renew.

Expiry is judged on the reader's own monotonic clock: a Lease is expired when the same record
(its resourceVersion) has been seen unchanged for `duration_s`, never by comparing the holder's
`renewTime` with our wall clock (client-go does the same), so clock skew between nodes does not
matter. The cost: a standby that starts next to a long-dead holder waits one duration first.

Writes are optimistic: a renew or takeover replaces the Lease at the resourceVersion read, so
when two replicas race, the API server lets one win (`errors.Conflict` for the other; a create
race is `errors.AlreadyExists`), and the loser reads again. `decide` is pure and table-tested.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from lightkube import Client
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from nvlfabric.api import errors
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.controller.leader")


@dataclass(frozen=True)
class Timings:
    duration_s: float
    renew_s: float
    deadline_s: float
    retry_s: float


@dataclass(frozen=True)
class Seen:
    """The Lease as `decide` needs it."""

    holder: str  # "" when released or never held
    duration_s: float
    since: float  # our monotonic time when this record (resourceVersion) was first read


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, holding it
    TAKE = "take"  # free or expired: take it over
    RENEW = "renew"  # ours: renew it
    WAIT = "wait"  # another holder's, still valid


def decide(lease: Seen | None, now: float, identity: str) -> Action:
    """What a replica called `identity` does with the Lease as read (pure)."""
    if lease is None:
        return Action.CREATE
    if lease.holder == identity:
        return Action.RENEW
    if not lease.holder or now - lease.since >= lease.duration_s:
        return Action.TAKE
    return Action.WAIT


def lost(last_renewed: float, now: float, deadline_s: float) -> bool:
    """Whether a holder whose last successful renew was at `last_renewed` must stop (pure)."""
    return now - last_renewed > deadline_s


class Elector:
    """The I/O around `decide`: one Lease, one identity."""

    def __init__(self, client: Client, *, name: str, namespace: str, identity: str,
                 timings: Timings, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.name, self.namespace, self.identity = client, name, namespace, identity
        self.timings, self.clock = timings, clock
        self.leading = False
        self.holder = ""  # who holds the Lease as last read
        self.last_renewed = float("-inf")  # when we last wrote the Lease as holder
        self.last_read = float("-inf")  # when a read (or write) of the Lease last succeeded
        self._version: str | None = None
        self._since = 0.0

    def _read(self) -> Lease | None:
        try:
            with api_call(f"read Lease {self.namespace}/{self.name}"):
                lease = self.client.get(Lease, self.name, namespace=self.namespace)
        except errors.NotFound:
            return None
        version = lease.metadata.resourceVersion if lease.metadata else None
        now = self.clock()
        if version != self._version:
            self._version, self._since = version, now
        self.last_read = now
        return lease

    def _body(self, old: Lease | None, now: datetime) -> Lease:
        spec = old.spec if old is not None and old.spec is not None else LeaseSpec()
        ours = spec.holderIdentity == self.identity
        transitions = (spec.leaseTransitions or 0) + (0 if ours or old is None else 1)
        return Lease(
            metadata=ObjectMeta(name=self.name, namespace=self.namespace,
                                resourceVersion=old.metadata.resourceVersion if old and old.metadata else None),
            spec=LeaseSpec(holderIdentity=self.identity, leaseDurationSeconds=max(1, round(self.timings.duration_s)),
                           acquireTime=spec.acquireTime if ours and spec.acquireTime else now, renewTime=now,
                           leaseTransitions=transitions))

    def try_once(self) -> bool:
        """Read the Lease and act on it; whether we hold it now. API errors are logged, not raised
        (a holder's `lost` deadline decides what they mean)."""
        try:
            lease = self._read()
            spec = lease.spec if lease is not None and lease.spec is not None else None
            self.holder = (spec.holderIdentity or "") if spec else ""
            seen = None if lease is None else Seen(
                self.holder, float(spec.leaseDurationSeconds or self.timings.duration_s) if spec else 0.0, self._since)
            action = decide(seen, self.clock(), self.identity)
            if action is Action.WAIT:
                self.leading = False
                return False
            body = self._body(lease, datetime.now(UTC))
            with api_call(f"{action.value} Lease {self.namespace}/{self.name}"):
                out = (self.client.create(body) if action is Action.CREATE else self.client.replace(body))
        except (errors.Conflict, errors.AlreadyExists):
            log.info("Lease %s/%s: another replica wrote it first; reading it again", self.namespace, self.name)
            return self.leading
        except errors.NvlfabricError as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return self.leading
        now = self.clock()
        self._version, self._since = (out.metadata.resourceVersion if out.metadata else None), now
        self.last_renewed = self.last_read = now
        if not self.leading:
            log.info("Lease %s/%s: %s is the leader now (%s)", self.namespace, self.name, self.identity, action.value)
        self.leading, self.holder = True, self.identity
        return True

    def release(self) -> None:
        """Give the Lease up (a clean stop): a standby takes it at its next read, not a duration later."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = self._read()
            if lease is None or lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            lease.spec.holderIdentity, lease.spec.leaseDurationSeconds = None, 1
            lease.spec.renewTime = datetime.now(UTC)
            with api_call(f"release Lease {self.namespace}/{self.name}"):
                self.client.replace(lease)
            log.info("Lease %s/%s released", self.namespace, self.name)
        except errors.NvlfabricError as exc:
            log.warning("Lease %s/%s: could not release it: %s", self.namespace, self.name, exc)

    def lead(self, work: Callable[[Callable[[], bool]], None], stop: threading.Event,
             on_tick: Callable[[], None] = lambda: None) -> bool:
        """Wait as standby until we hold the Lease, then run `work(should_stop)` in a thread while
        renewing. True: `stop` was set (the Lease is released); False: leadership was lost (renews
        failed past the deadline, another replica holds the Lease, or `work` ended by itself): the
        caller exits, so that the kubelet restarts it as a standby."""
        t = self.timings
        while not stop.is_set():
            on_tick()
            if self.try_once():
                break
            stop.wait(t.retry_s)
        if stop.is_set():
            return True
        done = threading.Event()
        worker = threading.Thread(target=work, args=(lambda: stop.is_set() or done.is_set(),), name="leader-work",
                                  daemon=True)
        worker.start()
        try:
            while not stop.wait(t.renew_s if self.clock() - self.last_renewed < t.retry_s else t.retry_s):
                on_tick()
                if not worker.is_alive():
                    log.error("the controller's work ended while leading; giving up the Lease")
                    self.release()
                    return False
                self.try_once()
                if not self.leading:
                    log.error("Lease %s/%s is held by %s now: stopping", self.namespace, self.name,
                              self.holder or "nobody")
                    return False
                if lost(self.last_renewed, self.clock(), t.deadline_s):
                    log.error("Lease %s/%s: not renewed for %.0f s: stopping", self.namespace, self.name,
                              self.clock() - self.last_renewed)
                    self.leading = False
                    return False
            self.release()
            return True
        finally:
            done.set()
