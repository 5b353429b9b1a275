"""The fabric health verdict on unmodified pynvml against the NVML stand-in, for each fault
`nvlfabric-sim fault` injects: a reading while healthy, the fault written (as into a running
agent), a second reading. Each case runs in a fresh process: NVML's library handle is
process-global. What the cluster then sees: tests/e2e/test_fabric_health.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.sim import hardware
from nvlfabric.sim.nodes import SimNode, rack_nodes, runtime_root
from nvlfabric.sim.nvml import faults

RACK = 93  # a rack number of its own


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SimNode]]:
    state = tmp_path_factory.mktemp("fh")
    (node,) = rack_nodes(state, racks=1, nodes_per_rack=1, first_rack=RACK)
    hardware.write_topology(state, [node])
    node.prepare_dirs()
    hardware.install_driver_root(node, hardware.build_standins())
    yield state, node
    shutil.rmtree(runtime_root(state), ignore_errors=True)


READ_TWICE = """
import json
import sys
from pathlib import Path
from nvlfabric.nodeagent import discovery, fabrichealth as fh
from nvlfabric.sim.nvml import faults
driver_root, fault_path, fault = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
known = fh.KnownGpus(None, "")
session = discovery.Session(driver_root)  # as the agent reads: NVML stays initialised between readings
found, error = fh.read(session)
assert fh.judge(found, error, known.update(found.gpus)).healthy, found
faults.write_faults(fault_path, faults.NodeFaults.model_validate_json(fault))
found, error = fh.read(session)
v = fh.judge(found, error, known.update(found.gpus))
print(json.dumps({"healthy": v.healthy, "reason": v.reason, "message": v.message, "gpus": list(v.gpus)}))
"""


def verdict(state: Path, node: SimNode, fault: faults.NodeFaults) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(hardware.node_env(state, node))
    path = hardware.fault_path(state, node.name)
    try:
        proc = subprocess.run([sys.executable, "-c", READ_TWICE, str(node.dir / "driver-root"), str(path),
                               fault.model_dump_json()], capture_output=True, text=True, env=env, timeout=60)
    finally:
        faults.clear_faults(path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(("fault", "reason", "gpus", "words"), [
    pytest.param(faults.fabric_degraded(), "FabricDegraded", [0, 1, 2, 3],
                 ["NVLink fabric health LimitedCapacity (health mask 0x11A9: bandwidth degraded)"], id="degraded"),
    pytest.param(faults.fabric_not_started([2]), "FabricNotReady", [2],
                 ["GPU 2 fabric registration is NotStarted"], id="not-started"),
    pytest.param(faults.gpu_missing(1), "GpuMissing", [1],
                 ["GPU 1 (GPU-", "missing: NVML lists 3 of the 4 GPUs"], id="gpu-missing"),
    # What `nvlfabric-sim fault nvml-error` writes: the driver gone under the running agent.
    pytest.param(faults.driver_gone(), "NvmlError", [0, 1, 2, 3],
                 ["NVML query failed: Driver Not Loaded", "health of GPU 0 (GPU-"], id="nvml-error"),
])
def test_each_fault_is_judged_with_its_gpus_and_reason(standin: tuple[Path, SimNode], fault: faults.NodeFaults,
                                                       reason: str, gpus: list[int], words: list[str]) -> None:
    state, node = standin
    v = verdict(state, node, fault)
    assert (v["healthy"], v["reason"], v["gpus"]) == (False, reason, gpus), v
    for w in words:
        assert w in str(v["message"]), v


RECOVER = """
import sys
from pathlib import Path
from nvlfabric.nodeagent import discovery, fabrichealth as fh
from nvlfabric.sim.nvml import faults
driver_root, fault_path = Path(sys.argv[1]), Path(sys.argv[2])
session = discovery.Session(driver_root)
assert fh.read(session)[1] == ""
faults.write_faults(fault_path, faults.driver_gone())
print(fh.read(session)[1])
print(fh.read(session)[1])
faults.clear_faults(fault_path)
found, error = fh.read(session)
print(error or f"healthy {found.clique} {len(found.gpus)}")
"""


def test_a_session_initialises_nvml_again_once_the_driver_is_back(standin: tuple[Path, SimNode]) -> None:
    """The agent keeps NVML initialised; a driver gone and back needs no agent restart."""
    state, node = standin
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(hardware.node_env(state, node))
    path = hardware.fault_path(state, node.name)
    try:
        proc = subprocess.run([sys.executable, "-c", RECOVER, str(node.dir / "driver-root"), str(path)],
                              capture_output=True, text=True, env=env, timeout=60)
    finally:
        faults.clear_faults(path)
    assert proc.returncode == 0, proc.stderr
    gone, still, back = proc.stdout.splitlines()
    assert gone == "NVML query failed: Driver Not Loaded"
    assert still == "NVML could not be initialised: Driver Not Loaded"
    assert back.startswith("healthy ") and back.endswith(" 4")
