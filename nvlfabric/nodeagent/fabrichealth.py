"""Fabric health: what NVML says about this node's GPUs and NVLink fabric, told to the cluster
within seconds.

The resync (--resync-seconds, 30 s) keeps the clique label and housekeeping; health has a loop of
its own because a degraded fabric must show within 5 s: NVML is read every `POLL_S`, through one
`discovery.Session` that keeps NVML initialised (a reading is then a few queries). `judge`
(pure) turns one reading into a `Verdict`; when the verdict changes, `Monitor`

- taints its Node `nvlfabric.io/fabric-unhealthy=<reason>:NoSchedule`, removed when healthy
  again: new pods, and so new ComputeDomains, stay off the node while running pods keep running.
  Never NoExecute: a degraded fabric is slower, not gone, and whether a job should die is its
  owner's call; they are told instead (below);
- sets the Node condition `NVLinkFabricReady` (False names the GPUs, by index and UUID, and
  NVML's reason);
- records an Event: Warning when the node turns unhealthy or the reason changes, Normal when it
  recovers;
- sets the metrics `nvlfabric_fabric_healthy`, `nvlfabric_fabric_unhealthy_gpus` and
  `nvlfabric_fabric_ready`, before any API call (they hold while the API server is away).

The GPUs the verdict names are tainted in the node's GPU slice when the agent publishes one
(`on_reading`, gpus.py). The DRA health stream reports the prepared channels with the verdict (server.py), which the
kubelet shows in the pods' `allocatedResourcesStatus`; the controller marks every ComputeDomain
with a member on the node Degraded, from the Node condition.

While unhealthy the Node is read again every `REASSERT_S`, so a taint someone else's write dropped
(an Nvl72Rack's server-side apply replaces the whole taint list) comes back; a failed write is
tried again at the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api import errors, names
from nvlfabric.nodeagent import discovery, files, kubeapi, metrics
from nvlfabric.nodeagent.discovery import Gpu, GpuFabric, NodeDiscovery

log = logging.getLogger("nvlfabric.nodeagent.fabrichealth")

POLL_S = 1.0
"""How often NVML is read: with the writes (~0.1 s) and the kubelet's and controller's own
delays (≤ 1 s, ≤ 2 s), a change is visible everywhere within the 5 s we promise."""
REASSERT_S = 10.0
"""While unhealthy, how often the Node's taint and condition are checked against the verdict."""
CONFLICT_TRIES = 3

# Condition reasons (CamelCase, metav1 rules); the taint's value is the same word.
REGISTERED = "FabricRegistered"
NOT_READY = "FabricNotReady"
DEGRADED = "FabricDegraded"
GPU_MISSING = "GpuMissing"
NVML_ERROR = "NvmlError"
EVENT_REASONS = {NOT_READY: "NVLinkFabricNotReady", DEGRADED: "NVLinkFabricDegraded", GPU_MISSING: "NVLinkGpuMissing",
                 NVML_ERROR: "NVMLError"}
RECOVERED_EVENT = "NVLinkFabricHealthy"

# The fabric health mask (nvmlGpuFabricInfo_v2+ `healthMask`): (shift, width, {value: problem}).
# Value 0 is "not supported" everywhere and the other values of a field are healthy; a value no
# driver has documented yet is not named (NVML's summary still counts).
MASK_FIELDS: tuple[tuple[str, int, int, Mapping[int, str]], ...] = (
    ("DEGRADED_BW", 0, 0x3, {1: "bandwidth degraded"}),
    ("ROUTE_RECOVERY", 2, 0x3, {1: "route recovery in progress"}),
    ("ROUTE_UNHEALTHY", 4, 0x3, {1: "route unhealthy"}),
    ("ACCESS_TIMEOUT_RECOVERY", 6, 0x3, {1: "access timeout recovery in progress"}),
    ("INCORRECT_CONFIGURATION", 8, 0xF, {2: "incorrect system GUID", 3: "incorrect chassis serial number",
                                         4: "no partition", 5: "insufficient NVLinks", 6: "incompatible GPU firmware",
                                         7: "invalid location", 8: "GPU state invalid"}),
    ("PARTITION_ASSIGNED", 12, 0x3, {2: "no partition assigned"}),
    ("GFM_STATE", 14, 0x3, {2: "fabric manager disconnected"}),
)
HEALTHY_MASK = 0x11AA
"""Every field FALSE, configuration NONE, partition assigned (NVML on a healthy GB200)."""
BAD_SUMMARIES = frozenset({"Unhealthy", "LimitedCapacity"})


