"""Kueue admits a job only once nvlfabric can place it: an AdmissionCheck this controller answers.

Why: Kueue admits by quota, counting the pods' requests (`nvidia.com/gpu`); it sees no NVLink
cliques, and its topology-aware scheduling does not work with DRA claims yet
(kubernetes-sigs/kueue#10548). A job over four cliques that Kueue admits on quota alone may have
no four cliques with room: its pods then wait gated while it holds quota other jobs could use,
and two such jobs each half placed wait for each other. So a ClusterQueue that queues nvlfabric
jobs lists an AdmissionCheck whose `controllerName` is `nvlfabric.io/placement`, and Kueue admits
a workload once its quota is reserved *and* this check is Ready. The design choice and the
alternatives (Kueue TAS with the clique label as a topology level) are in docs/architecture.md,
"Kueue".

For each Workload with its quota reserved and this check Pending:
- its groups: per pod set, the channel claim of a ComputeDomain its pod template names
  (`resourceClaimName`; BoundJob's JobSet over a MultiClique domain is one pod set per clique
  group), with the pod set's count, GPUs per pod and node selector; pod sets that name none are
  not nvlfabric's to place;
- placement (placer.py) places them all at once as it places a gated job (`Placer.admit`): each
  group in a clique of its own with room and a free channel, or none. Placed: the check is Ready, each pod
  set's `podSetUpdates` carry `nodeSelector: {nvlfabric.io/clique: <clique>}`, and the room is held
  for the pods that Kueue's unsuspending will create. No room: Retry, saying why; Kueue then gives
  the quota back and requeues the workload, so a job that cannot be placed never holds quota
  while others wait, and it is tried again as quota and room come back;
- the state is written by server-side apply of the Workload's status under this controller's
  field manager, owning its one entry of `status.admissionChecks` (a list keyed by name), as
  Kueue's own check controllers do.

Every AdmissionCheck of this controllerName is marked Active. Workloads and checks are read from
informers, so a pass costs no request; a workload answered Retry waits a back-off before it is
placed again, unless room comes back (`Admitter`). A cluster without Kueue costs one failed list a
minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import Client
from lightkube.types import PatchType

from nvlfabric.api import errors
from nvlfabric.api.names import CLIQUE_LABEL, KUEUE_API_VERSION, PLACEMENT_CHECK_CONTROLLER
from nvlfabric.controller import placement
from nvlfabric.controller.cache import AdmissionCheck, KueueInformers, Workload
from nvlfabric.controller.events import event
from nvlfabric.controller.placer import NO_ROOM_EVENT_S, Placer
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.admission")

POLL_S = 1.0
"""Passes are at least this far apart (a burst of changes is one pass)."""
WAKE_S = 10.0
"""... and at most this far, changes or not, while Kueue is installed."""
RETRY_MAX_S = 30.0
"""The longest a workload answered Retry waits before it is placed again (room freed ends it sooner)."""
ABSENT_POLL_S = 60.0
"""How often whether Kueue is installed is looked at, while it is not."""
FIELD_MANAGER = PLACEMENT_CHECK_CONTROLLER


@dataclass(frozen=True)
class Verdict:
    """What the check says of a workload: Pending (cannot judge yet), Ready or Retry."""

    state: str
    message: str
    node_selectors: Mapping[str, Mapping[str, str]] | None = None  # pod set → its nodeSelector update


def condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def pending_check(workload: Mapping[str, Any], checks: Iterable[str]) -> str | None:
    """The name of this controller's check that waits on the workload (pure): the workload has its
    quota reserved, is not admitted yet, and lists one of `checks` in state Pending."""
    if not condition_true(workload, "QuotaReserved") or condition_true(workload, "Admitted"):
        return None
    ours = set(checks)
    for state in (workload.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") in ours and state.get("state") == "Pending":
            return str(state["name"])
    return None


def groups_of(workload: Mapping[str, Any], is_channel_claim: Callable[[str, str], bool]
              ) -> tuple[list[tuple[str, placement.Group]], list[Mapping[str, str]]]:
    """The workload's pod sets that nvlfabric places, each as (pod set name, group), and the
    tolerations of the first of them (pure). `is_channel_claim(namespace, name)`: whether a claim
    is a ComputeDomain's channel claim."""
    meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
    namespace = meta.get("namespace") or "default"
    out: list[tuple[str, placement.Group]] = []
    tolerations: list[Mapping[str, str]] = []
    for pod_set in spec.get("podSets") or []:
        tpl_spec = ((pod_set.get("template") or {}).get("spec")) or {}
        claims = [c["resourceClaimName"] for c in tpl_spec.get("resourceClaims") or [] if c.get("resourceClaimName")]
        mine = [c for c in claims if is_channel_claim(namespace, c)]
        if not mine:
            continue
        if not out:
            tolerations = [{k: str(v) for k, v in t.items()} for t in tpl_spec.get("tolerations") or []]
        out.append((str(pod_set.get("name") or ""), placement.Group(
            (namespace, mine[0]), int(pod_set.get("count") or 1), placement.gpus_of({"spec": tpl_spec}),
            dict(tpl_spec.get("nodeSelector") or {}))))
    return out, tolerations


