"""The NVML stand-in seen through the unmodified pynvml: every export, its answers and its errors."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nvlfabric.sim.nvml.constants import (
    EXPORTED_SYMBOLS,
    HEALTH_DEGRADED_BW,
    HEALTH_MASK_HEALTHY,
    FabricState,
    HealthSummary,
    NvmlReturn,
    Tristate,
    health_field,
)
from nvlfabric.sim.nvml.topology import Node, Topology, build_topology, gb200_gpu
from tests.sim.conftest import NvmlCluster, ProbeFactory
from tests.sim.nvml_helpers import NVML_SRC, build_library, cluster_uuid, handle, struct

V2 = 0x02000024
V3 = 0x03000028
MIB = 1 << 20


def test_exports_exactly_the_documented_symbols(nvml_lib_dir: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is not installed")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(nvml_lib_dir / "libnvidia-ml.so.1")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert exported == EXPORTED_SYMBOLS


def test_makefile_rebuilds_only_when_sources_change(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(NVML_SRC, src, ignore=shutil.ignore_patterns("*.py", "__pycache__", "*.md"))
    out = tmp_path / "out"

    def make() -> str:
        return subprocess.run(["make", "-C", str(src), f"OUT={out}"], capture_output=True, text=True, check=True).stdout

    assert "gcc" in make() or (out / "libnvidia-ml.so.1").exists()
    first = (out / "libnvidia-ml.so.1").stat().st_mtime_ns
    assert "Nothing to be done" in make()
    assert (out / "libnvidia-ml.so.1").stat().st_mtime_ns == first
    (src / "standin.h").touch()
    make()
    assert (out / "libnvidia-ml.so.1").stat().st_mtime_ns != first
    # The default OUT is ../../build/nvml relative to the Makefile.
    dry = subprocess.run(["make", "-n", "-C", str(src)], capture_output=True, text=True, check=True).stdout
    assert "../../build/nvml/libnvidia-ml.so.1" in dry


def test_build_library_helper_reports_failures(tmp_path: Path) -> None:
    # OUT under a regular file cannot be created: the helper must raise with make's output.
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="building the NVML stand-in failed"):
        build_library(blocker / "sub")


def test_healthy_node_answers_every_query(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    topo = nvml_cluster.topology
    node = topo.node("rack-1-node-01")
    rack = topo.rack("rack-1")
    p = nvml_probe(nvml_cluster.path, node.name)

    p.call("nvmlInit")
    assert p.call("nvmlSystemGetDriverVersion") == topo.driver_version == "570.172.08"
    assert p.call("nvmlSystemGetNVMLVersion") == topo.nvml_version
    assert p.call("nvmlSystemGetCudaDriverVersion") == 12080
    assert p.call("nvmlSystemGetCudaDriverVersion_v2") == 12080
    assert p.call("nvmlDeviceGetCount") == 4

    for i, gpu in enumerate(node.gpus):
        h = handle(p.call("nvmlDeviceGetHandleByIndex", i)["handle"])
        assert p.call("nvmlDeviceGetName", h) == "NVIDIA GB200"
        assert p.call("nvmlDeviceGetUUID", h) == gpu.uuid
        assert p.call("nvmlDeviceGetSerial", h) == gpu.serial
        assert p.call("nvmlDeviceGetBoardPartNumber", h) == gpu.board_part_number
        assert p.call("nvmlDeviceGetMinorNumber", h) == i
        assert p.call("nvmlDeviceGetIndex", h) == i
        assert p.call("nvmlDeviceGetCudaComputeCapability", h) == [10, 0]

        pci = p.call("nvmlDeviceGetPciInfo", h)
        domain = (0x8, 0x9, 0x18, 0x19)[i]
        assert pci == {
            "busIdLegacy": f"{domain:04X}:01:00.0",
            "domain": domain,
            "bus": 1,
            "device": 0,
            "pciDeviceId": 0x294110DE,
            "pciSubSystemId": 0x204610DE,
            "busId": f"{domain:08X}:01:00.0",
        }
        assert p.call("nvmlDeviceGetPciInfo_v3", h) == pci

        mem = p.call("nvmlDeviceGetMemoryInfo", h)
        assert mem == {"total": 189471 * MIB, "free": 189471 * MIB, "used": 0}
        mem2 = p.call("nvmlDeviceGetMemoryInfo", h, 0x02000028)
        assert mem2 == {"version": 0x02000028, "total": 189471 * MIB, "reserved": 0, "free": 189471 * MIB, "used": 0}

        v1 = p.struct_call("nvmlDeviceGetGpuFabricInfo", h, struct("c_nvmlGpuFabricInfo_t"))
        assert cluster_uuid(v1) == str(rack.cluster_uuid)
        assert (v1["cliqueId"], v1["state"], v1["status"]) == (32766, FabricState.COMPLETED, 0)

        v2 = p.struct_call("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfo_v2_t"))
        assert v2["version"] == V2
        assert cluster_uuid(v2) == str(rack.cluster_uuid)
        assert (v2["cliqueId"], v2["state"], v2["status"], v2["healthMask"]) == (32766, 3, 0, 0x11AA)

        v3 = p.struct_call("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfo_v3_t"))
        assert v3["version"] == V3
        assert cluster_uuid(v3) == str(rack.cluster_uuid)
        assert (v3["healthMask"], v3["healthSummary"]) == (HEALTH_MASK_HEALTHY, HealthSummary.HEALTHY)

        # Lookups land on the same device.
        by_uuid = handle(p.call("nvmlDeviceGetHandleByUUID", gpu.uuid)["handle"])
        assert p.call("nvmlDeviceGetIndex", by_uuid) == i
        for bus_id in (f"{domain:08X}:01:00.0", f"{domain:04x}:01:00.0", f"{domain:x}:01:00"):
            by_bus = handle(p.call("nvmlDeviceGetHandleByPciBusId", bus_id)["handle"])
            assert p.call("nvmlDeviceGetUUID", by_bus) == gpu.uuid

    p.call("nvmlShutdown")
    assert p.close() == 0


def test_legacy_entry_points_and_reference_counting(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    """The unversioned symbols pynvml no longer calls, driven through pynvml's library handle."""
    node = nvml_cluster.topology.node("rack-0-node-00")
    p = nvml_probe(nvml_cluster.path, node.name)
    p.exec("pynvml._LoadNvmlLibrary()")

    assert p.raw("lib.nvmlInit()") == 0
    assert p.raw("lib.nvmlInit_v2()") == 0
    assert p.raw("lib.nvmlInitWithFlags(0)") == 0
    count = p.exec(
        "c = ctypes.c_uint(); rc = pynvml.nvmlLib.nvmlDeviceGetCount(ctypes.byref(c)); result = [rc, c.value]"
    )
    assert count == [0, 4]
    uuid = p.exec(
        "h = pynvml.c_nvmlDevice_t(); lib = pynvml.nvmlLib\n"
        "assert lib.nvmlDeviceGetHandleByIndex(2, ctypes.byref(h)) == 0\n"
        "b = ctypes.create_string_buffer(96)\n"
        "assert lib.nvmlDeviceGetUUID(h, b, 96) == 0\n"
        "h2 = pynvml.c_nvmlDevice_t()\n"
        "assert lib.nvmlDeviceGetHandleByPciBusId(b'00000018:01:00.0', ctypes.byref(h2)) == 0\n"
        "result = [b.value.decode(), ctypes.cast(h, ctypes.c_void_p).value == ctypes.cast(h2, ctypes.c_void_p).value]"
    )
    assert uuid == [node.gpus[2].uuid, True]
    # Three inits need three shutdowns; the fourth finds the library uninitialized.
    assert [p.raw("lib.nvmlShutdown()") for _ in range(4)] == [0, 0, 0, NvmlReturn.UNINITIALIZED]
    assert p.code("nvmlDeviceGetCount") == NvmlReturn.UNINITIALIZED
    p.call("nvmlInit")
    assert p.call("nvmlDeviceGetCount") == 4


