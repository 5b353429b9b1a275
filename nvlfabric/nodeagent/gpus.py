"""The node's GPUs as DRA devices: a ResourceSlice where a sick GPU carries a device taint, the
kubelet plugin `gpu.nvlfabric.io` that prepares claims for them, and their health stream.

Why a second driver: the channels are clique-wide devices (one pool per clique, published by the
controller), so a taint on one would keep every node of the clique from a domain. A GPU is a
node's own: one pool per node, named as the node, published by its agent (`spec.nodeName`, the
Node as owner, so the slice goes with a deleted Node). The driver's admission policy lets an
agent write only its own node's slice of this driver.

- **Devices** `gpu-<index>` (`names.gpu_device`) with attributes `type` (gpu), `uuid`, `index`,
  `minor`, `productName`, `clique`, `driverVersion` and capacity `memory`. A GPU NVML no longer lists
  (fell off the bus, NVML unreadable) stays published, tainted, with what was last known of it:
  a device that vanished would look freed, not sick.
- **Taints** (`Verdict.gpus`: the GPUs at fault): key `nvlfabric.io/fabric-unhealthy`, value the
  verdict's reason, effect the driver's setting (`--gpu-taint-effect`: NoSchedule, NoExecute,
  None), `timeAdded` when the GPU turned sick (kept while it stays sick, so NoExecute's
  tolerationSeconds count from then). The taint goes when NVML reports the GPU healthy again.
- **Only when told** (`--publish-gpus`, NvlfabricDriver `gpu_devices='DRA'`): where a device plugin
  hands out `nvidia.com/gpu`, a second allocator over the same GPUs would hand one out twice. An
  agent not told to removes the slice an earlier one published.
- **Writes**: server-side apply of the whole slice by the agent's field manager when what it
  should say changed, and again when it was deleted (read back every RECHECK_S: a starting
  kubelet deletes its node's slices, and so does one whose plugin was gone 30 s); the pool's
  generation goes up with each write (the scheduler uses only the newest generation). Checked
  every second with the fabric (fabrichealth.Monitor), so a taint shows within the 5 s the
  fabric's signals promise; a failed write is tried again the next second. The slice stays when
  the agent stops: an upgrade must not make GPUs look gone.
- **Prepare** is stateless: a claim's results of this driver in this node's pool name GPUs that
  NVML lists; each is the CDI device `k8s.gpu.nvlfabric.io/gpu=gpu-<index>` of the node's one GPU
  spec (device node /dev/nvidia<minor>, with /dev/nvidiactl for every GPU), which the agent keeps
  written. Unprepare has nothing to undo.
- **Health** (the DRA health stream): every GPU, unhealthy while it is at fault, so the kubelet
  shows it in `allocatedResourcesStatus` of the pods that hold it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nvlfabric.api import errors, names
from nvlfabric.api.kubelet.cdi import ContainerEdits, Device, DeviceNode, Spec
from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.nodeagent import files, kubeapi
from nvlfabric.nodeagent.claims import RESOURCE_API, PrepareError, check_ref, claim_name, get_claim, show
from nvlfabric.nodeagent.discovery import Gpu, NodeDiscovery
from nvlfabric.nodeagent.fabrichealth import Verdict
from nvlfabric.nodeagent.server import DeviceHealth

log = logging.getLogger("nvlfabric.nodeagent.gpus")

NVIDIACTL_MINOR = 255
CDI_VERSION = "0.5.0"
RECHECK_S = 10.0
"""How often the published slice is read back: a kubelet deletes its node's slices of a driver when
it starts, and when the plugin was gone 30 s; the agent then publishes it again."""


@dataclass(frozen=True)
class Taint:
    reason: str
    since: str


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taints(verdict: Verdict, indexes: Sequence[int], before: Mapping[int, Taint], now: str) -> dict[int, Taint]:
    """Which GPUs are tainted after `verdict` (pure): those at fault, keeping the time each turned
    sick (a new reason keeps it: the GPU has been sick since then)."""
    if verdict.healthy:
        return {}
    return {i: Taint(verdict.reason, before[i].since if i in before else now)
            for i in indexes if i in verdict.gpus}


def device(gpu: Gpu, clique: str | None, driver_version: str, taint: Taint | None, effect: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, "index": {"int": gpu.index},
        "minor": {"int": gpu.minor}, "productName": {"string": gpu.name[:64]}}
    if clique:
        attributes["clique"] = {"string": clique}
    if driver_version:
        attributes["driverVersion"] = {"string": driver_version[:64]}
    out: dict[str, Any] = {"name": names.gpu_device(gpu.index), "attributes": attributes}
    if gpu.memory_mib > 0:
        out["capacity"] = {"memory": {"value": f"{gpu.memory_mib}Mi"}}
    if taint is not None:
        out["taints"] = [{"key": names.FABRIC_UNHEALTHY_TAINT, "value": taint.reason, "effect": effect,
                          "timeAdded": taint.since}]
    return out


def slice_spec(node: str, gpus: Sequence[Gpu], clique: str | None, driver_version: str,
               tainted: Mapping[int, Taint], effect: str) -> dict[str, Any]:
    """What the node's GPU slice says, without its generation (pure)."""
    return {"driver": names.GPU_DRIVER, "nodeName": node,
            "pool": {"name": node, "resourceSliceCount": 1},
            "devices": [device(g, clique, driver_version, tainted.get(g.index), effect)
                        for g in sorted(gpus, key=lambda g: g.index)]}