def judge(groups: Sequence[tuple[str, placement.Group]],
          placed: Mapping[tuple[str, str], str] | placement.NoRoom | str) -> Verdict:
    """The check's state from where placement put the groups (pure)."""
    if isinstance(placed, placement.NoRoom):
        return Verdict("Retry", f"nvlfabric cannot place the job now: {placed.message()}; Kueue requeues it "
                                "and its quota is free for others meanwhile")
    if isinstance(placed, str):
        return Verdict("Pending", f"nvlfabric waits: {placed}")
    selectors = {name: {CLIQUE_LABEL: placed[g.key]} for name, g in groups}
    where = ", ".join(f"{name} in clique {placed[g.key]}" for name, g in groups)
    return Verdict("Ready", f"placed by nvlfabric: {where}" if where else "nothing for nvlfabric to place",
                   selectors)


def check_patch(workload: Mapping[str, Any], check: str, verdict: Verdict, now: datetime) -> dict[str, Any]:
    """The server-side apply body of the workload's status setting this check's state (pure)."""
    meta = workload.get("metadata") or {}
    state: dict[str, Any] = {"name": check, "state": verdict.state, "message": verdict.message[:1024],
                             "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if verdict.node_selectors:
        state["podSetUpdates"] = [{"name": name, "nodeSelector": dict(sel)}
                                  for name, sel in verdict.node_selectors.items()]
    return {"apiVersion": KUEUE_API_VERSION, "kind": "Workload",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            "status": {"admissionChecks": [state]}}


def retry_after_s(failures: int) -> float:
    """How long a workload that could not be placed `failures` times in a row waits before it is
    placed again, unless room is freed first: 1, 2, 4 ... RETRY_MAX_S."""
    return float(min(RETRY_MAX_S, 2 ** max(0, failures - 1)))


def frees_room(old: Any, new: Any) -> bool:
    """Whether an informer change gives GPUs or a channel back (a bound pod gone or finished; a
    claim deleted or deallocated): what ends the waiting workloads' back-off. Records compare
    as cache.py keeps them: (node, gpus, finished) for pods, ClaimRecord for claims."""
    if old is None:
        return False
    if new is None:
        return True
    if isinstance(old, tuple):  # a bound pod: (node, gpus, finished)
        return bool(new[2]) and not old[2]
    return getattr(old, "allocation", None) is not None and getattr(new, "allocation", None) is None


class Admitter:
    """Answers this controller's Kueue admission checks, placing through `placer` (the same
    placement as the reservation passes', never the reservation writer).

    Workloads and AdmissionChecks come from informers (a list and a watch each, started once
    Kueue's API is served), so a pass reads memory, not the API server. A pass runs when either
    changes, and at least every WAKE_S. A workload answered Retry is placed again only after its
    back-off (`retry_after_s`), or as soon as a pod or claim gives room back: without it each
    waiting workload cost a placement and a status write per second (Kueue resets Retry to
    Pending as it requeues)."""

    def __init__(self, client: Client, placer: Placer) -> None:
        self.client, self.placer = client, placer
        self.kueue = KueueInformers.of(client)
        self._wake = threading.Event()
        for inf in self.kueue.all():
            inf.listen(lambda kind, key, old, new: self._wake.set())
        for room in (placer.cache.bound_pods, placer.cache.claims):
            room.listen(self._room_changed)
        self._said: dict[tuple[str, str], tuple[str, str]] = {}  # workload → (state, message) last written
        self._told: dict[tuple[str, str], tuple[str, float]] = {}  # workload → (Event message, when) of its last
        self._waiting: dict[tuple[str, str], tuple[int, float, int]] = {}
        """Workload → (Retry answers in a row, when to try again, the room epoch it was judged in)."""
        self._room_epoch = 0  # counts room given back; a waiting workload judged before is due at once

    def _room_changed(self, kind: str, key: Any, old: Any, new: Any) -> None:
        if frees_room(old, new):
            self._room_epoch += 1
            if self._waiting:
                self._wake.set()

    def _checks(self) -> set[str]:
        """The AdmissionChecks this controller answers (marking each Active)."""
        names = set()
        for raw in self.kueue.checks.fresh().values():
            if (raw.get("spec") or {}).get("controllerName") != PLACEMENT_CHECK_CONTROLLER:
                continue
            name = raw["metadata"]["name"]
            names.add(name)
            if not condition_true(raw, "Active"):
                with api_call(f"mark AdmissionCheck {name} active"):
                    self.client.patch(AdmissionCheck.Status, name, {
                        "apiVersion": KUEUE_API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": name},
                        "status": {"conditions": [{
                            "type": "Active", "status": "True", "reason": "Active",
                            "message": "nvlfabric's controller places the workloads of this check",
                            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}]}},
                        patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
        return names

    def pass_once(self) -> float:
        """One pass over the pending workloads; returns how long until a waiting one is due (or WAKE_S)."""
        checks = self._checks()
        if not checks:
            return WAKE_S
        workloads = list(self.kueue.workloads.fresh().values())
        present = {(str(w["metadata"].get("namespace")), str(w["metadata"].get("name"))) for w in workloads}
        for gone in (self._said.keys() | self._told.keys() | self._waiting.keys()) - present:
            self._said.pop(gone, None)
            self._told.pop(gone, None)
            self._waiting.pop(gone, None)
        now, due = time.monotonic(), WAKE_S
        for raw in workloads:
            key = (str(raw["metadata"].get("namespace")), str(raw["metadata"].get("name")))
            check = pending_check(raw, checks)
            if check is None:
                self._waiting.pop(key, None)
                continue
            failures, next_try, epoch = self._waiting.get(key, (0, 0.0, 0))
            if next_try > now and epoch == self._room_epoch:
                due = min(due, next_try - now)
                continue
            epoch = self._room_epoch  # before placing: room given back meanwhile makes it due again
            groups, tolerations = groups_of(raw, self.placer.is_channel_claim)
            verdict = judge(groups, self.placer.admit([g for _, g in groups], tolerations) if groups else {})
            self._write(raw, check, verdict)
            if verdict.state == "Retry":
                wait = retry_after_s(failures + 1)
                self._waiting[key] = (failures + 1, now + wait, epoch)
                due = min(due, wait)
            else:
                self._waiting.pop(key, None)
        return due

    def _write(self, workload: Mapping[str, Any], check: str, verdict: Verdict) -> None:
        meta = workload.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if verdict.state == "Pending" and self._said.get(key) == (verdict.state, verdict.message):
            return  # nothing new to say
        with api_call(f"set admission check {check} of Workload {key[0]}/{key[1]} to {verdict.state}"):
            self.client.patch(Workload.Status, key[1], check_patch(workload, check, verdict, datetime.now(UTC)),
                              namespace=key[0], patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER,
                              force=True)
        self._said[key] = (verdict.state, verdict.message)
        log.info("Workload %s/%s: admission check %s %s: %s", *key, check, verdict.state, verdict.message)
        # Kueue resets a Retry to Pending as it requeues: the reason stays in an Event on the Workload
        # (`kubectl describe workload`), once a minute while it is the same.
        told = self._told.get(key)
        if verdict.state == "Retry" and (told is None or told[0] != verdict.message
                                         or time.monotonic() - told[1] >= NO_ROOM_EVENT_S):
            self._told[key] = (verdict.message, time.monotonic())
            event(self.client, key[0], "Workload", KUEUE_API_VERSION, key[1], str(meta.get("uid") or ""),
                  "NoCliqueRoom", verdict.message)

    def _served(self) -> bool:
        """Whether Kueue's API is served to us (one small list); False says why in the log."""
        try:
            with api_call("list Kueue AdmissionChecks"):
                next(iter(self.client.list(AdmissionCheck, chunk_size=1)), None)
            return True
        except errors.NotFound:
            return False  # no Kueue (yet)
        except errors.Forbidden as exc:  # a ClusterRole without Kueue's rules (an older driver's)
            log.warning("%s; Kueue's admission checks are not answered (next try in %.0f s)", exc, ABSENT_POLL_S)
            return False

    def run(self, stop: Callable[[], bool]) -> None:
        """Once Kueue's API is served (looked for every ABSENT_POLL_S), its informers, then a pass on
        every change of a workload or check, at least every WAKE_S, at most every POLL_S."""
        while not stop():
            if not self._served():
                self._sleep(stop, ABSENT_POLL_S)
                continue
            break
        else:
            return
        for inf in self.kueue.all():
            inf.start(stop)
        while not stop():
            wait = WAKE_S
            try:
                wait = self.pass_once()
            except Exception as exc:  # one failed pass must not end admission
                log.warning("admission pass failed: %s", exc)
            self._wake.wait(timeout=max(POLL_S, wait))
            self._wake.clear()
            self._sleep(stop, POLL_S)  # changes of a burst are one pass

    @staticmethod
    def _sleep(stop: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not stop() and time.monotonic() < deadline:
            time.sleep(min(1.0, seconds))
