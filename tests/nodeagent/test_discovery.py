"""Discovery through unmodified pynvml against the NVML stand-in, per node and under faults.

Each case runs discovery in a fresh process: NVML's library handle is process-global."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.nodeagent.discovery import Gpu, GpuFabric, clique_of
from nvlfabric.sim import hardware
from nvlfabric.sim.nodes import rack_nodes, runtime_root
from nvlfabric.sim.nvml import faults, topology


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    state = tmp_path_factory.mktemp("disc")
    nodes = rack_nodes(state, racks=2, nodes_per_rack=2)
    built = hardware.build_standins()
    hardware.write_topology(state, nodes)
    for n in nodes:
        n.prepare_dirs()
        hardware.install_driver_root(n, built)
    yield state, [n.name for n in nodes]
    shutil.rmtree(runtime_root(state), ignore_errors=True)


def discover(state: Path, node: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    sim_node = next(n for n in rack_nodes(state, 2, 2) if n.name == node)
    env.update(hardware.node_env(state, sim_node))
    driver_root = state / "nodes" / node / "driver-root"
    code = ("import sys; from pathlib import Path; from nvlfabric.nodeagent.discovery import discover; "
            "print(discover(Path(sys.argv[1])).model_dump_json())")
    proc = subprocess.run([sys.executable, "-c", code, str(driver_root)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_each_node_sees_its_four_gb200s_and_its_rack_clique(sim_cluster: tuple[Path, list[str]]) -> None:
    state, names = sim_cluster
    results = {n: discover(state, n) for n in names}
    for name, d in results.items():
        gpus = d["gpus"]
        assert isinstance(gpus, list) and len(gpus) == 4
        assert {g["name"] for g in gpus} == {"NVIDIA GB200"} and gpus[0]["compute_capability"] == "10.0"
        assert d["fabric_ready"] is True and d["reason"] == ""
        rack = name.rsplit("-node-", 1)[0]
        assert d["clique"] == f"{topology.cluster_uuid_for(rack)}.{topology.DEFAULT_CLIQUE_ID}"
    assert results["rack-0-node-00"]["clique"] == results["rack-0-node-01"]["clique"]
    assert results["rack-0-node-00"]["clique"] != results["rack-1-node-00"]["clique"]
    uuids = [g["uuid"] for d in results.values() for g in d["gpus"]]  # type: ignore[attr-defined]
    assert len(set(uuids)) == 16


@pytest.mark.parametrize(("fault", "reason"), [
    (faults.fabric_not_started(), "fabric registration is NotStarted"),
    (faults.fabric_in_progress([2]), "GPU 2 fabric registration is InProgress"),
])
def test_a_fabric_that_is_not_ready_is_reported_with_the_reason(sim_cluster: tuple[Path, list[str]],
                                                               fault: faults.NodeFaults, reason: str) -> None:
    state, names = sim_cluster
    path = hardware.fault_path(state, names[1])
    faults.write_faults(path, fault)
    try:
        d = discover(state, names[1])
    finally:
        faults.clear_faults(path)
    assert d["fabric_ready"] is False and d["clique"] is None
    assert reason in str(d["reason"])


def test_degraded_health_keeps_the_clique_but_shows_the_health(sim_cluster: tuple[Path, list[str]]) -> None:
    state, names = sim_cluster
    path = hardware.fault_path(state, names[0])
    faults.write_faults(path, faults.fabric_degraded([1]))
    try:
        d = discover(state, names[0])
    finally:
        faults.clear_faults(path)
    assert d["fabric_ready"] is True
    assert d["gpus"][1]["fabric"]["health_summary"] == "LimitedCapacity"  # type: ignore[index]
    assert d["gpus"][0]["fabric"]["health_summary"] == "Healthy"  # type: ignore[index]


def test_gpus_that_disagree_on_the_clique_have_no_clique() -> None:
    def gpu(i: int, cluster: str) -> Gpu:
        return Gpu(index=i, uuid=f"GPU-{i}", name="NVIDIA GB200", minor=i, pci_bus_id="", memory_mib=1,
                   compute_capability="10.0", fabric=GpuFabric(cluster_uuid=cluster, clique_id=1, state="Completed"))
    clique, reason = clique_of([gpu(0, "a"), gpu(1, "b")])
    assert clique is None and "disagree" in reason
