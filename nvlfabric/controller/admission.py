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
- the Reserver places them all at once as it places a gated job (`Reserver.admit`): each group in
  a clique of its own with room and a free channel, or none. Placed: the check is Ready, each pod
  set's `podSetUpdates` carry `nodeSelector: {nvlfabric.io/clique: <clique>}`, and the room is held
  for the pods that Kueue's unsuspending will create. No room: Retry, saying why; Kueue then gives
  the quota back and requeues the workload, so a job that cannot be placed never holds quota
  while others wait, and it is tried again as quota and room come back;
- the state is written by server-side apply of the Workload's status under this controller's
  field manager, owning its one entry of `status.admissionChecks` (a list keyed by name), as
  Kueue's own check controllers do.

Every AdmissionCheck of this controllerName is marked Active. A cluster without Kueue costs one
failed list a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import Client
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import PatchType

from nvlfabric.api import errors
from nvlfabric.api.names import CLIQUE_LABEL, KUEUE_API_VERSION, PLACEMENT_CHECK_CONTROLLER
from nvlfabric.controller import placement
from nvlfabric.controller.reservations import NO_ROOM_EVENT_S, Reserver, event
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.admission")

_GROUP, _VERSION = KUEUE_API_VERSION.split("/")
Workload = create_namespaced_resource(_GROUP, _VERSION, "Workload", "workloads")
AdmissionCheck = create_global_resource(_GROUP, _VERSION, "AdmissionCheck", "admissionchecks")
POLL_S = 1.0
"""How often workloads are looked at while Kueue is installed."""
ABSENT_POLL_S = 60.0
"""... and how often whether it is, while it is not."""
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
    """The check's state from where the Reserver placed the groups (pure)."""
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


def _raw(obj: Any) -> dict[str, Any]:
    """A generic resource as the API's dict."""
    return dict(obj.to_dict())


class Admitter:
    """Answers this controller's Kueue admission checks, placing through `reserver`."""

    def __init__(self, client: Client, reserver: Reserver) -> None:
        self.client, self.reserver = client, reserver
        self._said: dict[tuple[str, str], tuple[str, str]] = {}  # workload → (state, message) last written
        self._told: dict[tuple[str, str], tuple[str, float]] = {}  # workload → (Event message, when) of its last

    def _checks(self) -> set[str]:
        """The AdmissionChecks this controller answers (marking each Active)."""
        names = set()
        with api_call("list Kueue AdmissionChecks"):
            listed = list(self.client.list(AdmissionCheck))
        for ac in listed:
            raw = _raw(ac)
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

    def pass_once(self) -> None:
        checks = self._checks()
        if not checks:
            return
        with api_call("list Kueue Workloads"):
            workloads = [_raw(wl) for wl in self.client.list(Workload, namespace="*")]
        present = {(str(w["metadata"].get("namespace")), str(w["metadata"].get("name"))) for w in workloads}
        for gone in (self._said.keys() | self._told.keys()) - present:
            self._said.pop(gone, None)
            self._told.pop(gone, None)
        for raw in workloads:
            check = pending_check(raw, checks)
            if check is None:
                continue
            groups, tolerations = groups_of(raw, self.reserver.is_channel_claim)
            verdict = judge(groups, self.reserver.admit([g for _, g in groups], tolerations) if groups else {})
            self._write(raw, check, verdict)

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

    def run(self, stop: Callable[[], bool]) -> None:
        """Passes every POLL_S while Kueue's API is served, else looks again every ABSENT_POLL_S."""
        while not stop():
            wait = POLL_S
            try:
                self.pass_once()
            except errors.NotFound:
                wait = ABSENT_POLL_S  # no Kueue (yet)
            except errors.Forbidden as exc:  # a ClusterRole without Kueue's rules (an older driver's)
                log.warning("%s; Kueue's admission checks are not answered (next try in %.0f s)", exc, ABSENT_POLL_S)
                wait = ABSENT_POLL_S
            except Exception as exc:  # one failed pass must not end admission
                log.warning("admission pass failed: %s", exc)
            deadline = time.monotonic() + wait
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(1.0, wait))
