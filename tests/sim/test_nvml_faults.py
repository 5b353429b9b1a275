"""Faults injected into a running process through the node's fault file."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from pydantic import ValidationError

from nvlfabric.sim.nvml.constants import (
    CALL_NAMES,
    HEALTH_DEGRADED_BW,
    HEALTH_ROUTE_UNHEALTHY,
    FabricState,
    HealthSummary,
    NvmlReturn,
    Tristate,
    health_field,
    health_mask,
)
from nvlfabric.sim.nvml.faults import (
    GpuFault,
    NodeFaults,
    call_error,
    clear_faults,
    default_fault_path,
    fabric_degraded,
    fabric_failed,
    fabric_in_progress,
    fabric_not_started,
    gpu_error,
    gpu_missing,
    init_error,
    merge,
    write_faults,
)
from tests.sim.conftest import NvmlCluster, ProbeFactory
from tests.sim.nvml_helpers import Probe, cluster_uuid, handle, struct

NODE = "rack-0-node-01"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def _started(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> tuple[Probe, Path]:
    p = nvml_probe(nvml_cluster.path, NODE)
    p.call("nvmlInit")
    for i in range(4):
        assert p.call("nvmlDeviceGetHandleByIndex", i) == {"handle": i}
    return p, default_fault_path(nvml_cluster.path, NODE)


def _fabric(p: Probe, i: int) -> dict[str, object]:
    return p.struct_call("nvmlDeviceGetGpuFabricInfoV", handle(i), struct("c_nvmlGpuFabricInfo_v3_t"))


def test_fabric_not_started_then_recovered(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    rack_uuid = str(nvml_cluster.topology.rack("rack-0").cluster_uuid)
    assert _fabric(p, 0)["state"] == FabricState.COMPLETED

    write_faults(path, fabric_not_started())
    for i in range(4):
        info = _fabric(p, i)
        assert (info["state"], info["cliqueId"], cluster_uuid(info)) == (FabricState.NOT_STARTED, 0, ZERO_UUID)
    v1 = p.struct_call("nvmlDeviceGetGpuFabricInfo", handle(0), struct("c_nvmlGpuFabricInfo_t"))
    assert v1["state"] == FabricState.NOT_STARTED

    clear_faults(path)
    info = _fabric(p, 0)
    assert (info["state"], info["cliqueId"], cluster_uuid(info)) == (FabricState.COMPLETED, 32766, rack_uuid)


def test_fabric_in_progress_on_one_gpu(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, fabric_in_progress(gpus=[1]))
    assert [_fabric(p, i)["state"] for i in range(4)] == [3, 2, 3, 3]


def test_degraded_health(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, fabric_degraded(gpus=[0, 2]))
    d = _fabric(p, 0)
    assert health_field(int(str(d["healthMask"])), HEALTH_DEGRADED_BW) == Tristate.TRUE
    assert d["healthSummary"] == HealthSummary.LIMITED_CAPACITY
    assert d["state"] == FabricState.COMPLETED
    assert _fabric(p, 1)["healthMask"] == 0x11AA
    v2 = p.struct_call("nvmlDeviceGetGpuFabricInfoV", handle(2), struct("c_nvmlGpuFabricInfo_v2_t"))
    assert v2["healthMask"] == d["healthMask"]

    unhealthy = health_mask(route_unhealthy=Tristate.TRUE)
    write_faults(path, fabric_degraded(mask=unhealthy, summary=HealthSummary.UNHEALTHY))
    for i in range(4):
        info = _fabric(p, i)
        assert health_field(int(str(info["healthMask"])), HEALTH_ROUTE_UNHEALTHY) == Tristate.TRUE
        assert info["healthSummary"] == HealthSummary.UNHEALTHY


def test_fabric_failed_status(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, fabric_failed(NvmlReturn.NOT_READY, gpus=[3]))
    info = _fabric(p, 3)
    assert (info["state"], info["status"]) == (FabricState.COMPLETED, NvmlReturn.NOT_READY)
    assert _fabric(p, 2)["status"] == 0


def test_gpu_missing(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    gpus = nvml_cluster.topology.node(NODE).gpus
    write_faults(path, gpu_missing(1))
    assert p.call("nvmlDeviceGetCount") == 3
    assert p.code("nvmlDeviceGetHandleByUUID", gpus[1].uuid) == NvmlReturn.NOT_FOUND
    assert p.code("nvmlDeviceGetHandleByPciBusId", gpus[1].pci_bus_id) == NvmlReturn.NOT_FOUND
    assert p.code("nvmlDeviceGetUUID", handle(1)) == NvmlReturn.GPU_IS_LOST  # a handle taken before
    assert p.code("nvmlDeviceGetHandleByIndex", 3) == NvmlReturn.INVALID_ARGUMENT
    # Enumeration closes the gap: index 1 is now the third GPU.
    h = handle(p.call("nvmlDeviceGetHandleByIndex", 1)["handle"])
    assert p.call("nvmlDeviceGetUUID", h) == gpus[2].uuid
    assert p.call("nvmlDeviceGetIndex", handle(3)) == 2
    assert p.call("nvmlDeviceGetMinorNumber", handle(3)) == 3

    clear_faults(path)
    assert p.call("nvmlDeviceGetCount") == 4
    assert p.call("nvmlDeviceGetUUID", handle(1)) == gpus[1].uuid


def test_all_gpus_missing_fails_a_new_init(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, gpu_missing(0, 1, 2, 3))
    assert p.call("nvmlDeviceGetCount") == 0
    p.call("nvmlShutdown")
    assert p.code("nvmlInit") == NvmlReturn.GPU_NOT_FOUND
    p.call("nvmlInitWithFlags", 1)
    assert p.call("nvmlDeviceGetCount") == 0


def test_init_error_then_cleared(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    path = default_fault_path(nvml_cluster.path, NODE)
    write_faults(path, init_error())
    p = nvml_probe(nvml_cluster.path, NODE)
    assert p.code("nvmlInit") == NvmlReturn.DRIVER_NOT_LOADED
    assert p.code("nvmlInitWithFlags", 1) == NvmlReturn.DRIVER_NOT_LOADED
    assert p.last_error() == ""  # an injected fault, not a configuration problem
    clear_faults(path)
    p.call("nvmlInit")
    # An initialised process keeps working when the fault comes back; only new inits fail.
    write_faults(path, init_error(NvmlReturn.LIB_RM_VERSION_MISMATCH))
    assert p.call("nvmlDeviceGetCount") == 4
    assert p.code("nvmlInit") == NvmlReturn.LIB_RM_VERSION_MISMATCH


def test_named_call_errors(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, merge(call_error("nvmlDeviceGetUUID", NvmlReturn.GPU_IS_LOST), call_error("nvmlDeviceGetCount")))
    assert p.code("nvmlDeviceGetUUID", handle(0)) == NvmlReturn.GPU_IS_LOST
    assert p.code("nvmlDeviceGetCount") == NvmlReturn.UNKNOWN  # pynvml calls the _v2 symbol
    assert p.raw("lib.nvmlDeviceGetCount(ctypes.byref(ctypes.c_uint()))") == NvmlReturn.UNKNOWN
    assert p.call("nvmlDeviceGetName", handle(0)) == "NVIDIA GB200"

    # Every call the library implements can be made to fail by its base name.
    for name in CALL_NAMES:
        if name == "nvmlShutdown":
            continue
        write_faults(path, call_error(name, NvmlReturn.TIMEOUT))
        code = p.exec(_CALL_ONE.format(name=name))
        assert code == NvmlReturn.TIMEOUT, name

    write_faults(path, NodeFaults(calls={"nvmlShutdown": NvmlReturn.IN_USE}))
    assert p.code("nvmlShutdown") == NvmlReturn.IN_USE
    clear_faults(path)
    p.call("nvmlShutdown")


# Calls `name` with valid arguments on handle 0 and returns its code.
_CALL_ONE = """
lib = pynvml.nvmlLib; h = handles[0]
b = ctypes.create_string_buffer(96); u = ctypes.c_uint(); i = ctypes.c_int(); j = ctypes.c_int()
out = pynvml.c_nvmlDevice_t(); fab = pynvml.c_nvmlGpuFabricInfo_v3_t(); v1 = pynvml.c_nvmlGpuFabricInfo_t()
pci = pynvml.nvmlPciInfo_t(); mem = pynvml.c_nvmlMemory_t()
calls = {{
 'nvmlSystemGetDriverVersion': lambda: lib.nvmlSystemGetDriverVersion(b, 96),
 'nvmlSystemGetNVMLVersion': lambda: lib.nvmlSystemGetNVMLVersion(b, 96),
 'nvmlSystemGetCudaDriverVersion': lambda: lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(i)),
 'nvmlDeviceGetCount': lambda: lib.nvmlDeviceGetCount_v2(ctypes.byref(u)),
 'nvmlDeviceGetHandleByIndex': lambda: lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(out)),
 'nvmlDeviceGetHandleByUUID': lambda: lib.nvmlDeviceGetHandleByUUID(b'GPU-x', ctypes.byref(out)),
 'nvmlDeviceGetHandleByPciBusId': lambda: lib.nvmlDeviceGetHandleByPciBusId_v2(b'8:1:0', ctypes.byref(out)),
 'nvmlDeviceGetName': lambda: lib.nvmlDeviceGetName(h, b, 96),
 'nvmlDeviceGetUUID': lambda: lib.nvmlDeviceGetUUID(h, b, 96),
 'nvmlDeviceGetSerial': lambda: lib.nvmlDeviceGetSerial(h, b, 30),
 'nvmlDeviceGetBoardPartNumber': lambda: lib.nvmlDeviceGetBoardPartNumber(h, b, 80),
 'nvmlDeviceGetPciInfo': lambda: lib.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci)),
 'nvmlDeviceGetMemoryInfo': lambda: lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)),
 'nvmlDeviceGetMinorNumber': lambda: lib.nvmlDeviceGetMinorNumber(h, ctypes.byref(u)),
 'nvmlDeviceGetIndex': lambda: lib.nvmlDeviceGetIndex(h, ctypes.byref(u)),
 'nvmlDeviceGetCudaComputeCapability':
     lambda: lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(i), ctypes.byref(j)),
 'nvmlDeviceGetGpuFabricInfo': lambda: lib.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(v1)),
 'nvmlDeviceGetGpuFabricInfoV': lambda: lib.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(fab)),
}}
result = calls[{name!r}]()
"""


def test_all_calls_error(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, NodeFaults(all_calls=NvmlReturn.UNKNOWN))
    assert p.code("nvmlSystemGetDriverVersion") == NvmlReturn.UNKNOWN
    assert p.code("nvmlDeviceGetMinorNumber", handle(2)) == NvmlReturn.UNKNOWN
    assert p.exec("result = pynvml.nvmlErrorString(15)") == "GPU is lost"  # never affected
    clear_faults(path)
    assert p.call("nvmlDeviceGetMinorNumber", handle(2)) == 2


def test_one_gpu_lost(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    gpus = nvml_cluster.topology.node(NODE).gpus
    write_faults(path, gpu_error(2))
    assert p.call("nvmlDeviceGetCount") == 4  # still enumerated
    assert p.code("nvmlDeviceGetHandleByIndex", 2) == NvmlReturn.GPU_IS_LOST
    assert p.code("nvmlDeviceGetHandleByUUID", gpus[2].uuid) == NvmlReturn.GPU_IS_LOST
    assert p.code("nvmlDeviceGetUUID", handle(2)) == NvmlReturn.GPU_IS_LOST
    assert p.code("nvmlDeviceGetGpuFabricInfoV", handle(2), struct("c_nvmlGpuFabricInfo_v3_t")) == 15
    assert p.call("nvmlDeviceGetUUID", handle(3)) == gpus[3].uuid


def test_fabric_identity_overrides(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    """A GPU that disagrees with its node about the clique (GFD then writes no label)."""
    p, path = _started(nvml_cluster, nvml_probe)
    other = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
    write_faults(path, NodeFaults(gpus={3: GpuFault(cluster_uuid=UUID(other), clique_id=1)}))
    info = _fabric(p, 3)
    assert (cluster_uuid(info), info["cliqueId"]) == (other, 1)
    assert _fabric(p, 2)["cliqueId"] == 32766


def test_successive_writes_are_all_seen(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    states = [FabricState.NOT_STARTED, FabricState.IN_PROGRESS, FabricState.COMPLETED, FabricState.NOT_SUPPORTED] * 4
    for state in states:
        write_faults(path, NodeFaults(all_gpus=GpuFault(fabric_state=state)))
        assert _fabric(p, 0)["state"] == state


def test_fault_path_from_environment(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory, tmp_path: Path) -> None:
    faults = tmp_path / "elsewhere" / "my.faults"
    p = nvml_probe(nvml_cluster.path, NODE, faults=faults)
    p.call("nvmlInit")
    write_faults(default_fault_path(nvml_cluster.path, NODE), gpu_missing(0))
    assert p.call("nvmlDeviceGetCount") == 4  # the default path is not consulted
    write_faults(faults, gpu_missing(0))
    assert p.call("nvmlDeviceGetCount") == 3


def test_faults_are_per_node(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    a = nvml_probe(nvml_cluster.path, "rack-0-node-00")
    b = nvml_probe(nvml_cluster.path, "rack-0-node-01")
    a.call("nvmlInit")
    b.call("nvmlInit")
    write_faults(default_fault_path(nvml_cluster.path, "rack-0-node-00"), gpu_missing(0, 1))
    assert (a.call("nvmlDeviceGetCount"), b.call("nvmlDeviceGetCount")) == (2, 4)


def test_malformed_fault_file_is_reported_and_ignored(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p, path = _started(nvml_cluster, nvml_probe)
    write_faults(path, gpu_missing(0))
    assert p.call("nvmlDeviceGetCount") == 3
    cases = {
        "gpu.0.missing = true\ngpu.0.bogus = 1\n": ":2: unknown GPU fault field 'bogus'",
        "gpu.9.missing = true\n": ":1: field 'gpu.9.missing': GPU 9 does not exist (this node has 4)",
        "call.nvmlDeviceGetFanSpeed = UNKNOWN\n": "'nvmlDeviceGetFanSpeed' is not a call this library implements",
        "init = SOMETIMES\n": ":1: field 'init': expected an NVML return code",
        "[gpu]\n": ":1: fault files have no sections",
        "gpu.0.missing = maybe\n": "field 'gpu.0.missing': expected true or false",
        "format = nvlfabric-nvml-faults/2\n": "unsupported format",
        "\x00\n": "invalid byte 0x00",
    }
    for text, message in cases.items():
        path.write_text(text)
        assert p.call("nvmlDeviceGetCount") == 4, text  # ignored as a whole
        assert message in p.last_error(), (text, p.last_error())
    assert "fault file ignored" in p.stderr()
    write_faults(path, gpu_missing(3))
    assert p.call("nvmlDeviceGetCount") == 3


def test_fault_models() -> None:
    f = merge(fabric_in_progress(), fabric_degraded(gpus=[1]), gpu_missing(2), fabric_not_started(gpus=[1]))
    text = f.render()
    assert "gpu.*.fabric_state = IN_PROGRESS" in text
    assert "gpu.1.fabric_state = NOT_STARTED" in text
    assert "gpu.1.health_summary = LIMITED_CAPACITY" in text
    assert "gpu.2.missing = true" in text
    # A later "all GPUs" fault overrides earlier per-GPU values of the same field.
    g = merge(fabric_not_started(gpus=[1]), fabric_in_progress())
    assert g.gpus[1].fabric_state is None and g.all_gpus is not None
    assert g.all_gpus.fabric_state == FabricState.IN_PROGRESS
    assert NodeFaults().is_empty() and not f.is_empty()
    with pytest.raises(ValidationError, match="unknown call names"):
        NodeFaults(calls={"nvmlDeviceGetFanSpeed": NvmlReturn.UNKNOWN})
    with pytest.raises(ValidationError):
        NodeFaults(gpus={16: GpuFault(missing=True)})


def test_concurrent_calls_while_faults_change(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    """ctypes releases the GIL, so these threads really call the library at the same time."""
    p, path = _started(nvml_cluster, nvml_probe)
    p.exec(
        "import collections, threading\n"
        "stop = threading.Event(); seen = collections.Counter()\n"
        "def worker():\n"
        "    lib = pynvml.nvmlLib; u = ctypes.c_uint(); f = pynvml.c_nvmlGpuFabricInfo_v3_t()\n"
        "    local = collections.Counter()\n"
        "    while not stop.is_set():\n"
        "        local[('count', lib.nvmlDeviceGetCount_v2(ctypes.byref(u)), u.value)] += 1\n"
        "        local[('fabric', lib.nvmlDeviceGetGpuFabricInfoV(handles[0], ctypes.byref(f)), f.state)] += 1\n"
        "    seen.update(local)\n"
        "threads = [threading.Thread(target=worker) for _ in range(4)]\n"
        "for t in threads: t.start()\n"
    )
    for i in range(20):
        write_faults(path, merge(gpu_missing(1), fabric_in_progress()) if i % 2 == 0 else NodeFaults())
        p.exec("import time; time.sleep(0.005)")
    clear_faults(path)
    seen = p.exec("stop.set()\nfor t in threads: t.join()\nresult = [[*k, v] for k, v in seen.items()]")
    outcomes = {tuple(entry[:-1]) for entry in seen}
    assert outcomes <= {("count", 0, 3), ("count", 0, 4), ("fabric", 0, 2), ("fabric", 0, 3)}, outcomes
    assert sum(entry[-1] for entry in seen) > 100