def test_every_call_before_init_is_uninitialized(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p = nvml_probe(nvml_cluster.path, "rack-0-node-00")
    p.exec("pynvml._LoadNvmlLibrary()")  # loaded, never initialized
    codes = p.exec(
        "lib = pynvml.nvmlLib\n"
        "u = ctypes.c_uint(); i = ctypes.c_int(); h = pynvml.c_nvmlDevice_t(); b = ctypes.create_string_buffer(96)\n"
        "result = {\n"
        " 'shutdown': lib.nvmlShutdown(),\n"
        " 'driver': lib.nvmlSystemGetDriverVersion(b, 96),\n"
        " 'nvml': lib.nvmlSystemGetNVMLVersion(b, 96),\n"
        " 'cuda': lib.nvmlSystemGetCudaDriverVersion(ctypes.byref(i)),\n"
        " 'cuda2': lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(i)),\n"
        " 'count': lib.nvmlDeviceGetCount_v2(ctypes.byref(u)),\n"
        " 'index': lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)),\n"
        " 'uuid': lib.nvmlDeviceGetHandleByUUID(b'GPU-x', ctypes.byref(h)),\n"
        " 'pci': lib.nvmlDeviceGetHandleByPciBusId_v2(b'0008:01:00.0', ctypes.byref(h)),\n"
        " 'name': lib.nvmlDeviceGetName(h, b, 96),\n"
        " 'fabric': lib.nvmlDeviceGetGpuFabricInfo(h, b),\n"
        "}"
    )
    assert set(codes.values()) == {NvmlReturn.UNINITIALIZED}


def test_fabric_info_version_words(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p = nvml_probe(nvml_cluster.path, "rack-0-node-01")
    p.call("nvmlInit")
    h = handle(p.call("nvmlDeviceGetHandleByIndex", 0)["handle"])
    for bad in (0, 0x01000024, 0x02000028, 0x03000024, 0x04000228, 0xFFFFFFFF):
        assert p.code("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfo_v3_t", bad)) == (
            NvmlReturn.ARGUMENT_VERSION_MISMATCH
        ), hex(bad)
    # pynvml's own alias for the versioned struct is still v2.
    v = p.struct_call("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfoV_t"))
    assert v["version"] == V2 and v["healthMask"] == 0x11AA
    # A v2 request must not touch the bytes after the 36-byte v2 struct.
    tail = p.exec(
        "buf = (ctypes.c_ubyte * 40)(*([0xEE] * 40)); ctypes.c_uint.from_buffer(buf).value = 0x02000024\n"
        "assert pynvml.nvmlLib.nvmlDeviceGetGpuFabricInfoV(handles[0], buf) == 0\n"
        "result = list(buf[28:40])"
    )
    assert tail == [3, 0, 0, 0, 0xAA, 0x11, 0, 0, 0xEE, 0xEE, 0xEE, 0xEE]
    assert p.code("nvmlDeviceGetMemoryInfo", h, 0x01000018) == NvmlReturn.ARGUMENT_VERSION_MISMATCH
    # The newest pynvml-only v4 entry point is not implemented: pynvml reports FunctionNotFound.
    assert p.code("nvmlDeviceGetGpuFabricInfo_v4", h, struct("c_nvmlGpuFabricInfo_v4_t")) == (
        NvmlReturn.FUNCTION_NOT_FOUND
    )


