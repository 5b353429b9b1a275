"""The topology the NVML stand-in serves: racks (NVLink domains), nodes, GPUs.

This module is the one place the topology file is produced from Python. The format is
described in `nvlfabric/sim/nvml/README.md`; the C parser in `standin_config.c` is its only reader.

    topo = build_topology(racks=2, nodes_per_rack=18)
    topo.write(state_dir / "nvml" / "topology.conf")

Identities are deterministic: the same names always give the same GPU UUIDs, serials and
cluster UUIDs, so a re-created simulator answers exactly as before.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Self
from uuid import NAMESPACE_DNS, UUID, uuid5

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvlfabric.api import names
from nvlfabric.sim.nvml.constants import (
    HEALTH_MASK_HEALTHY,
    TOPOLOGY_FORMAT,
    FabricState,
    HealthSummary,
    NvmlReturn,
)

#: Namespace of every UUID this module derives from a name.
UUID_NAMESPACE = uuid5(NAMESPACE_DNS, "nvml.sim.nvlfabric.io")

#: Realistic GB200 values (compute tray with 4 GPUs, R570 driver).
GB200_NAME = "NVIDIA GB200"
GB200_PCI_DEVICE_ID = 0x294110DE
GB200_PCI_SUBSYSTEM_ID = 0x204610DE
GB200_MEMORY_MIB = 189471
GB200_PCI_DOMAINS = (0x0008, 0x0009, 0x0018, 0x0019)
GB200_BOARD_PART_NUMBER = "699-2G548-0200-A00"
DEFAULT_DRIVER_VERSION = "570.172.08"
DEFAULT_NVML_VERSION = "12.570.172.08"
DEFAULT_CUDA_DRIVER_VERSION = 12080
#: NMX-C's default partition ID, used as the clique ID of a rack with one partition.
DEFAULT_CLIQUE_ID = 32766
GPUS_PER_NODE = names.GPUS_PER_NODE
NODES_PER_RACK = names.NODES_PER_CLIQUE

MAX_GPUS_PER_NODE = 16

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
UInt32 = Annotated[int, Field(ge=0, le=0xFFFFFFFF)]
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_BUS_ID = re.compile(r"^([0-9A-F]{8}):([0-9A-F]{2}):([0-9A-F]{2})\.0$")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")


def _text(value: str, limit: int) -> str:
    if len(value) > limit:
        raise ValueError(f"at most {limit} characters")
    if not _PRINTABLE.match(value) or value != value.strip():
        raise ValueError("printable ASCII without leading or trailing blanks")
    return value


class Gpu(BaseModel):
    """One GPU as NVML reports it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: str
    name: str = GB200_NAME
    serial: str = ""
    board_part_number: str = ""
    pci_bus_id: str
    pci_device_id: UInt32 = GB200_PCI_DEVICE_ID
    pci_subsystem_id: UInt32 = GB200_PCI_SUBSYSTEM_ID
    minor: Annotated[int, Field(ge=0, le=255)]
    memory_total_mib: Annotated[int, Field(ge=0, le=1 << 24)] = GB200_MEMORY_MIB
    memory_reserved_mib: Annotated[int, Field(ge=0, le=1 << 24)] = 0
    memory_used_mib: Annotated[int, Field(ge=0, le=1 << 24)] = 0
    compute_capability: tuple[Annotated[int, Field(ge=0, le=99)], Annotated[int, Field(ge=0, le=99)]] = (
        10,
        0,
    )
    # Fabric: only meaningful when the node is in a rack.
    fabric_state: FabricState = FabricState.COMPLETED
    fabric_status: NvmlReturn = NvmlReturn.SUCCESS
    health_mask: UInt32 = HEALTH_MASK_HEALTHY
    health_summary: HealthSummary = HealthSummary.HEALTHY
    #: Overrides of the rack's cluster UUID / the node's clique ID, to model disagreement.
    cluster_uuid: UUID | None = None
    clique_id: UInt32 | None = None

    @field_validator("uuid")
    @classmethod
    def _check_uuid(cls, v: str) -> str:
        if not _GPU_UUID.match(v):
            raise ValueError("expected 'GPU-' and a lower-case UUID")
        return v

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        return _text(v, 95)

    @field_validator("serial")
    @classmethod
    def _check_serial(cls, v: str) -> str:
        return _text(v, 29)

    @field_validator("board_part_number")
    @classmethod
    def _check_part(cls, v: str) -> str:
        return _text(v, 79)

    @field_validator("pci_bus_id")
    @classmethod
    def _check_bus_id(cls, v: str) -> str:
        m = _BUS_ID.match(v)
        if not m:
            raise ValueError("expected DDDDDDDD:BB:DD.0 in upper-case hex")
        if int(m.group(1), 16) > 0xFFFF or int(m.group(3), 16) > 0x1F:
            raise ValueError("domain must be at most 0xFFFF and device at most 0x1F")
        return v

    @model_validator(mode="after")
    def _check_memory(self) -> Self:
        if self.memory_reserved_mib + self.memory_used_mib > self.memory_total_mib:
            raise ValueError("memory_reserved_mib + memory_used_mib exceed memory_total_mib")
        return self

    def has_fabric_overrides(self) -> bool:
        return (
            self.fabric_state != FabricState.COMPLETED
            or self.fabric_status != NvmlReturn.SUCCESS
            or self.health_mask != HEALTH_MASK_HEALTHY
            or self.health_summary != HealthSummary.HEALTHY
            or self.cluster_uuid is not None
            or self.clique_id is not None
        )


