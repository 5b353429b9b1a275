"""The topology models, the C parser's error messages, and fuzzing of both file parsers."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nvlfabric.sim.nvml.constants import FabricState, HealthSummary, NvmlReturn
from nvlfabric.sim.nvml.faults import GpuFault, NodeFaults, merge
from nvlfabric.sim.nvml.topology import (
    GB200_PCI_DOMAINS,
    Node,
    Rack,
    Topology,
    build_topology,
    gb200_gpu,
    gpu_uuid_for,
    write_topology,
)
from tests.sim.conftest import ProbeFactory
from tests.sim.nvml_helpers import Probe, ProbeDied, running_probe

# ---------------------------------------------------------------------- Python models


def test_default_rack_is_an_nvl72() -> None:
    topo = build_topology(1)
    assert len(topo.racks) == 1 and len(topo.nodes) == 18
    assert all(len(n.gpus) == 4 for n in topo.nodes)
    assert sum(len(n.gpus) for n in topo.nodes) == 72
    node = topo.nodes[5]
    assert node.name == "rack-0-node-05" and node.rack == "rack-0" and node.clique_id is None
    g = node.gpus[2]
    assert g.name == "NVIDIA GB200" and g.compute_capability == (10, 0)
    assert g.memory_total_mib == 189471 and g.minor == 2
    assert [x.pci_bus_id for x in node.gpus] == [f"{d:08X}:01:00.0" for d in GB200_PCI_DOMAINS]
    assert g.fabric_state == FabricState.COMPLETED and g.health_mask == 0x11AA
    assert re.fullmatch(r"1654\d{9}", g.serial)
    assert topo.clique(node.name) == f"{topo.racks[0].cluster_uuid}.32766"


def test_identities_are_deterministic_and_unique(tmp_path: Path) -> None:
    a = build_topology(3, 18)
    b = build_topology(3, 18)
    assert a == b and a.render() == b.render()
    uuids = [g.uuid for n in a.nodes for g in n.gpus]
    assert len(set(uuids)) == len(uuids) == 216
    assert len({r.cluster_uuid for r in a.racks}) == 3
    assert gpu_uuid_for("rack-0-node-00", 0) == a.nodes[0].gpus[0].uuid
    path = tmp_path / "x" / "t.conf"
    assert write_topology(path, 3, 18) == a
    assert path.read_text() == a.render()
    assert [p.name for p in path.parent.iterdir()] == ["t.conf"]  # no temporary files left


def test_partitions_split_a_rack() -> None:
    topo = build_topology(1, 18, cliques_per_rack=3)
    cliques = [n.clique_id for n in topo.nodes]
    assert cliques == [1] * 6 + [2] * 6 + [3] * 6
    assert topo.clique("rack-0-node-17").endswith(".3")


def test_extra_nodes_have_no_fabric() -> None:
    topo = build_topology(1, 2, 2, extra_nodes=["cpu-0"])
    assert topo.node("cpu-0").rack is None
    assert topo.clique("cpu-0") == ""
    assert "[node cpu-0]\n\n[gpu]" in topo.render()
    assert "fabric_state" not in topo.render().split("[node cpu-0]")[1]


def test_gpu_beyond_the_fourth_gets_a_plausible_bus_id() -> None:
    assert [gb200_gpu("n", i).pci_bus_id[:8] for i in range(4, 8)] == ["00000028", "00000029", "00000038", "00000039"]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: build_topology(1, 0), "nodes_per_rack"),
        (lambda: build_topology(1, 2, cliques_per_rack=3), "cliques_per_rack"),
        (lambda: build_topology(1, 2, 17), "gpus_per_node"),
        (lambda: Topology(nodes=(Node(name="a"), Node(name="a"))), "node names must be unique"),
        (lambda: Topology(nodes=(Node(name="a", rack="r"),)), "unknown rack"),
        (
            lambda: Topology(
                racks=(Rack(name="r", cluster_uuid=UUID(int=1)), Rack(name="r", cluster_uuid=UUID(int=2)))
            ),
            "rack names must be unique",
        ),
        (lambda: Node(name="a", clique_id=3), "clique_id needs a rack"),
        (lambda: Node(name="a", gpus=(gb200_gpu("a", 0, fabric_state=FabricState.IN_PROGRESS),)), "need the node"),
        (lambda: Node(name="a", gpus=(gb200_gpu("a", 1),)), "GPU indices"),
        (lambda: Node(name="a", gpus=(gb200_gpu("a", 0), gb200_gpu("a", 1, minor=0))), "minor values must be unique"),
        (
            lambda: Topology(
                nodes=(Node(name="a", gpus=(gb200_gpu("a", 0),)), Node(name="b", gpus=(gb200_gpu("a", 0),)))
            ),
            "GPU UUIDs must be unique",
        ),
        (lambda: gb200_gpu("a", 0, uuid="GPU-ABC"), "lower-case UUID"),
        (lambda: gb200_gpu("a", 0, pci_bus_id="0008:01:00.0"), "DDDDDDDD:BB:DD.0"),
        (lambda: gb200_gpu("a", 0, pci_bus_id="00010000:01:00.0"), "at most 0xFFFF"),
        (lambda: gb200_gpu("a", 0, memory_total_mib=10, memory_used_mib=11), "exceed memory_total_mib"),
        (lambda: gb200_gpu("a", 0, name="x" * 96), "at most 95"),
        (lambda: gb200_gpu("a", 0, serial="tab\there"), "printable ASCII"),
        (lambda: Node(name="-bad"), "String should match pattern"),
        (lambda: Topology(driver_version="570.x"), "dotted version"),
    ],
)
def test_model_validation(build: Callable[[], object], message: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=re.escape(message)):
        build()


# ---------------------------------------------------------------------- the C parser


def _small() -> Topology:
    return build_topology(1, 2, 2, extra_nodes=["cpu-0"])


NODE = "rack-0-node-01"

# Exercises every call after a successful init and always shuts down again.
_EXERCISE = """
pynvml._LoadNvmlLibrary()
lib = pynvml.nvmlLib
rc = lib.nvmlInit_v2()
if rc != 0:
    result = [rc, last_error()]