def test_argument_errors(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p = nvml_probe(nvml_cluster.path, "rack-0-node-01")
    p.call("nvmlInit")
    assert p.call("nvmlDeviceGetHandleByIndex", 0) == {"handle": 0}  # handles[0] in the probe
    assert p.code("nvmlDeviceGetHandleByIndex", 4) == NvmlReturn.INVALID_ARGUMENT
    assert p.code("nvmlDeviceGetHandleByUUID", "GPU-00000000-0000-0000-0000-000000000000") == NvmlReturn.NOT_FOUND
    other = nvml_cluster.topology.node("rack-0-node-00").gpus[0].uuid
    assert p.code("nvmlDeviceGetHandleByUUID", other) == NvmlReturn.NOT_FOUND  # another node's GPU
    assert p.code("nvmlDeviceGetHandleByPciBusId", "00000009:02:00.0") == NvmlReturn.NOT_FOUND
    for garbage in ("", "zz", "0008", "0008:100:00.0", "0008:01:00.9", "0008:01:00.0x", "1:2:3:4", "123456789:01:00.0"):
        assert p.code("nvmlDeviceGetHandleByPciBusId", garbage) == NvmlReturn.INVALID_ARGUMENT, garbage
    codes = p.exec(
        "lib = pynvml.nvmlLib; h = handles[0]\n"
        "b = ctypes.create_string_buffer(96); u = ctypes.c_uint(); i = ctypes.c_int()\n"
        "bogus = ctypes.cast(ctypes.c_void_p(ctypes.cast(h, ctypes.c_void_p).value + 1), pynvml.c_nvmlDevice_t)\n"
        "result = {\n"
        " 'flags': lib.nvmlInitWithFlags(8),\n"
        " 'uuid_small': lib.nvmlDeviceGetUUID(h, b, 40),\n"
        " 'uuid_exact': lib.nvmlDeviceGetUUID(h, b, 41),\n"
        " 'name_small': lib.nvmlDeviceGetName(h, b, 12),\n"
        " 'serial_small': lib.nvmlDeviceGetSerial(h, b, 5),\n"
        " 'part_small': lib.nvmlDeviceGetBoardPartNumber(h, b, 5),\n"
        " 'driver_small': lib.nvmlSystemGetDriverVersion(b, 10),\n"
        " 'nvml_small': lib.nvmlSystemGetNVMLVersion(b, 0),\n"
        " 'null_count': lib.nvmlDeviceGetCount_v2(None),\n"
        " 'null_cuda': lib.nvmlSystemGetCudaDriverVersion(None),\n"
        " 'null_handle_out': lib.nvmlDeviceGetHandleByIndex_v2(0, None),\n"
        " 'null_uuid_arg': lib.nvmlDeviceGetHandleByUUID(None, ctypes.byref(pynvml.c_nvmlDevice_t())),\n"
        " 'null_pci_arg': lib.nvmlDeviceGetHandleByPciBusId_v2(None, ctypes.byref(pynvml.c_nvmlDevice_t())),\n"
        " 'null_name_buf': lib.nvmlDeviceGetName(h, None, 96),\n"
        " 'null_pci': lib.nvmlDeviceGetPciInfo_v3(h, None),\n"
        " 'null_mem': lib.nvmlDeviceGetMemoryInfo(h, None),\n"
        " 'null_mem2': lib.nvmlDeviceGetMemoryInfo_v2(h, None),\n"
        " 'null_minor': lib.nvmlDeviceGetMinorNumber(h, None),\n"
        " 'null_index': lib.nvmlDeviceGetIndex(h, None),\n"
        " 'null_cc': lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(i), None),\n"
        " 'null_fabric': lib.nvmlDeviceGetGpuFabricInfo(h, None),\n"
        " 'null_fabric_v': lib.nvmlDeviceGetGpuFabricInfoV(h, None),\n"
        " 'null_device': lib.nvmlDeviceGetUUID(None, b, 96),\n"
        " 'bogus_device': lib.nvmlDeviceGetMinorNumber(bogus, ctypes.byref(u)),\n"
        " 'foreign_device': lib.nvmlDeviceGetIndex(ctypes.cast(b, pynvml.c_nvmlDevice_t), ctypes.byref(u)),\n"
        "}"
    )
    assert codes.pop("uuid_exact") == NvmlReturn.SUCCESS
    for key in ("uuid_small", "name_small", "serial_small", "part_small", "driver_small", "nvml_small"):
        assert codes.pop(key) == NvmlReturn.INSUFFICIENT_SIZE, key
    assert codes == dict.fromkeys(codes, int(NvmlReturn.INVALID_ARGUMENT))


def test_error_strings(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p = nvml_probe(nvml_cluster.path, "rack-0-node-00")
    p.call("nvmlInit")
    strings = p.exec("result = {c: pynvml.nvmlErrorString(c) for c in list(range(0, 31)) + [999, 12345]}")
    assert strings["0"] == "Success"
    assert strings["9"] == "Driver Not Loaded"
    assert strings["25"] == "Argument version mismatch"
    assert strings["999"] == strings["12345"] == "Unknown Error"
    assert all(isinstance(s, str) and s for s in strings.values())
    # pynvml asks the library for codes missing from its own table.
    assert p.exec("result = str(pynvml.NVMLError(28))") == "GPU not found"


def test_answers_depend_on_the_node_identity(tmp_path: Path, nvml_probe: ProbeFactory) -> None:
    topo = build_topology(2, 4, cliques_per_rack=2)
    path = topo.write(tmp_path / "topology.conf")
    seen: dict[str, tuple[str, int, list[str]]] = {}
    for name in ("rack-0-node-00", "rack-0-node-01", "rack-0-node-03", "rack-1-node-00"):
        p = nvml_probe(path, name)
        p.call("nvmlInit")
        uuids = []
        fabric = set()
        for i in range(p.call("nvmlDeviceGetCount")):
            h = handle(p.call("nvmlDeviceGetHandleByIndex", i)["handle"])
            uuids.append(p.call("nvmlDeviceGetUUID", h))
            info = p.struct_call("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfo_v3_t"))
            fabric.add((cluster_uuid(info), info["cliqueId"]))
        assert len(fabric) == 1  # all GPUs of a node agree
        (cluster, clique) = fabric.pop()
        assert f"{cluster}.{clique}" == topo.clique(name)
        seen[name] = (cluster, clique, uuids)
        assert uuids == [g.uuid for g in topo.node(name).gpus]
        p.close()
    assert seen["rack-0-node-00"][:2] == seen["rack-0-node-01"][:2] == (str(topo.rack("rack-0").cluster_uuid), 1)
    assert seen["rack-0-node-03"][:2] == (str(topo.rack("rack-0").cluster_uuid), 2)
    assert seen["rack-1-node-00"][0] == str(topo.rack("rack-1").cluster_uuid) != seen["rack-0-node-00"][0]
    all_uuids = [u for _, _, us in seen.values() for u in us]
    assert len(set(all_uuids)) == len(all_uuids)


def test_node_outside_any_nvlink_domain(nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory) -> None:
    p = nvml_probe(nvml_cluster.path, "cpu-0")
    p.call("nvmlInit")
    assert p.call("nvmlDeviceGetCount") == 4
    h = handle(p.call("nvmlDeviceGetHandleByIndex", 0)["handle"])
    assert p.code("nvmlDeviceGetGpuFabricInfo", h, struct("c_nvmlGpuFabricInfo_t")) == NvmlReturn.NOT_SUPPORTED
    assert p.code("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfo_v3_t")) == NvmlReturn.NOT_SUPPORTED
    # The version is still checked first.
    assert p.code("nvmlDeviceGetGpuFabricInfoV", h, struct("c_nvmlGpuFabricInfo_v3_t", 7)) == (
        NvmlReturn.ARGUMENT_VERSION_MISMATCH
    )
    assert nvml_cluster.topology.clique("cpu-0") == ""