def mask_problems(mask: int) -> list[str]:
    """The problems a health mask reports, in field order (empty for a healthy mask)."""
    out = []
    for _name, shift, width, problems in MASK_FIELDS:
        problem = problems.get((mask >> shift) & width)
        if problem:
            out.append(problem)
    return out


def gpu_problem(fabric: GpuFabric) -> str:
    """What is wrong with one GPU's registered fabric ('' when nothing): NVML's summary (v3) and
    the mask's named problems. Either counts: the summary is NVML's own verdict, the mask says
    why, and a v2 driver has only the mask."""
    found = mask_problems(fabric.health_mask) if fabric.health_mask is not None else []
    detail = f"health mask 0x{fabric.health_mask:04X}: {', '.join(found)}" if found else ""
    if fabric.health_summary in BAD_SUMMARIES:
        return f"NVLink fabric health {fabric.health_summary}" + (f" ({detail})" if detail else "")
    return f"NVLink {detail}" if detail else ""


@dataclass(frozen=True)
class Verdict:
    """This node's fabric health as the cluster is told it."""

    healthy: bool
    reason: str
    """The Node condition's reason and the taint's value."""
    message: str
    gpus: tuple[int, ...] = ()
    """The GPUs at fault (their indexes); all known GPUs when NVML cannot be read."""


def _named(gpus: Sequence[tuple[int, str]]) -> str:
    return ", ".join(f"GPU {index} ({uuid})" for index, uuid in gpus)


def judge(found: NodeDiscovery, nvml_error: str, known: Mapping[str, int]) -> Verdict:
    """The verdict on one NVML reading (pure). `known`: every GPU this node had this boot (UUID →
    index), so that a GPU NVML stopped listing counts as missing. The first problem in this order
    wins, since each hides the next: NVML unreadable, GPU missing, fabric not ready, degraded."""
    if nvml_error:
        every = sorted(known.items(), key=lambda kv: kv[1])
        unknown = f"; health of {_named([(i, u) for u, i in every])} unknown" if every else ""
        return Verdict(False, NVML_ERROR, f"{nvml_error}{unknown}", tuple(i for _, i in every))
    present = {g.uuid for g in found.gpus}
    missing = sorted((i, u) for u, i in known.items() if u not in present)
    if missing:
        return Verdict(False, GPU_MISSING, f"{_named(missing)} missing: NVML lists {len(found.gpus)} of the "
                       f"{len(known)} GPUs this node had since boot", tuple(i for i, _ in missing))
    if not found.fabric_ready:
        stuck = tuple(g.index for g in found.gpus if g.fabric.state != "Completed" or g.fabric.status != 0)
        return Verdict(False, NOT_READY, found.reason or "NVLink fabric not ready",
                       stuck or tuple(g.index for g in found.gpus))
    by_problem: dict[str, list[Gpu]] = {}
    for g in found.gpus:
        if problem := gpu_problem(g.fabric):
            by_problem.setdefault(problem, []).append(g)
    if by_problem:
        message = "; ".join(f"{_named([(g.index, g.uuid) for g in gs])}: {problem}"
                            for problem, gs in by_problem.items())
        return Verdict(False, DEGRADED, message, tuple(sorted(g.index for gs in by_problem.values() for g in gs)))
    return Verdict(True, REGISTERED, f"NVLink clique {found.clique}, {len(found.gpus)} GPUs healthy")


def read(session: discovery.Session) -> tuple[NodeDiscovery, str]:
    """One NVML reading: the discovery and '' or, when NVML cannot be read, an empty discovery and why."""
    try:
        return session.read(), ""
    except discovery.NvmlUnavailable as exc:
        return NodeDiscovery(reason=str(exc)), str(exc)


