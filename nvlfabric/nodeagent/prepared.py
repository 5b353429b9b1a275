"""The prepared claims of this node: the checkpoint, and the files on disk each entry stands for.

Each checkpoint transition (checkpointstate.py) is saved before the step it guards: PrepareStarted
before any side effect, PrepareCompleted once the channel device nodes under the driver root and the
claim's CDI spec are written, and on unprepare the entry goes last, after its files, so an agent
killed at any point finishes the job when the kubelet retries. The driver (driver.py) orders these
steps around the IMEX domain and the status report; this module does not talk to the API server.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from nvlfabric.api import names
from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.nodeagent import cdi, checkpoint
from nvlfabric.nodeagent.claims import PrepareError, claim_name, is_uid

__all__ = ["Paths", "PreparedClaims"]

log = logging.getLogger("nvlfabric.nodeagent.driver")  # the driver's log: its lines keep their logger name


@dataclass(frozen=True)
class Paths:
    plugin_dir: Path
    cdi_dir: Path
    driver_root: Path
    proc_devices: Path = Path("/proc/devices")
    boot_id: Path = checkpoint.DEFAULT_BOOT_ID_PATH

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def imex_workdir(self) -> Path:
        return self.plugin_dir / "imex"


def devices(entry: checkpoint.ClaimEntry, pool: str, device: str, request: str) -> list[PreparedDevice]:
    """The kubelet's answer for a completed entry: the pool device, for `request`."""
    return [PreparedDevice((request,), pool, device, entry.cdi_device_ids)]