class Node(BaseModel):
    """A Kubernetes node (one GB200 compute tray)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Name
    #: The rack (NVLink domain) the node is cabled into; None: no NVLink fabric at all.
    rack: Name | None = None
    #: The NVLink partition; None: the rack's clique ID.
    clique_id: UInt32 | None = None
    gpus: tuple[Gpu, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if len(self.gpus) > MAX_GPUS_PER_NODE:
            raise ValueError(f"at most {MAX_GPUS_PER_NODE} GPUs per node")
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError("GPU indices must be 0, 1, 2, ... in order")
        for attr in ("uuid", "minor", "pci_bus_id"):
            values = [getattr(g, attr) for g in self.gpus]
            if len(set(values)) != len(values):
                raise ValueError(f"GPU {attr} values must be unique on a node")
        if self.rack is None:
            if self.clique_id is not None:
                raise ValueError("clique_id needs a rack")
            if any(g.has_fabric_overrides() for g in self.gpus):
                raise ValueError("GPU fabric fields need the node to be in a rack")
        return self


class Rack(BaseModel):
    """An NVLink domain: one NVSwitch fabric, one cluster UUID."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Name
    cluster_uuid: UUID
    #: The clique ID of the rack's nodes unless a node names its own partition.
    clique_id: UInt32 = DEFAULT_CLIQUE_ID