def test_topology_values_reach_the_caller(tmp_path: Path, nvml_probe: ProbeFactory) -> None:
    """Non-default values in the file: memory split, fabric states, per-GPU overrides."""
    base = build_topology(1, 1)
    n = base.nodes[0]
    other_cluster = "00000000-0000-0000-0000-000000000000"
    gpus = (
        gb200_gpu(n.name, 0, memory_total_mib=1000, memory_reserved_mib=100, memory_used_mib=200, serial=""),
        gb200_gpu(n.name, 1, fabric_state=FabricState.IN_PROGRESS, board_part_number=""),
        gb200_gpu(
            n.name,
            2,
            health_mask=0x11A9,
            health_summary=HealthSummary.LIMITED_CAPACITY,
            fabric_status=NvmlReturn.NOT_READY,
        ),
        gb200_gpu(
            n.name, 3, cluster_uuid=other_cluster, clique_id=7, compute_capability=(12, 1), name="NVIDIA GB200 (test)"
        ),
    )
    topo = Topology(racks=base.racks, nodes=(Node(name=n.name, rack=n.rack, gpus=gpus),))
    path = topo.write(tmp_path / "t.conf")
    p = nvml_probe(path, n.name)
    p.call("nvmlInit")
    hs = [handle(p.call("nvmlDeviceGetHandleByIndex", i)["handle"]) for i in range(4)]
    assert p.call("nvmlDeviceGetMemoryInfo", hs[0]) == {"total": 1000 * MIB, "free": 700 * MIB, "used": 300 * MIB}
    assert p.call("nvmlDeviceGetMemoryInfo", hs[0], 0x02000028) == {
        "version": 0x02000028,
        "total": 1000 * MIB,
        "reserved": 100 * MIB,
        "free": 700 * MIB,
        "used": 200 * MIB,
    }
    assert p.code("nvmlDeviceGetSerial", hs[0]) == NvmlReturn.NOT_SUPPORTED
    assert p.code("nvmlDeviceGetBoardPartNumber", hs[1]) == NvmlReturn.NOT_SUPPORTED
    f1 = p.struct_call("nvmlDeviceGetGpuFabricInfoV", hs[1], struct("c_nvmlGpuFabricInfo_v3_t"))
    assert (f1["state"], f1["cliqueId"], cluster_uuid(f1)) == (FabricState.IN_PROGRESS, 0, other_cluster)
    f2 = p.struct_call("nvmlDeviceGetGpuFabricInfoV", hs[2], struct("c_nvmlGpuFabricInfo_v3_t"))
    assert (f2["healthMask"], f2["healthSummary"], f2["status"]) == (0x11A9, 3, NvmlReturn.NOT_READY)
    assert health_field(f2["healthMask"], HEALTH_DEGRADED_BW) == Tristate.TRUE
    f3 = p.struct_call("nvmlDeviceGetGpuFabricInfo", hs[3], struct("c_nvmlGpuFabricInfo_t"))
    assert (cluster_uuid(f3), f3["cliqueId"]) == (other_cluster, 7)
    assert p.call("nvmlDeviceGetCudaComputeCapability", hs[3]) == [12, 1]
    assert p.call("nvmlDeviceGetName", hs[3]) == "NVIDIA GB200 (test)"