def slice_object(node: str, node_uid: str, spec: Mapping[str, Any], generation: int) -> dict[str, Any]:
    body = {**spec, "pool": {**spec["pool"], "generation": generation}}
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice",
            "metadata": {"name": names.gpu_slice_name(node), "labels": {"app.kubernetes.io/part-of": "nvlfabric"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]},
            "spec": body}


def gpu_spec(gpus: Sequence[Gpu]) -> Spec | None:
    """The CDI spec of the node's GPUs (None without any)."""
    if not gpus:
        return None
    common = ContainerEdits(device_nodes=[
        DeviceNode(path="/dev/nvidiactl", type="c", major=names.NVIDIA_GPU_MAJOR, minor=NVIDIACTL_MINOR)])
    devices = [Device(name=names.gpu_device(g.index), container_edits=ContainerEdits(
        env=[f"NVLFABRIC_GPU_{g.index}={g.uuid}"],
        device_nodes=[DeviceNode(path=f"/dev/nvidia{g.minor}", type="c", major=names.NVIDIA_GPU_MAJOR,
                                 minor=g.minor)]))
        for g in sorted(gpus, key=lambda g: g.index)]
    return Spec(cdi_version=CDI_VERSION, kind=names.GPU_CDI_KIND, devices=devices, container_edits=common)