class Topology(BaseModel):
    """Everything the stand-in library knows about the simulated cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver_version: str = DEFAULT_DRIVER_VERSION
    nvml_version: str = DEFAULT_NVML_VERSION
    cuda_driver_version: Annotated[int, Field(ge=1000, le=99999)] = DEFAULT_CUDA_DRIVER_VERSION
    racks: tuple[Rack, ...] = ()
    nodes: tuple[Node, ...] = ()

    @field_validator("driver_version", "nvml_version")
    @classmethod
    def _check_version(cls, v: str) -> str:
        if not _VERSION.match(v) or len(v) > 79:
            raise ValueError("expected a dotted version such as 570.172.08")
        return v

    @model_validator(mode="after")
    def _check(self) -> Self:
        rack_names = [r.name for r in self.racks]
        if len(set(rack_names)) != len(rack_names):
            raise ValueError("rack names must be unique")
        node_names = [n.name for n in self.nodes]
        if len(set(node_names)) != len(node_names):
            raise ValueError("node names must be unique")
        known = set(rack_names)
        for n in self.nodes:
            if n.rack is not None and n.rack not in known:
                raise ValueError(f"node {n.name!r} names unknown rack {n.rack!r}")
        uuids = [g.uuid for n in self.nodes for g in n.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("GPU UUIDs must be unique across the topology")
        return self

    # ------------------------------------------------------------------ queries

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def rack(self, name: str) -> Rack:
        for r in self.racks:
            if r.name == name:
                return r
        raise KeyError(name)

    def nodes_in_rack(self, rack: str) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.rack == rack)

    def clique(self, node: str) -> str:
        """The clique ID NVIDIA's software derives for a healthy node: `<clusterUuid>.<cliqueId>`,
        or "" for a node outside any NVLink fabric (as GFD / the DRA driver do)."""
        n = self.node(node)
        if n.rack is None:
            return ""
        r = self.rack(n.rack)
        return f"{r.cluster_uuid}.{r.clique_id if n.clique_id is None else n.clique_id}"

    # ------------------------------------------------------------------ output

    def render(self) -> str:
        out = [
            "# nvlfabric NVML stand-in topology; generated by nvlfabric.sim.nvml.topology, see its README.md",
            f"format = {TOPOLOGY_FORMAT}",
            f"driver_version = {self.driver_version}",
            f"nvml_version = {self.nvml_version}",
            f"cuda_driver_version = {self.cuda_driver_version}",
        ]
        for r in self.racks:
            out += ["", f"[rack {r.name}]", f"cluster_uuid = {r.cluster_uuid}", f"clique_id = {r.clique_id}"]
        for n in self.nodes:
            out += ["", f"[node {n.name}]"]
            if n.rack is not None:
                out.append(f"rack = {n.rack}")
            if n.clique_id is not None:
                out.append(f"clique_id = {n.clique_id}")
            for g in n.gpus:
                out += ["", "[gpu]", *_render_gpu(g, fabric=n.rack is not None)]
        return "\n".join(out) + "\n"

    def write(self, path: Path) -> Path:
        """Writes the file atomically (readers see the old or the new file, never a mix)."""
        atomic_write(path, self.render())
        return path


def _render_gpu(g: Gpu, *, fabric: bool) -> list[str]:
    lines = [
        f"index = {g.index}",
        f"uuid = {g.uuid}",
        f"name = {g.name}",
    ]
    if g.serial:
        lines.append(f"serial = {g.serial}")
    if g.board_part_number:
        lines.append(f"board_part_number = {g.board_part_number}")
    lines += [
        f"pci_bus_id = {g.pci_bus_id}",
        f"pci_device_id = 0x{g.pci_device_id:08X}",
        f"pci_subsystem_id = 0x{g.pci_subsystem_id:08X}",
        f"minor = {g.minor}",
        f"memory_total_mib = {g.memory_total_mib}",
        f"memory_reserved_mib = {g.memory_reserved_mib}",
        f"memory_used_mib = {g.memory_used_mib}",
        f"compute_capability = {g.compute_capability[0]}.{g.compute_capability[1]}",
    ]
    if fabric:
        lines += [
            f"fabric_state = {g.fabric_state.name}",
            f"fabric_status = {g.fabric_status.name}",
            f"health_mask = 0x{g.health_mask:04X}",
            f"health_summary = {g.health_summary.name}",
        ]
        if g.cluster_uuid is not None:
            lines.append(f"cluster_uuid = {g.cluster_uuid}")
        if g.clique_id is not None:
            lines.append(f"clique_id = {g.clique_id}")
    return lines


def atomic_write(path: Path, text: str) -> None:
    """Replaces `path` with `text` by rename, so a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------- naming and identities


def rack_name(rack: int) -> str:
    return f"rack-{rack}"


def node_name(rack: str, node: int) -> str:
    return f"{rack}-node-{node:02d}"


def cluster_uuid_for(rack: str) -> UUID:
    return uuid5(UUID_NAMESPACE, f"rack/{rack}")


def gpu_uuid_for(node: str, index: int) -> str:
    return f"GPU-{uuid5(UUID_NAMESPACE, f'gpu/{node}/{index}')}"