def test_zero_gpu_node_needs_the_no_gpus_flag(tmp_path: Path, nvml_probe: ProbeFactory) -> None:
    topo = build_topology(1, 1, 0)
    path = topo.write(tmp_path / "t.conf")
    p = nvml_probe(path, topo.nodes[0].name)
    assert p.code("nvmlInit") == NvmlReturn.GPU_NOT_FOUND
    p.call("nvmlInitWithFlags", 1)  # NVML_INIT_FLAG_NO_GPUS
    assert p.call("nvmlDeviceGetCount") == 0
    assert p.code("nvmlDeviceGetHandleByIndex", 0) == NvmlReturn.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"topology": False}, "NVLFABRIC_NVML_TOPOLOGY is not set"),
        ({"node": None}, "NVLFABRIC_NVML_NODE is not set"),
        ({"node": "no-such-node"}, "node 'no-such-node' (from NVLFABRIC_NVML_NODE) has no [node no-such-node] section"),
        ({"missing_file": True}, "cannot open: No such file or directory"),
    ],
)
def test_configuration_errors_are_reported(
    nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory, env: dict[str, object], message: str
) -> None:
    topology = None if env.get("topology") is False else nvml_cluster.path
    if env.get("missing_file"):
        topology = nvml_cluster.path.with_name("absent.conf")
    node = env.get("node", "rack-0-node-00")
    p = nvml_probe(topology, node if isinstance(node, str) else None)
    assert p.code("nvmlInit") == NvmlReturn.DRIVER_NOT_LOADED
    assert message in p.last_error()
    assert message in p.stderr()
    assert p.close() == 0


