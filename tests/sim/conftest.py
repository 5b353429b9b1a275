"""Fixtures for the simulator tests: the NVML stand-in library, topologies and probe processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvlfabric.sim.nvml.topology import Topology, build_topology
from tests.sim.imex_fixtures import build_imex
from tests.sim.nvml_helpers import Probe, build_library, running_probe


@pytest.fixture(scope="session")
def nvml_lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builds libnvidia-ml.so.1 once per session with `make -C nvlfabric/sim/nvml OUT=<tmp>`."""
    return build_library(tmp_path_factory.mktemp("nvml-lib"))


@pytest.fixture(scope="session")
def imex_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The IMEX stand-ins, built once per session; NVLFABRIC_IMEX_ASAN=1: the ASan/UBSan build instead."""
    plain = build_imex(tmp_path_factory.mktemp("imex-bin"))
    return build_imex(tmp_path_factory.mktemp("imex-asan"), asan=True) if os.environ.get(
        "NVLFABRIC_IMEX_ASAN") == "1" else plain


@dataclass(frozen=True)
class NvmlCluster:
    topology: Topology
    path: Path


@pytest.fixture
def nvml_cluster(tmp_path: Path) -> NvmlCluster:
    """Two racks of two nodes (4 GB200s each) plus one node outside any NVLink domain."""
    topo = build_topology(2, 2, extra_nodes=["cpu-0"])
    path = tmp_path / "nvml" / "topology.conf"
    topo.write(path)
    return NvmlCluster(topology=topo, path=path)


ProbeFactory = Callable[..., Probe]


@pytest.fixture
def nvml_probe(nvml_lib_dir: Path) -> Iterator[ProbeFactory]:
    """Starts probes: nvml_probe(topology_path, node, faults=None, extra_env=None, lib_dir=...)."""
    with ExitStack() as stack:

        def start(
            topology: Path | None,
            node: str | None,
            faults: Path | None = None,
            extra_env: dict[str, str] | None = None,
            lib_dir: Path | None = nvml_lib_dir,
        ) -> Probe:
            return stack.enter_context(running_probe(lib_dir, topology, node, faults, extra_env))

        yield start