def gpu_serial_for(node: str, index: int) -> str:
    digest = hashlib.sha256(f"serial/{node}/{index}".encode()).digest()
    return "1654" + f"{int.from_bytes(digest[:8], 'big') % 10**9:09d}"


def gb200_gpu(node: str, index: int, **overrides: object) -> Gpu:
    """A GB200 GPU with realistic values; `overrides` replace any field."""
    if index < len(GB200_PCI_DOMAINS):
        domain = GB200_PCI_DOMAINS[index]
    else:  # beyond a real tray's four: continue the pattern 0x28, 0x29, 0x38, 0x39, ...
        pair, low = divmod(index, 2)
        domain = 0x08 + 0x10 * pair + low
    fields: dict[str, object] = {
        "index": index,
        "uuid": gpu_uuid_for(node, index),
        "name": GB200_NAME,
        "serial": gpu_serial_for(node, index),
        "board_part_number": GB200_BOARD_PART_NUMBER,
        "pci_bus_id": f"{domain:08X}:01:00.0",
        "minor": index,
    }
    fields.update(overrides)
    return Gpu.model_validate(fields)


def build_topology(
    racks: int,
    nodes_per_rack: int = NODES_PER_RACK,
    gpus_per_node: int = GPUS_PER_NODE,
    *,
    cliques_per_rack: int = 1,
    extra_nodes: Iterable[str] = (),
    driver_version: str = DEFAULT_DRIVER_VERSION,
    nvml_version: str = DEFAULT_NVML_VERSION,
    cuda_driver_version: int = DEFAULT_CUDA_DRIVER_VERSION,
) -> Topology:
    """`racks` NVL72-style racks of `nodes_per_rack` nodes with `gpus_per_node` GB200s each.

    With `cliques_per_rack` > 1 a rack's nodes are split into that many NVLink partitions of
    (nearly) equal size, numbered 1, 2, ...; with one partition the clique ID is NMX-C's
    default partition, 32766. `extra_nodes` are nodes in no NVLink domain (their fabric calls
    return NOT_SUPPORTED), with the same GPUs.
    """
    if racks < 0 or nodes_per_rack < 1 or not 0 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise ValueError("need racks >= 0, nodes_per_rack >= 1 and 0 <= gpus_per_node <= 16")
    if not 1 <= cliques_per_rack <= nodes_per_rack:
        raise ValueError("cliques_per_rack must be between 1 and nodes_per_rack")
    rack_list: list[Rack] = []
    node_list: list[Node] = []
    for r in range(racks):
        rname = rack_name(r)
        rack_list.append(
            Rack(
                name=rname,
                cluster_uuid=cluster_uuid_for(rname),
                clique_id=DEFAULT_CLIQUE_ID if cliques_per_rack == 1 else 1,
            )
        )
        for n in range(nodes_per_rack):
            nname = node_name(rname, n)
            clique = None if cliques_per_rack == 1 else 1 + n * cliques_per_rack // nodes_per_rack
            node_list.append(
                Node(
                    name=nname,
                    rack=rname,
                    clique_id=clique,
                    gpus=tuple(gb200_gpu(nname, i) for i in range(gpus_per_node)),
                )
            )
    for nname in extra_nodes:
        node_list.append(Node(name=nname, gpus=tuple(gb200_gpu(nname, i) for i in range(gpus_per_node))))
    return Topology(
        driver_version=driver_version,
        nvml_version=nvml_version,
        cuda_driver_version=cuda_driver_version,
        racks=tuple(rack_list),
        nodes=tuple(node_list),
    )


def write_topology(
    path: Path,
    racks: int,
    nodes_per_rack: int = NODES_PER_RACK,
    gpus_per_node: int = GPUS_PER_NODE,
    *,
    cliques_per_rack: int = 1,
    extra_nodes: Iterable[str] = (),
) -> Topology:
    """Builds a topology with `build_topology` and writes it to `path`."""
    topo = build_topology(
        racks, nodes_per_rack, gpus_per_node, cliques_per_rack=cliques_per_rack, extra_nodes=extra_nodes
    )
    topo.write(path)
    return topo