def test_library_found_by_soname_when_preloaded(
    nvml_lib_dir: Path, nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory
) -> None:
    """Without LD_LIBRARY_PATH, loading the file by path first satisfies pynvml's CDLL("libnvidia-ml.so.1")."""
    p = nvml_probe(nvml_cluster.path, "rack-0-node-00", lib_dir=None)
    p.exec(f"ctypes.CDLL({str(nvml_lib_dir / 'libnvidia-ml.so.1')!r})")
    p.call("nvmlInit")
    assert p.call("nvmlDeviceGetCount") == 4
    assert p.exec("result = pynvml.nvmlLib._name") == "libnvidia-ml.so.1"


def test_pynvml_resolves_the_library_through_ld_library_path(
    nvml_lib_dir: Path, nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory
) -> None:
    p = nvml_probe(nvml_cluster.path, "rack-0-node-00")
    p.call("nvmlInit")
    mapped = p.exec("result = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libnvidia-ml' in l})")
    assert mapped == [str(nvml_lib_dir / "libnvidia-ml.so.1")]


def test_without_the_library_pynvml_reports_library_not_found(
    nvml_cluster: NvmlCluster, nvml_probe: ProbeFactory
) -> None:
    p = nvml_probe(nvml_cluster.path, "rack-0-node-00", lib_dir=None)
    if p.exec("import ctypes.util\nresult = ctypes.util.find_library('nvidia-ml')"):
        pytest.skip("a real libnvidia-ml is installed on this machine")
    assert p.code("nvmlInit") == NvmlReturn.LIBRARY_NOT_FOUND