else:
    codes = []
    try:
        n = ctypes.c_uint(); codes.append(lib.nvmlDeviceGetCount_v2(ctypes.byref(n)))
        b = ctypes.create_string_buffer(96); u = ctypes.c_uint(); i = ctypes.c_int(); j = ctypes.c_int()
        codes.append(lib.nvmlSystemGetDriverVersion(b, 80)); codes.append(lib.nvmlSystemGetNVMLVersion(b, 80))
        codes.append(lib.nvmlSystemGetCudaDriverVersion(ctypes.byref(i)))
        for k in range(n.value):
            h = pynvml.c_nvmlDevice_t(); codes.append(lib.nvmlDeviceGetHandleByIndex_v2(k, ctypes.byref(h)))
            codes.append(lib.nvmlDeviceGetUUID(h, b, 96))
            h2 = pynvml.c_nvmlDevice_t(); codes.append(lib.nvmlDeviceGetHandleByUUID(b.value, ctypes.byref(h2)))
            codes.append(lib.nvmlDeviceGetName(h, b, 96)); codes.append(lib.nvmlDeviceGetSerial(h, b, 30))
            codes.append(lib.nvmlDeviceGetBoardPartNumber(h, b, 80))
            pci = pynvml.nvmlPciInfo_t(); codes.append(lib.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci)))
            bus_id = pci.busId.encode() if isinstance(pci.busId, str) else pci.busId  # pynvml decodes char arrays
            codes.append(lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(h2)))
            mem = pynvml.c_nvmlMemory_t(); codes.append(lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)))
            m2 = pynvml.c_nvmlMemory_v2_t(); m2.version = pynvml.nvmlMemory_v2
            codes.append(lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m2)))
            codes.append(lib.nvmlDeviceGetMinorNumber(h, ctypes.byref(u)))
            codes.append(lib.nvmlDeviceGetIndex(h, ctypes.byref(u)))
            codes.append(lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(i), ctypes.byref(j)))
            f1 = pynvml.c_nvmlGpuFabricInfo_t(); codes.append(lib.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(f1)))
            f2 = pynvml.c_nvmlGpuFabricInfo_v2_t(); codes.append(lib.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(f2)))
            f3 = pynvml.c_nvmlGpuFabricInfo_v3_t(); codes.append(lib.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(f3)))
    finally:
        codes.append(lib.nvmlShutdown())
    result = [0, codes]
