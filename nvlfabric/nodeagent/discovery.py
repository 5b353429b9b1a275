"""GPU and NVLink-fabric discovery through NVML (nvidia-ml-py).

The library is the driver's `libnvidia-ml.so.1`. With a driver root (the GPU operator's
`/run/nvidia/driver`), the agent loads `<driver root>/usr/lib64/libnvidia-ml.so.1` first, so that
pynvml's own `CDLL("libnvidia-ml.so.1")` binds to the same, already-loaded library.

Fabric info is read with the newest struct the driver knows: `nvmlDeviceGetGpuFabricInfoV` with
v3 (health summary), then v2 (health mask), then the unversioned call; a version mismatch or a
missing symbol means an older driver, not an error. A node's *clique* is
`<clusterUuid>.<cliqueId>`, the identity GPU Feature Discovery publishes as
`nvidia.com/gpu.clique`; it exists only when every GPU's fabric registration is COMPLETED with
success and all GPUs agree. Anything else is reported as "fabric not ready" with the reason,
never raised: a node without a ready fabric is a condition to report, not a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import uuid
from pathlib import Path
from typing import Any

import pynvml
from pydantic import BaseModel

FABRIC_STATES = {0: "NotSupported", 1: "NotStarted", 2: "InProgress", 3: "Completed"}
HEALTH_SUMMARIES = {0: "NotSupported", 1: "Healthy", 2: "Unhealthy", 3: "LimitedCapacity"}
LIB_NAME = "libnvidia-ml.so.1"
LIB_DIRS = ("usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/lib/x86_64-linux-gnu", "usr/lib", "lib64",
            "lib/aarch64-linux-gnu", "lib/x86_64-linux-gnu")
"""Where a driver root keeps the NVML library: the GPU Operator's driver container and RPM
distributions (usr/lib64), Debian-style multiarch hosts (GB200's Grace CPUs are aarch64)."""


def nvml_library(driver_root: Path) -> Path | None:
    """The NVML library under `driver_root`, or None when it has none (not a driver root)."""
    return next((p for d in LIB_DIRS if (p := driver_root / d / LIB_NAME).exists()), None)


class GpuFabric(BaseModel):
    cluster_uuid: str = ""
    clique_id: int = 0
    state: str = "NotSupported"
    status: int = 0  # an NVML return code; 0 is success
    health_mask: int | None = None
    health_summary: str | None = None

    @property
    def clique(self) -> str:
        return f"{self.cluster_uuid}.{self.clique_id}"


class Gpu(BaseModel):
    index: int
    uuid: str
    name: str
    minor: int
    pci_bus_id: str
    memory_mib: int
    compute_capability: str
    fabric: GpuFabric


class NodeDiscovery(BaseModel):
    driver_version: str = ""
    cuda_driver_version: int = 0
    gpus: list[Gpu] = []
    clique: str | None = None
    fabric_ready: bool = False
    reason: str = ""
    """Why the fabric is not ready (empty when it is)."""


class NvmlUnavailable(Exception):
    """NVML could not be initialised (no driver, broken library); the message says why."""


def load_library(driver_root: Path | None) -> None:
    lib = nvml_library(driver_root) if driver_root is not None else None
    if lib is not None:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


FabricReading = tuple[bytes, int, int, int, int | None, int | None]
"""One GPU's fabric info as NVML returned it: cluster UUID, clique, state, status, health mask
and summary (None where the driver's struct has no such field)."""
NOT_ATTACHED: FabricReading = (bytes(16), 0, 0, 0, None, None)
FABRIC_STRUCTS = (("c_nvmlGpuFabricInfo_v3_t", "nvmlGpuFabricInfo_v3"),
                  ("c_nvmlGpuFabricInfo_v2_t", "nvmlGpuFabricInfo_v2"))


def _fabric_reading(handle: Any, first: int) -> tuple[FabricReading, int]:
    """The fabric info of one GPU, trying the versioned structs from FABRIC_STRUCTS[first] on,
    then the unversioned call; returns the reading and the index of the struct that answered
    (len(FABRIC_STRUCTS) for the unversioned call), to try first next time."""
    for at in range(first, len(FABRIC_STRUCTS)):
        struct_name, version = FABRIC_STRUCTS[at]
        struct_cls = getattr(pynvml, struct_name, None)
        if struct_cls is None:
            continue
        info = struct_cls()
        info.version = getattr(pynvml, version)
        try:
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except (pynvml.NVMLError_ArgumentVersionMismatch, pynvml.NVMLError_FunctionNotFound):
            continue
        except pynvml.NVMLError_NotSupported:
            return NOT_ATTACHED, at
        return (bytes(info.clusterUuid), info.cliqueId, info.state, info.status, info.healthMask,
                getattr(info, "healthSummary", None)), at
    try:
        old = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(old))
    except pynvml.NVMLError_NotSupported:
        return NOT_ATTACHED, len(FABRIC_STRUCTS)
    return (bytes(old.clusterUuid), old.cliqueId, old.state, old.status, None, None), len(FABRIC_STRUCTS)