class Gpus:
    """What the agent knows of its GPUs and says about them: the slice, the CDI spec, the health
    stream and prepare (module docstring). `sync` runs after each NVML reading."""

    def __init__(self, client: kubeapi.Client, node: str, cdi_dir: Path, effect: str) -> None:
        if effect not in names.GPU_TAINT_EFFECTS:
            raise ValueError(f"GPU taint effect {effect!r}: one of {', '.join(names.GPU_TAINT_EFFECTS)}")
        self.client = client
        self.node = node
        self.cdi_dir = cdi_dir
        self.effect = effect
        self.seen: dict[str, Gpu] = {}
        """Every GPU this agent has seen (UUID → its last reading): one NVML stops listing stays published."""
        self.present: frozenset[int] = frozenset()
        self.tainted: dict[int, Taint] = {}
        self.verdict: Verdict | None = None
        self._published: dict[str, Any] | None = None
        self._generation = 0
        self._node_uid = ""
        self._spec_written: str | None = None
        self._failing = False
        self._recheck_at = 0.0
        self._synced: tuple[object, object, object] | None = None
        """The reading, verdict and known GPUs last synced: each is replaced, never modified, when it
        changes (discovery.Session, fabrichealth.Monitor), so an unchanged second costs nothing."""

    # -- after each NVML reading ----------------------------------------------------------------

    def sync(self, found: NodeDiscovery, verdict: Verdict, known: Mapping[str, int]) -> None:
        """Bring the slice and the CDI spec up to date with one reading; failures are logged and
        retried at the next reading, never raised."""
        due = self._published is not None and time.monotonic() >= self._recheck_at
        inputs = (found, verdict, known)
        if not self._failing and not due and self._synced is not None and all(
                a is b for a, b in zip(inputs, self._synced, strict=True)):
            return
        self._synced = inputs
        for g in found.gpus:
            if g.uuid in known:  # the index first seen this boot: NVML's shifts when a GPU goes
                g = g.model_copy(update={"index": known[g.uuid]})
            self.seen[g.uuid] = g
        self.present = frozenset(known.get(g.uuid, g.index) for g in found.gpus)
        gpus = list(self.seen.values())
        self.tainted = taints(verdict, [g.index for g in gpus], self.tainted, _now())
        self.verdict = verdict
        spec = slice_spec(self.node, gpus, found.clique or self._last_clique(), found.driver_version,
                          self.tainted, self.effect)
        try:
            self._write_cdi([g for g in gpus if g.index in self.present])
            if spec != self._published and gpus:
                self._apply(spec)
            elif due:
                self._recheck()
        except (errors.NvlfabricError, OSError) as exc:
            if not self._failing:
                log.error("could not publish the GPUs of node %s, retrying every second: %s", self.node, exc)
            self._failing = True
        else:
            if self._failing:
                log.info("published the GPUs of node %s again", self.node)
            self._failing = False

    def _last_clique(self) -> str | None:
        devices = (self._published or {}).get("devices") or []
        return next((d["attributes"]["clique"]["string"] for d in devices if "clique" in d["attributes"]), None)

    def _recheck(self) -> None:
        """Publish the slice again when someone (a starting kubelet) deleted it."""
        self._recheck_at = time.monotonic() + RECHECK_S
        try:
            self.client.get(kubeapi.path(RESOURCE_API, "resourceslices", names.gpu_slice_name(self.node)))
        except errors.NotFound:
            log.info("ResourceSlice %s was deleted (by a starting kubelet?): publishing it again",
                     names.gpu_slice_name(self.node))
            published, self._published = self._published, None
            assert published is not None
            self._apply(published)

    def _apply(self, spec: dict[str, Any]) -> None:
        path = kubeapi.path(RESOURCE_API, "resourceslices", names.gpu_slice_name(self.node))
        if not self._node_uid:
            node = self.client.get(kubeapi.path("v1", "nodes", self.node))
            self._node_uid = (node.get("metadata") or {}).get("uid") or ""
        if self._published is None:  # the first write of this agent: continue the live pool's generations
            try:
                live = self.client.get(path)
            except errors.NotFound:
                live = {}
            self._generation = int(((live.get("spec") or {}).get("pool") or {}).get("generation") or 0)
        self.client.apply(path, slice_object(self.node, self._node_uid, spec, self._generation + 1))
        self._generation += 1
        self._recheck_at = time.monotonic() + RECHECK_S
        first = self._published is None
        before = {d["name"] for d in (self._published or {}).get("devices") or [] if d.get("taints")}
        now = {d["name"] for d in spec["devices"] if d.get("taints")}
        self._published = spec
        if first or before != now:
            log.info("ResourceSlice %s: %d GPUs, tainted %s (%s)", names.gpu_slice_name(self.node),
                     len(spec["devices"]), ", ".join(sorted(now)) or "none",
                     f"{names.FABRIC_UNHEALTHY_TAINT}:{self.effect}" if now else "all healthy")

    def _write_cdi(self, gpus: Sequence[Gpu]) -> None:
        spec = gpu_spec(gpus)
        if spec is None:
            return
        text = spec.to_json()
        if text == self._spec_written:
            return
        path = self.cdi_dir / names.GPU_CDI_SPEC_FILE
        try:
            same = path.read_text() == text
        except FileNotFoundError:
            same = False
        if not same:
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            files.atomic_write(path, text.encode())
        self._spec_written = text

    # -- the kubelet plugin ---------------------------------------------------------------------

    def health(self) -> list[DeviceHealth]:
        """Every GPU this agent has seen, unhealthy while tainted (the verdict's message says why)."""
        message = self.verdict.message if self.verdict is not None and not self.verdict.healthy else ""
        return [DeviceHealth(self.node, names.gpu_device(g.index), g.index not in self.tainted,
                             message if g.index in self.tainted else "")
                for g in sorted(self.seen.values(), key=lambda g: g.index)]

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        out: dict[str, list[PreparedDevice] | str] = {}
        for c in claims:
            try:
                out[c.uid] = self._prepare_one(c)
            except PrepareError as exc:
                out[c.uid] = str(exc)
            except (errors.NvlfabricError, OSError) as exc:
                out[c.uid] = f"claim {claim_name(c)}: {exc}"
        return out

    def _prepare_one(self, c: ClaimRef) -> list[PreparedDevice]:
        check_ref(c)
        claim = get_claim(self.client, c)
        results = [r for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                   .get("results") or [] if r.get("driver") == names.GPU_DRIVER]
        if not results:
            raise PrepareError(f"claim {claim_name(c)} holds no device of driver {names.GPU_DRIVER}")
        by_name = {names.gpu_device(i): i for i in self.present}
        prepared = []
        for r in results:
            pool, dev = str(r.get("pool") or ""), str(r.get("device") or "")
            if pool != self.node:
                raise PrepareError(f"claim {claim_name(c)}: device {show(dev)} is of pool {show(pool)}, another "
                                   f"node's GPUs; this is node {self.node}")
            if dev not in by_name:
                raise PrepareError(f"claim {claim_name(c)}: GPU {show(dev)} is not on node {self.node} now "
                                   f"(NVML lists {', '.join(sorted(by_name)) or 'none'})")
            request = str(r.get("request") or "").split("/")[0]
            prepared.append(PreparedDevice(request_names=(request,) if request else (), pool_name=pool,
                                           device_name=dev, cdi_device_ids=(f"{names.GPU_CDI_KIND}={dev}",)))
        return prepared

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Nothing was made for a claim (the spec is the node's), so nothing is undone."""
        return {c.uid: "" for c in claims}


def withdraw_gpus(client: kubeapi.Client, node: str, cdi_dir: Path) -> None:
    """An agent told not to publish GPUs (any more) removes what an earlier one published: the
    slice (claims allocated from it keep their allocation) and the CDI spec. Failures are logged:
    the agent runs on without them."""
    try:
        client.delete(kubeapi.path(RESOURCE_API, "resourceslices", names.gpu_slice_name(node)))
        log.info("withdrew ResourceSlice %s: this agent does not publish GPUs", names.gpu_slice_name(node))
    except errors.NotFound:
        pass
    except (errors.NvlfabricError, OSError) as exc:
        log.warning("could not withdraw ResourceSlice %s: %s", names.gpu_slice_name(node), exc)
    try:
        (cdi_dir / names.GPU_CDI_SPEC_FILE).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", cdi_dir / names.GPU_CDI_SPEC_FILE, exc)