"""

# A configuration error names the file and a line, a field, or the node.
ERROR_SHAPE = re.compile(
    r"^topology \S+(:\d+: .+|: the top level is missing required field '\w+'|: node '.+' \(from NVLFABRIC_NVML_NODE\)"
    r" has no \[node .+\] section)$"
)


def _replace_line(text: str, old: str, new: str) -> tuple[str, int]:
    lines = text.split("\n")
    idx = lines.index(old)
    lines[idx] = new
    return "\n".join(lines), idx + 1


PARSER_CASES: list[tuple[str, str, str, str]] = [
    # (old line, new line, expected message fragment; "@" stands for ":<line>:")
    (
        "format = nvlfabric-nvml-topology/1",
        "format = nvlfabric-nvml-topology/2",
        "@ field 'format': unsupported format",
        "",
    ),
    ("format = nvlfabric-nvml-topology/1", "# no format", "the top level is missing required field 'format'", ""),
    (
        "driver_version = 570.172.08",
        "driver_version = 570..172",
        "@ field 'driver_version': expected a dotted version",
        "",
    ),
    ("cuda_driver_version = 12080", "cuda_driver_version = 12.8", "@ field 'cuda_driver_version'", ""),
    ("driver_version = 570.172.08", "colour = blue", "@ unknown field 'colour' in the top level section", ""),
    ("clique_id = 32766", "clique_id = 4294967296", "@ field 'clique_id': expected an unsigned 32-bit integer", ""),
    ("clique_id = 32766", "clique_id = -1", "@ field 'clique_id'", ""),
    ("[rack rack-0]", "[rack rack 0]", "@ [rack] needs a name", ""),
    ("[rack rack-0]", "[switch rack-0]", "@ unknown section kind 'switch'", ""),
    ("[rack rack-0]", "[rack rack-0", "@ section header without closing ']'", ""),
    ("[rack rack-0]", "[Rack rack-0]", "@ malformed section header", ""),
    ("rack = rack-0", "rack = rack-9", "@ field 'rack': unknown rack", "first"),
    ("rack = rack-0", "rack = rack-0 ", "", "ok"),  # trailing blanks are trimmed
    ("index = 1", "index = 2", "@ field 'index': expected 1", ""),
    ("index = 1", "index = 01x", "@ field 'index': expected a GPU index 0-15", ""),
    ("minor = 1", "minor = 0", "field 'minor': 0 is used twice on this node", ""),
    ("minor = 1", "minor = 256", "@ field 'minor': expected a device minor number 0-255", ""),
    ("minor = 1", "# minor removed", "[gpu] section is missing required field 'minor'", ""),
    ("pci_bus_id = 00000009:01:00.0", "pci_bus_id = 00000009:01:00.1", "@ field 'pci_bus_id'", ""),
    ("pci_bus_id = 00000009:01:00.0", "pci_bus_id = 00000008:01:00.0", "field 'pci_bus_id': used twice", ""),
    ("pci_bus_id = 00000009:01:00.0", "pci_bus_id = 0009:01:00.0", "", "ok"),  # 4-digit domain accepted
    ("memory_used_mib = 0", "memory_used_mib = 189472", "memory_reserved_mib + memory_used_mib exceed", ""),
    ("memory_used_mib = 0", "memory_used_mib = 0x10", "@ field 'memory_used_mib'", ""),
    ("compute_capability = 10.0", "compute_capability = 10", "@ field 'compute_capability'", ""),
    ("fabric_state = COMPLETED", "fabric_state = DONE", "@ field 'fabric_state'", ""),
    ("fabric_state = COMPLETED", "fabric_state = NVML_GPU_FABRIC_STATE_IN_PROGRESS", "", "ok"),
    ("fabric_status = SUCCESS", "fabric_status = 12345", "@ field 'fabric_status'", ""),
    ("fabric_status = SUCCESS", "fabric_status = NVML_ERROR_NOT_READY", "", "ok"),
    ("health_mask = 0x11AA", "health_mask = 0x1_1AA", "@ field 'health_mask'", ""),
    ("health_summary = HEALTHY", "health_summary = 4", "@ field 'health_summary'", ""),
    ("name = NVIDIA GB200", "name = " + "N" * 96, "@ field 'name': longer than 95 characters", ""),
    ("name = NVIDIA GB200", "name =", "@ field 'name' has an empty value", ""),
    ("name = NVIDIA GB200", "name NVIDIA GB200", "@ expected 'key = value'", ""),
    ("name = NVIDIA GB200", "name = NVIDIA GB200\x01", "@ invalid byte 0x01 at column 20", ""),
    ("name = NVIDIA GB200", "name = NVIDIA GB200 \u00e9", "@ invalid byte 0xc3", ""),
    ("name = NVIDIA GB200", "n@me = x", "@ invalid character '@' in key 'n@me'", ""),
    ("name = NVIDIA GB200", "name = " + "x" * 2000, "@ line is longer than 1024 characters", ""),
    ("name = NVIDIA GB200", "name = " + "x" * 300, "@ value of field 'name' is longer than 255", ""),
    ("uuid = GPU-placeholder", "", "", ""),  # replaced below with a real UUID line
    ("[node cpu-0]", "[node rack-0-node-00]", "@ node 'rack-0-node-00' is declared twice", ""),
    ("[node cpu-0]", "[rack late]", "@ [rack late] comes after a [node] section", ""),
    ("[node cpu-0]", "[gpu] extra", "@ unexpected text after section header", ""),
    ("[node cpu-0]", "[gpu x]", "@ [gpu] takes no name", ""),
    ("[node cpu-0]", "[node cpu-0]\nclique_id = 5", "[node] section has field 'clique_id' but no 'rack'", ""),
    (
        "[node cpu-0]",
        "[node cpu-0]\ncluster_uuid = 7b968a6d-c8aa-45e1-9e07-e1e51be99c31",
        "@+1 field 'cluster_uuid' is not allowed in the [node] section",
        "",
    ),
    ("[node cpu-0]", "[node cpu-0]\nrack = rack-0\nrack = rack-0", "@+2 field 'rack' is given twice", ""),
]


def test_parser_errors_name_the_line_and_field(nvml_lib_dir: Path, tmp_path: Path, nvml_probe: ProbeFactory) -> None:
    base = _small().render()
    gpu1 = _small().node(NODE).gpus[1]
    path = tmp_path / "topology.conf"
    p = nvml_probe(path, NODE)
    p.exec("pynvml._LoadNvmlLibrary()")
    for old, new, expected, flag in PARSER_CASES:
        if old.startswith("uuid = GPU-placeholder"):
            old, new, expected = f"uuid = {gpu1.uuid}", f"uuid = {gpu1.uuid.upper()}", "@ field 'uuid': expected 'GPU-'"
        # Edit the second GPU of NODE (its lines are unique after its uuid) or the first match.
        text = base
        if old in (f"uuid = {gpu1.uuid}",) or old.startswith(("index = 1", "minor = 1", "pci_bus_id = 00000009")):
            head, tail = base.split(f"[node {NODE}]")
            tail_text, line_in_tail = _replace_line(tail, old, new)
            text = head + f"[node {NODE}]" + tail_text
            line = head.count("\n") + line_in_tail
        else:
            text, line = _replace_line(base, old, new)
        path.write_bytes(text.encode())
        code, detail = p.exec(_EXERCISE)
        if flag == "ok":
            assert code == 0, (new, detail)
            continue
        assert code == NvmlReturn.DRIVER_NOT_LOADED, (new, detail)
        assert ERROR_SHAPE.match(detail), detail
        m = re.match(r"@(?:\+(\d))? ", expected)
        if m:  # "@" / "@+N": the edited line / N lines after it
            expected = f"{path}:{line + int(m.group(1) or 0)}: " + expected[m.end() :]
        assert expected in detail, (expected, line, detail)
    assert "nvlfabric-nvml: topology" in p.stderr()


def test_parser_limits(tmp_path: Path, nvml_probe: ProbeFactory) -> None:
    path = tmp_path / "t.conf"
    p = nvml_probe(path, "n")
    p.exec("pynvml._LoadNvmlLibrary()")

    def init_error(text: str | bytes) -> str:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        code, detail = p.exec(_EXERCISE)
        assert code == NvmlReturn.DRIVER_NOT_LOADED, detail
        return str(detail)

    head = "format = nvlfabric-nvml-topology/1\ndriver_version = 1.0\nnvml_version = 1.0\ncuda_driver_version = 12080\n"
    gpus = "".join(
        f"[gpu]\nindex = {i}\nuuid = {gpu_uuid_for('n', i)}\npci_bus_id = 0000{i:04X}:01:00.0\nminor = {i}\n"
        for i in range(17)
    )
    assert "node has more than 16 [gpu] sections" in init_error(head + "[node n]\n" + gpus)
    assert "[gpu] must follow a [node] section" in init_error(head + "[gpu]\n")
    racks = "".join(f"[rack r{i}]\ncluster_uuid = {UUID(int=i)}\nclique_id = 1\n" for i in range(4097))
    assert f"{path}:{4 + 3 * 4096 + 1}: too many racks (at most 4096)" in init_error(head + racks)
    nodes = "".join(f"[node n{i}]\n" for i in range(65537))
    assert f"{path}:{4 + 65536 + 1}: too many nodes (at most 65536)" in init_error(head + nodes)
    assert "node 'n' (from NVLFABRIC_NVML_NODE)" in init_error(head + nodes.replace("[node n65536]\n", ""))
    assert "file is larger than" in init_error(b"#" * (17 * 1024 * 1024))
    assert "invalid byte 0x00" in init_error(head.encode() + b"\x00")
    # An empty file lacks the required top-level fields; the node is reported only after that.
    assert "missing required field 'format'" in init_error("")
    assert "node 'n'" in init_error(head)
    # CRLF line endings are accepted.
    path.write_text((head + "[node n]\n").replace("\n", "\r\n"))
    assert p.exec(_EXERCISE) == [NvmlReturn.GPU_NOT_FOUND, ""]  # parsed; the node has no GPUs
    assert "not a regular file" in init_error_dir(p, tmp_path)


def init_error_dir(p: Probe, tmp_path: Path) -> str:
    d = tmp_path / "adir"
    d.mkdir()
    q = p.exec(
        f"import os\nos.environ['NVLFABRIC_NVML_TOPOLOGY'] = {str(d)!r}\n"
        "rc = pynvml.nvmlLib.nvmlInit_v2()\nresult = last_error()"
    )
    return str(q)


def test_rendered_topologies_load_in_the_library(tmp_path: Path, nvml_probe: ProbeFactory) -> None:
    topo = build_topology(3, 18, cliques_per_rack=2, extra_nodes=["cpu-0", "cpu-1"])
    path = topo.write(tmp_path / "big.conf")
    p = nvml_probe(path, "rack-2-node-17")
    code, codes = p.exec(_EXERCISE)
    assert code == 0 and set(codes) == {0}


# ---------------------------------------------------------------------- fuzzing

_INTERESTING = [
    "",
    " ",
    "=",
    "[",
    "]",
    "[]",
    "[gpu]",
    "[node]",
    "[node x]",
    "[rack x]",
    "0",
    "-1",
    "0x",
    "0xFFFFFFFF",
    "4294967296",
    "18446744073709551616",
    "99999999999999999999999",
    "GPU-",
    "COMPLETED",
    "NVML_ERROR_",
    "10.",
    ".0",
    "1.2.3",
    "0000:00:00.0",
    "FFFFFFFF:FF:1F.0",
    "x" * 300,
    "\t",
    "#",
    "=" * 5,
    "\x7f",
    "\x00",
    "rack",
    "index",
    "uuid",
    "gpu.*.missing",
    "call.*",
]

# Values that are valid for some field, so that many mutated files still load.
_PLAUSIBLE = [
    "0",
    "1",
    "2",
    "3",
    "15",
    "16",
    "255",
    "32766",
    "4294967295",
    "0x11AA",
    "0x11A9",
    "0x0",
    "12080",
    "10.0",
    "9.0",
    "COMPLETED",
    "IN_PROGRESS",
    "NOT_STARTED",
    "NOT_SUPPORTED",
    "HEALTHY",
    "UNHEALTHY",
    "LIMITED_CAPACITY",
    "SUCCESS",
    "UNKNOWN",
    "NOT_READY",
    "GPU_IS_LOST",
    "rack-0",
    "cpu-0",
    "00000019:01:00.0",
    "0008:01:00.0",
    "GPU-00000000-0000-0000-0000-000000000001",
    "00000000-0000-0000-0000-000000000000",
    "570.172.08",
    "true",
    "NVIDIA GB200",
    "x" * 95,
]

_line_text = st.one_of(
    st.sampled_from(_INTERESTING),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=40),
    st.text(max_size=20),
)
_value_text = st.one_of(st.sampled_from(_PLAUSIBLE), st.sampled_from(_PLAUSIBLE), _line_text)


@st.composite
def _mutated(draw: st.DrawFn, base: str) -> bytes:
    """A valid file with 1-3 line-level edits and, sometimes, a few raw bytes spliced in."""
    lines = base.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(["delete", "duplicate", "swap", "replace", "value", "value", "key", "insert", "truncate"])
        )
        if not lines:
            lines = [""]
        i = draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "replace":
            lines[i] = draw(_line_text)
        elif op == "value" and "=" in lines[i]:
            lines[i] = lines[i].split("=", 1)[0] + "= " + draw(_value_text)
        elif op == "key" and "=" in lines[i]:
            lines[i] = draw(_line_text) + " =" + lines[i].split("=", 1)[1]
        elif op == "insert":
            lines.insert(i, draw(_line_text))
        elif op == "truncate":
            lines = lines[: max(i, len(lines) // 2)]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if data and draw(st.integers(0, 4)) == 0:
        pos = draw(st.integers(0, len(data) - 1))
        data = data[:pos] + draw(st.binary(max_size=8)) + data[pos + 1 :]
    return data


@st.composite
def _revalued(draw: st.DrawFn, base: str) -> bytes:
    """A valid file with one or two values replaced by values that are valid for some field."""
    lines = base.split("\n")
    kv = [i for i, line in enumerate(lines) if "=" in line]
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.sampled_from(kv))
        lines[i] = lines[i].split("=", 1)[0] + "= " + draw(st.sampled_from(_PLAUSIBLE))
    return "\n".join(lines).encode()


def _fuzz_input(base: str, max_binary: int) -> st.SearchStrategy[bytes]:
    return st.one_of(_mutated(base), _mutated(base), _revalued(base), st.binary(max_size=max_binary))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _FuzzTarget:
    """One probe process shared by all examples; replaced if it ever dies (so hypothesis can shrink)."""

    def __init__(self, lib_dir: Path, topology: Path, node: str) -> None:
        self.args = (lib_dir, topology, node)
        self._ctx: Any = None
        self.probe: Probe | None = None

    def start(self) -> Probe:
        self.stop()
        self._ctx = running_probe(*self.args)
        self.probe = self._ctx.__enter__()
        return self.probe

    def stop(self) -> None:
        if self._ctx is not None:
            ctx, self._ctx, self.probe = self._ctx, None, None
            ctx.__exit__(None, None, None)

    def run(self, code: str) -> Any:
        probe = self.probe or self.start()
        try:
            return probe.exec(code)
        except ProbeDied:
            self.probe = None
            raise


def test_fuzz_topology_parser_never_crashes(nvml_lib_dir: Path) -> None:
    base = _small().render()
    with tempfile.TemporaryDirectory(prefix="nvml-fuzz-") as tmp:
        path = Path(tmp) / "topology.conf"
        target = _FuzzTarget(nvml_lib_dir, path, NODE)
        try:

            @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(data=_fuzz_input(base, 600))
            def check(data: bytes) -> None:
                _write_atomic(path, data)
                code, detail = target.run(_EXERCISE)
                event(f"nvmlInit returned {code}")
                if code == 0:
                    assert all(c in (0, NvmlReturn.NOT_SUPPORTED) for c in detail), detail
                elif code == NvmlReturn.GPU_NOT_FOUND:  # a valid file in which the node has no GPUs
                    assert detail == ""
                else:
                    assert code == NvmlReturn.DRIVER_NOT_LOADED, (code, detail)
                    assert ERROR_SHAPE.match(detail), detail

            check()
            probe = target.probe or target.start()
            assert probe.close() == 0  # the process ends normally
        finally:
            target.stop()


def _rich_faults() -> NodeFaults:
    return merge(
        NodeFaults(init=None, calls={"nvmlDeviceGetUUID": NvmlReturn.UNKNOWN}),
        NodeFaults(all_gpus=GpuFault(fabric_state=FabricState.IN_PROGRESS, health_mask=0x11A9)),
        NodeFaults(
            gpus={
                0: GpuFault(missing=True),
                1: GpuFault(
                    error=NvmlReturn.GPU_IS_LOST,
                    health_summary=HealthSummary.UNHEALTHY,
                    clique_id=5,
                    cluster_uuid=UUID(int=7),
                    fabric_status=NvmlReturn.NOT_READY,
                ),
            }
        ),
    )


def test_fuzz_fault_parser_never_crashes(nvml_lib_dir: Path) -> None:
    base = _rich_faults().render()
    with tempfile.TemporaryDirectory(prefix="nvml-fuzz-") as tmp:
        topo_path = _small().write(Path(tmp) / "topology.conf")
        fault_path = Path(tmp) / "faults" / f"{NODE}.faults"
        fault_path.parent.mkdir()
        target = _FuzzTarget(nvml_lib_dir, topo_path, NODE)
        try:
            assert target.run("result = pynvml.nvmlInit()") is None

            @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(data=_fuzz_input(base, 300))
            def check(data: bytes) -> None:
                _write_atomic(fault_path, data)
                # Any NVML code may come back (the faults choose them); what matters is an answer.
                codes = target.run(_FAULT_EXERCISE)
                assert all(isinstance(c, int) for c in codes)
                err = target.run("result = last_error()")
                event("fault file rejected" if err else "fault file applied")
                assert err == "" or re.match(rf"^fault file ignored: {re.escape(str(fault_path))}:\d+: ", err), err

            check()
        finally:
            target.stop()


_FAULT_EXERCISE = """
lib = pynvml.nvmlLib
b = ctypes.create_string_buffer(96); u = ctypes.c_uint()
codes = [lib.nvmlDeviceGetCount_v2(ctypes.byref(u))]
for k in range(2):
    h = pynvml.c_nvmlDevice_t(); codes.append(lib.nvmlDeviceGetHandleByIndex_v2(k, ctypes.byref(h)))
    if codes[-1] == 0:
        codes.append(lib.nvmlDeviceGetUUID(h, b, 96))
        f3 = pynvml.c_nvmlGpuFabricInfo_v3_t(); codes.append(lib.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(f3)))
result = codes
"""