def _gpu_fabric(r: FabricReading) -> GpuFabric:
    if r == NOT_ATTACHED:
        return GpuFabric()
    cluster, clique_id, state, status, mask, summary = r
    return GpuFabric(cluster_uuid=str(uuid.UUID(bytes=cluster)), clique_id=clique_id,
                     state=FABRIC_STATES.get(state, f"Unknown({state})"), status=status, health_mask=mask,
                     health_summary=None if summary is None else HEALTH_SUMMARIES.get(summary, str(summary)))


class _Static(BaseModel):
    """What NVML says about a GPU that cannot change while NVML stays initialised."""

    name: str
    minor: int
    pci_bus_id: str
    memory_mib: int
    compute_capability: str


class Session:
    """NVML kept initialised between readings. nvmlInit is the expensive part (the driver sets
    up its state for the process; the stand-in re-reads the cluster's topology), and the fabric
    monitor reads every second: a reading is then a few queries, which see the GPUs' state as it
    is now. A failed query closes the session, so the next reading initialises NVML afresh (a
    driver reloaded under the agent shows as errors first).

    The agent has one of these for its life and reads it every second on every node, so a reading
    asks only what can change (the GPU count, each GPU's UUID and fabric info); the driver version
    and each GPU's name, PCI address, memory and compute capability are asked once per UUID and
    initialisation. A reading equal to the last returns the same `NodeDiscovery` object (never
    modify one): readers tell "changed" by identity."""

    def __init__(self, driver_root: Path | None = None) -> None:
        self.driver_root = driver_root
        self._open = False
        self._system: tuple[str, int] | None = None
        self._static: dict[str, _Static] = {}
        self._struct = 0
        self._last: tuple[object, NodeDiscovery] | None = None

    def read(self) -> NodeDiscovery:
        if not self._open:
            load_library(self.driver_root)
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise NvmlUnavailable(f"NVML could not be initialised: {exc}") from exc
            self._open = True
        try:
            return self._query()
        except NvmlUnavailable:
            self.close()
            raise

    def close(self) -> None:
        self._system, self._static, self._struct, self._last = None, {}, 0, None
        if self._open:
            self._open = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _query(self) -> NodeDiscovery:
        try:
            if self._system is None:
                self._system = (_text(pynvml.nvmlSystemGetDriverVersion()), pynvml.nvmlSystemGetCudaDriverVersion())
            readings = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpu_uuid = _text(pynvml.nvmlDeviceGetUUID(h))
                fabric, self._struct = _fabric_reading(h, self._struct)
                if gpu_uuid not in self._static:
                    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                    self._static[gpu_uuid] = _Static(
                        name=_text(pynvml.nvmlDeviceGetName(h)), minor=pynvml.nvmlDeviceGetMinorNumber(h),
                        pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                        memory_mib=pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024),
                        compute_capability=f"{major}.{minor}")
                readings.append((gpu_uuid, fabric))
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML query failed: {exc}") from exc
        key = (self._system, tuple(readings))
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        driver_version, cuda_version = self._system
        node = NodeDiscovery(driver_version=driver_version, cuda_driver_version=cuda_version, gpus=[
            Gpu(index=i, uuid=u, fabric=_gpu_fabric(f), **self._static[u].model_dump())
            for i, (u, f) in enumerate(readings)])
        node.clique, node.reason = clique_of(node.gpus)
        node.fabric_ready = node.clique is not None
        self._last = (key, node)
        return node


def discover(driver_root: Path | None = None) -> NodeDiscovery:
    """Everything the agent needs to know about this node's GPUs and fabric, read once."""
    session = Session(driver_root)
    try:
        return session.read()
    finally:
        session.close()


def clique_of(gpus: list[Gpu]) -> tuple[str | None, str]:
    """The node's clique, or None and the reason there is none."""
    if not gpus:
        return None, "no GPUs found"
    for g in gpus:
        if g.fabric.state == "NotSupported":
            return None, f"GPU {g.index} ({g.uuid}) is not attached to an NVLink fabric"
        if g.fabric.state != "Completed":
            return None, f"GPU {g.index} fabric registration is {g.fabric.state}"
        if g.fabric.status != 0:
            return None, f"GPU {g.index} fabric registration failed (NVML status {g.fabric.status})"
    cliques = {g.fabric.clique for g in gpus}
    if len(cliques) != 1:
        return None, f"GPUs disagree on their clique: {', '.join(sorted(cliques))}"
    return cliques.pop(), ""