class _KnownFile(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    boot_id: str = Field(alias="bootId")
    gpus: dict[str, int] = {}


class KnownGpus:
    """The GPUs this node has had since it booted (UUID → index when first seen), in a small file
    beside the checkpoint: a GPU that fell off the bus is no longer listed by NVML, so "missing"
    needs a memory, also across an agent restart. A new boot starts afresh (a GPU is replaced
    with the tray powered off). Indexes are kept from the first sighting: NVML's enumeration
    index of the others shifts when one goes."""

    def __init__(self, path: Path | None, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.gpus: dict[str, int] = {}
        if path is not None and boot_id:
            try:
                saved = _KnownFile.model_validate_json(path.read_bytes())
            except FileNotFoundError:
                pass
            except (OSError, ValidationError) as exc:
                log.warning("ignoring %s (%s): GPUs missing before this start are not known", path, exc)
            else:
                if saved.boot_id == boot_id:
                    self.gpus = dict(saved.gpus)

    def update(self, gpus: Sequence[Gpu]) -> dict[str, int]:
        new = {g.uuid: g.index for g in gpus if g.uuid not in self.gpus}
        if new:
            self.gpus = {**self.gpus, **new}
            if self.path is not None and self.boot_id:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    files.atomic_write(self.path, _KnownFile(boot_id=self.boot_id, gpus=self.gpus)
                                       .model_dump_json(by_alias=True).encode())
                except OSError as exc:
                    log.warning("could not record the node's GPUs in %s: %s", self.path, exc)
        return self.gpus


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wanted_taints(taints: Sequence[Mapping[str, Any]], verdict: Verdict) -> list[dict[str, Any]]:
    """The Node's taint list with ours as the verdict wants it (others untouched, in order)."""
    out = [dict(t) for t in taints if t.get("key") != names.FABRIC_UNHEALTHY_TAINT]
    if not verdict.healthy:
        out.append({"key": names.FABRIC_UNHEALTHY_TAINT, "value": verdict.reason, "effect": "NoSchedule"})
    return out


def _ours(taints: Sequence[Mapping[str, Any]]) -> list[tuple[Any, Any]]:
    return [(t.get("value"), t.get("effect")) for t in taints if t.get("key") == names.FABRIC_UNHEALTHY_TAINT]


class Monitor:
    """Reads NVML every `poll_s` and tells the cluster when the verdict changes (module docstring)."""

    def __init__(self, client: kubeapi.Client, node: str, *, known: KnownGpus,
                 reader: Callable[[], tuple[NodeDiscovery, str]], poll_s: float = POLL_S,
                 relabel: Callable[[NodeDiscovery], None] | None = None,
                 on_reading: Callable[[NodeDiscovery, Verdict, Mapping[str, int]], None] | None = None) -> None:
        self.client = client
        self.node = node
        self.known = known
        self.reader = reader
        self.poll_s = poll_s
        self.relabel = relabel
        """Called when the clique or registration changed since the last reading (the agent's
        clique label), so the label says what the condition says, not a resync later."""
        self.on_reading = on_reading
        """Called with every reading, its verdict and the GPUs known this boot (the GPU slice, gpus.py)."""
        self._labelled: tuple[str | None, bool] | None = None
        self.latest = NodeDiscovery()
        self.verdict = Verdict(False, NOT_READY, "NVML not read yet")
        self._published: Verdict | None = None
        self._announced: Verdict | None = None
        self._next_check = 0.0

    def check(self) -> NodeDiscovery:
        """Read NVML once; publish the verdict when it changed (or is due a re-check). API
        failures are logged and retried at the next poll, never raised."""
        found, error = self.reader()
        verdict = judge(found, error, self.known.update(found.gpus))
        self.latest = found
        if verdict != self.verdict:  # replaced only on change: readers compare by identity
            self.verdict = verdict
        if self.on_reading is not None:
            self.on_reading(found, self.verdict, self.known.gpus)
        metrics.FABRIC_READY.set(1 if found.fabric_ready else 0)
        metrics.FABRIC_HEALTHY.set(1 if verdict.healthy else 0)
        metrics.FABRIC_UNHEALTHY_GPUS.set(len(verdict.gpus))
        if verdict != self._published or (not verdict.healthy and time.monotonic() >= self._next_check):
            try:
                self._publish(verdict)
            except (errors.NvlfabricError, OSError) as exc:
                log.error("could not report the fabric health of node %s, retrying: %s", self.node, exc)
            else:
                self._published = verdict
                self._next_check = time.monotonic() + REASSERT_S
        fabric = (found.clique, found.fabric_ready)
        if self._labelled is None:
            self._labelled = fabric  # the first reading: the agent labels its Node at start
        elif fabric != self._labelled and self.relabel is not None:
            try:
                self.relabel(found)
            except (errors.NvlfabricError, OSError) as exc:
                log.error("could not relabel node %s, retrying: %s", self.node, exc)
            else:
                self._labelled = fabric
        return found

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # a bug here must not end the loop: health would go silent
                log.exception("fabric health check failed")

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="fabric-health", daemon=True)
        thread.start()
        return thread

    # -- telling the cluster -------------------------------------------------------------------

    def _publish(self, verdict: Verdict) -> None:
        node = self._taint(verdict)
        self._condition(node, verdict)
        if verdict != self._announced:
            self._event(node, verdict)
            self._announced = verdict
            if verdict.healthy:
                log.info("node %s: NVLink fabric healthy: %s", self.node, verdict.message)
            else:
                log.warning("node %s: NVLink fabric unhealthy (%s): %s; tainted %s:NoSchedule, running pods "
                            "keep running", self.node, verdict.reason, verdict.message,
                            names.FABRIC_UNHEALTHY_TAINT)

    def _taint(self, verdict: Verdict) -> dict[str, Any]:
        """Our taint as the verdict wants it; returns the Node as last read. A merge patch of the
        whole list (a Node's taints have no merge key) carrying the resourceVersion it was computed
        from, so a concurrent change of another taint (the node-lifecycle controller's) is never
        overwritten: a conflict reads again."""
        node_path = kubeapi.path("v1", "nodes", self.node)
        for attempt in range(CONFLICT_TRIES):
            node = self.client.get(node_path)
            taints = (node.get("spec") or {}).get("taints") or []
            want = wanted_taints(taints, verdict)
            if _ours(taints) == _ours(want):
                return node
            try:
                return self.client.patch(node_path, {
                    "metadata": {"resourceVersion": (node.get("metadata") or {}).get("resourceVersion")},
                    "spec": {"taints": want}})
            except errors.Conflict:
                if attempt == CONFLICT_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _condition(self, node: Mapping[str, Any], verdict: Verdict) -> None:
        status = "True" if verdict.healthy else "False"
        old: Mapping[str, Any] = next((c for c in (node.get("status") or {}).get("conditions") or []
                    if c.get("type") == names.FABRIC_CONDITION), {})
        if (old.get("status"), old.get("reason"), old.get("message")) == (status, verdict.reason, verdict.message):
            return
        now = _now()
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        # Strategic merge: conditions merge by type, the kubelet's own conditions stay.
        self.client.patch(kubeapi.path("v1", "nodes", self.node, subresource="status"), {"status": {"conditions": [{
            "type": names.FABRIC_CONDITION, "status": status, "reason": verdict.reason,
            "message": verdict.message[:32768], "lastHeartbeatTime": now, "lastTransitionTime": since or now}]}},
            content_type=kubeapi.STRATEGIC_MERGE_PATCH)

    def _event(self, node: Mapping[str, Any], verdict: Verdict) -> None:
        """So that `kubectl describe node` says what happened and when. Not for the first healthy
        reading after a start: nothing happened."""
        if verdict.healthy and (self._announced is None or self._announced.healthy):
            return
        now = _now()
        reason = RECOVERED_EVENT if verdict.healthy else EVENT_REASONS.get(verdict.reason, "NVLinkFabricUnhealthy")
        uid = (node.get("metadata") or {}).get("uid") or self.node
        try:
            self.client.create(kubeapi.path("v1", "events", namespace="default"), {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{self.node}.", "namespace": "default"},
                "involvedObject": {"kind": "Node", "name": self.node, "uid": uid, "apiVersion": "v1"},
                "reason": reason, "message": verdict.message[:1024], "type": "Normal" if verdict.healthy else "Warning",
                "source": {"component": "nvlfabric-agent", "host": self.node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1})
        except errors.ApiStatusError as exc:  # informational: the condition already says it
            log.warning("could not record the event %s for node %s: %s", reason, self.node, exc)