class PreparedClaims:
    """The checkpoint (`state`, replaced on every save, never modified) and the claims' files.
    Not thread-safe: the driver's lock serialises every call."""

    def __init__(self, paths: Paths, clock: Callable[[], datetime]) -> None:
        self.paths = paths
        self.clock = clock
        paths.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.state, report = checkpoint.load(paths.checkpoint, paths.boot_id, clock=clock)
        if not report.ok:
            log.warning("checkpoint: %s", report)
        self._answers: dict[str, str] = {}
        """Completed claims this process has answered, with the request name they were answered for:
        the warm path rebuilds its reply from the entry (`answered`). Only the (interned) name is
        kept: the agent holds one of these per claim, under a memory budget."""
        self._major: int | None = None

    def save(self, cp: checkpoint.Checkpoint) -> None:
        checkpoint.save(self.paths.checkpoint, cp)
        self.state = cp

    # -- answers -------------------------------------------------------------------------------

    def answered(self, c: ClaimRef) -> list[PreparedDevice] | None:
        """The warm path: the claim is PrepareCompleted under this UID, was answered before by this
        process, and its CDI spec and channel nodes are present → the same devices, without the API
        server. The UID is the proof: UIDs are never reused, the kubelet fetched the claim and
        compared its UID itself before calling, and the entry records that this agent validated
        exactly that object. (After a restart the first answer per claim takes the full path, which
        rebuilds the answer and anything missing on disk.)"""
        entry = self.state.get(c.uid)
        if entry is None or entry.state is not checkpoint.ClaimState.PREPARE_COMPLETED or \
                (entry.claim.namespace, entry.claim.name) != (c.namespace, c.name):
            return None
        request = self._answers.get(c.uid)
        if request is None or not entry.allocation.device or not self._on_disk(entry):
            return None
        pool, _, dev = entry.allocation.device.partition("/")
        return devices(entry, pool, dev, request)

    def answer(self, entry: checkpoint.ClaimEntry, pool: str, device: str, request: str) -> list[PreparedDevice]:
        """Remember that `entry` was answered for `request`, and the answer."""
        self._answers[entry.uid] = sys.intern(request)
        return devices(entry, pool, device, request)

    def forget(self, uid: str) -> None:
        """The claim is being unprepared: its next prepare takes the full path."""
        self._answers.pop(uid, None)

    def forget_answers(self) -> None:
        """Every claim is validated again at its next prepare (the node's clique changed)."""
        self._answers.clear()

    # -- prepare -------------------------------------------------------------------------------

    def completed_as(self, uid: str, allocation: checkpoint.Allocation) -> bool:
        """The claim is prepared here (PrepareCompleted) with this very allocation."""
        entry = self.state.get(uid)
        return entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED and \
            entry.allocation.same_as(allocation)

    def replace_changed(self, c: ClaimRef, allocation: checkpoint.Allocation) -> checkpoint.ClaimEntry | None:
        """The entry for `c`, unless it was deallocated and allocated anew (same UID) while prepared
        or half-prepared here: then the old channel's node and spec go, and None (prepare afresh)."""
        if (old := self.state.get(c.uid)) is not None and old.allocation.every_channel_of_the_node:
            self.narrow_every_channel([old])  # not done at start (it failed): now, before comparing
        entry = self.state.get(c.uid)
        if entry is None or entry.state is checkpoint.ClaimState.PREPARE_ABORTED or \
                entry.allocation.same_as(allocation):
            return entry
        log.warning("claim %s: allocation changed from channels %s to %s; preparing the new one", claim_name(c),
                    list(entry.allocation.channels), [names.channel_of_device(allocation.device.partition("/")[2])])
        self.undo(entry)
        self.save(checkpoint.remove(self.state, c.uid))
        self._answers.pop(c.uid, None)
        return None

    def start(self, c: ClaimRef, allocation: checkpoint.Allocation) -> None:
        """Record PrepareStarted (before any side effect); a stale retry of an aborted prepare is refused."""
        ref = checkpoint.ClaimRef(uid=c.uid, namespace=sys.intern(c.namespace), name=c.name)
        try:
            self.save(checkpoint.start_prepare(self.state, ref, allocation, now=self.clock()))
        except checkpoint.StalePrepareRejected as exc:
            raise PrepareError(f"claim {claim_name(c)}: {exc}") from exc

    def complete(self, uid: str, allocation: checkpoint.Allocation) -> checkpoint.ClaimEntry:
        """Write the claim's files, then record PrepareCompleted; returns the completed entry."""
        written = self.write_files(uid, allocation)
        self.save(checkpoint.complete_prepare(self.state, uid, cdi_spec_file=str(written.path),
                                              cdi_device_ids=written.device_ids, now=self.clock()))
        entry = self.state.get(uid)
        assert entry is not None
        return entry

    def adopt(self, ref: checkpoint.ClaimRef, allocation: checkpoint.Allocation) -> None:
        """Record a claim found prepared on disk as completed (recovery), its files rewritten."""
        cp = checkpoint.start_prepare(self.state, ref, allocation, now=self.clock())
        written = self.write_files(ref.uid, allocation)
        self.save(checkpoint.complete_prepare(cp, ref.uid, cdi_spec_file=str(written.path),
                                              cdi_device_ids=written.device_ids, now=self.clock()))

    def restore(self, entry: checkpoint.ClaimEntry) -> None:
        """Put back a completed claim's channel nodes and CDI spec if something removed them (idempotent)."""
        written = self.write_files(entry.uid, entry.allocation)
        if written.changed:
            log.warning("claim %s: its CDI spec %s was missing or different; rewritten", entry.uid, written.path)

    def write_files(self, uid: str, allocation: checkpoint.Allocation) -> cdi.SpecWrite:
        """The claim's channel device nodes under the driver root and its CDI spec (idempotent)."""
        major = self._channel_major()
        for ch in allocation.channels:
            cdi.channel_device_node(self.paths.driver_root, ch, major)
        return cdi.write_claim_spec(self.paths.cdi_dir, uid, cdi.claim_spec(
            claim_uid=uid, channels=allocation.channels, major=major, compute_domain=allocation.compute_domain_name,
            channel_set=allocation.all_channels))

    # -- upgrade: allocation mode All as agents before issue 49 prepared it ------------------------

    def narrow_every_channel(self, entries: list[checkpoint.ClaimEntry] | None = None) -> list[str]:
        """Entries an earlier agent wrote for allocation mode All hold every channel of the node
        (0..2047), other ComputeDomains' included: each becomes its claim's own channel (the pool
        device it records), and a completed or half-prepared claim's CDI spec is rewritten first,
        atomically, under the device ID the kubelet already holds (`<uid>-channels`). Then one save.
        Killed in between, the next start does it again (the spec is already right, so unchanged).
        Running containers keep the device nodes they started with until they restart, and no IMEX
        daemon is touched; the other channels' nodes under the driver root go with recovery's sweep
        of unused nodes. Returns the claim UIDs narrowed. Called at agent start, before the kubelet
        can call (and by `replace_changed` should that have failed)."""
        narrowed: list[checkpoint.ClaimEntry] = []
        for entry in self.state.claims if entries is None else entries:
            if not entry.allocation.every_channel_of_the_node:
                continue
            pool_device = entry.allocation.device.partition("/")[2]
            channel = names.channel_of_device(pool_device) if pool_device else None
            if channel is None:  # every agent that wrote All recorded the device (it came with All)
                log.warning("claim %s: holds every channel of the node (an earlier agent's allocation mode All) "
                            "but records no pool device to narrow it to; its next prepare re-validates it",
                            entry.uid)
                continue
            allocation = dataclasses.replace(entry.allocation, channels=(channel,), all_channels=True)
            fresh = dataclasses.replace(entry, allocation=allocation)
            if entry.state is not checkpoint.ClaimState.PREPARE_ABORTED and (
                    entry.state is checkpoint.ClaimState.PREPARE_COMPLETED or
                    (self.paths.cdi_dir / cdi.spec_file_name(entry.uid)).exists()):
                written = self.write_files(entry.uid, allocation)
                if entry.state is checkpoint.ClaimState.PREPARE_COMPLETED:
                    if written.device_ids != entry.cdi_device_ids:  # the set's name never changed: cannot happen
                        log.error("claim %s: its CDI device was %s, narrowed it is %s; a container of it that "
                                  "restarts will not find its device", entry.uid, ", ".join(entry.cdi_device_ids),
                                  ", ".join(written.device_ids))
                    fresh = dataclasses.replace(fresh, cdi_spec_file=str(written.path),
                                                cdi_device_ids=written.device_ids)
            narrowed.append(fresh)
        if not narrowed:
            return []
        cp = self.state
        for fresh in narrowed:
            cp = checkpoint.rewrite(cp, fresh)
        self.save(cp)
        for fresh in narrowed:
            log.warning("claim %s/%s (%s, %s): narrowed from every channel of the node (0-%d, as an earlier agent "
                        "prepared allocation mode All) to channel %d of its ComputeDomain %s; CDI spec and "
                        "checkpoint entry rewritten, CDI device %s; running containers keep their devices "
                        "until they restart, IMEX daemons untouched", fresh.claim.namespace, fresh.claim.name,
                        fresh.uid, fresh.state.value, names.IMEX_CHANNEL_COUNT - 1, fresh.allocation.channels[0],
                        fresh.allocation.compute_domain_name, ", ".join(fresh.cdi_device_ids) or "-")
        return [e.uid for e in narrowed]

    def _on_disk(self, entry: checkpoint.ClaimEntry) -> bool:
        """The completed claim's CDI spec and channel nodes are still there (two stats)."""
        return os.path.exists(entry.cdi_spec_file) and all(
            os.path.exists(cdi.host_channel_path(self.paths.driver_root, ch)) for ch in entry.allocation.channels)

    def _channel_major(self) -> int:
        if self._major is None:
            self._major = cdi.read_major(self.paths.proc_devices, names.IMEX_CHANNEL_DEVICE)
        return self._major

    # -- unprepare -----------------------------------------------------------------------------

    def remove_unknown(self, c: ClaimRef) -> None:
        """A claim not in the checkpoint (it was lost, or rebuilt without this claim): whatever of it is
        still on disk goes, so nothing leaks. (A malformed UID names no file.)"""
        if is_uid(c.uid) and cdi.remove_claim_spec(self.paths.cdi_dir, c.uid):
            log.warning("claim %s was not in the checkpoint but its CDI spec was on disk; removed it", claim_name(c))
            self.sweep_channel_nodes()

    def undo(self, entry: checkpoint.ClaimEntry) -> None:
        """Remove the claim's CDI spec and the channel nodes no other (started or completed) claim uses."""
        cdi.remove_claim_spec(self.paths.cdi_dir, entry.uid)
        still_used = {ch for e in self.state.claims if e.uid != entry.uid
                      and e.state is not checkpoint.ClaimState.PREPARE_ABORTED for ch in e.allocation.channels}
        for ch in entry.allocation.channels:
            if ch not in still_used:
                cdi.release_channel_device_node(self.paths.driver_root, ch)

    def last_of_domain(self, entry: checkpoint.ClaimEntry) -> bool:
        """No other completed claim here is of `entry`'s ComputeDomain (its status entry may go)."""
        uid = entry.allocation.compute_domain_uid
        return not any(e.allocation.compute_domain_uid == uid and e.uid != entry.uid
                       for e in self.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED))

    def sweep_channel_nodes(self) -> list[int]:
        """Remove channel nodes under the driver root that no (started or completed) claim uses:
        the agent is their only creator, so an unused one is a leftover."""
        used = {ch for e in self.state.claims if e.state is not checkpoint.ClaimState.PREPARE_ABORTED
                for ch in e.allocation.channels}
        gone = [ch for ch in cdi.channel_device_nodes(self.paths.driver_root) if ch not in used]
        for ch in gone:
            cdi.release_channel_device_node(self.paths.driver_root, ch)
        return gone

    def expire_aborted(self) -> None:
        """Drop aborted entries whose stale-prepare window ended."""
        cp = checkpoint.expire_aborted(self.state, now=self.clock())
        if cp != self.state:
            self.save(cp)
