"""The agent's fabric health verdict (nvlfabric/nodeagent/fabrichealth.py): which GPUs, which
reason, from NVML readings as discovery returns them; the health mask decoded by the reference's
field table (shared/reference/nvml-imex-gb200.md 1.4). The verdict on the real NVML stand-in and
what the cluster sees are tested on the simulator (tests/e2e/test_fabric_health.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.nodeagent import fabrichealth as fh
from nvlfabric.nodeagent.discovery import Gpu, GpuFabric, NodeDiscovery, clique_of

CLUSTER = "9f410827-489f-46fd-8203-51266ca08eb7"
DEGRADED_BW_MASK = 0x11A9  # DEGRADED_BW = TRUE (1), everything else as on a healthy GPU


def gpu(index: int, *, state: str = "Completed", status: int = 0, mask: int | None = fh.HEALTHY_MASK,
        summary: str | None = "Healthy") -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", name="NVIDIA GB200", minor=index,
               pci_bus_id=f"0000000{index}:01:00.0", memory_mib=189471, compute_capability="10.0",
               fabric=GpuFabric(cluster_uuid=CLUSTER, clique_id=32766, state=state, status=status, health_mask=mask,
                                health_summary=summary))


def node(*gpus: Gpu) -> NodeDiscovery:
    found = NodeDiscovery(driver_version="580.65.06", gpus=list(gpus))
    found.clique, found.reason = clique_of(found.gpus)
    found.fabric_ready = found.clique is not None
    return found


def known(*gpus: Gpu) -> dict[str, int]:
    return {g.uuid: g.index for g in gpus}


FOUR = [gpu(i) for i in range(4)]


# -- the health mask ------------------------------------------------------------------------------


def test_a_healthy_mask_names_no_problem() -> None:
    assert fh.mask_problems(fh.HEALTHY_MASK) == []
    assert fh.mask_problems(0) == []  # every field "not supported": nothing to say


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("DEGRADED_BW", 1, "bandwidth degraded"),
    ("ROUTE_RECOVERY", 1, "route recovery in progress"),
    ("ROUTE_UNHEALTHY", 1, "route unhealthy"),
    ("ACCESS_TIMEOUT_RECOVERY", 1, "access timeout recovery in progress"),
    ("INCORRECT_CONFIGURATION", 5, "insufficient NVLinks"),
    ("INCORRECT_CONFIGURATION", 8, "GPU state invalid"),
    ("PARTITION_ASSIGNED", 2, "no partition assigned"),
    ("GFM_STATE", 2, "fabric manager disconnected"),
])
def test_each_field_of_the_mask_is_read_at_its_shift(field: str, value: int, problem: str) -> None:
    _, shift, width, _ = next(f for f in fh.MASK_FIELDS if f[0] == field)
    mask = (fh.HEALTHY_MASK & ~(width << shift)) | (value << shift)
    assert fh.mask_problems(mask) == [problem]


@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_any_mask_decodes_field_by_field(mask: int) -> None:
    """Never raises, and names exactly the problems of each field's own bits (higher bits ignored)."""
    expected = [p for _, shift, width, problems in fh.MASK_FIELDS if (p := problems.get((mask >> shift) & width))]
    assert fh.mask_problems(mask) == expected
    assert fh.mask_problems(mask & 0xFFFF) == expected


@given(st.integers(min_value=0, max_value=0xFFFF))
def test_degraded_bandwidth_is_named_whatever_else_the_mask_says(mask: int) -> None:
    assert "bandwidth degraded" in fh.mask_problems((mask & ~0x3) | 0x1)
    assert "bandwidth degraded" not in fh.mask_problems((mask & ~0x3) | 0x2)


# -- the verdict ----------------------------------------------------------------------------------


def test_a_healthy_node() -> None:
    v = fh.judge(node(*FOUR), "", known(*FOUR))
    assert v == fh.Verdict(True, fh.REGISTERED, f"NVLink clique {CLUSTER}.32766, 4 GPUs healthy")


def test_degraded_bandwidth_names_the_gpus_summary_and_mask() -> None:
    """`nvlfabric-sim fault fabric-degraded`: every GPU LimitedCapacity, DEGRADED_BW set."""
    gpus = [gpu(i, mask=DEGRADED_BW_MASK, summary="LimitedCapacity") for i in range(4)]
    v = fh.judge(node(*gpus), "", known(*gpus))
    assert not v.healthy and v.reason == fh.DEGRADED and v.gpus == (0, 1, 2, 3)
    assert v.message == (", ".join(f"GPU {g.index} ({g.uuid})" for g in gpus)
                         + ": NVLink fabric health LimitedCapacity (health mask 0x11A9: bandwidth degraded)")


def test_gpus_with_different_problems_are_named_apart() -> None:
    gpus = [gpu(0), gpu(1, summary="Unhealthy"), gpu(2, mask=0x119A, summary="Healthy"), gpu(3)]
    v = fh.judge(node(*gpus), "", known(*gpus))
    assert v.reason == fh.DEGRADED and v.gpus == (1, 2)
    assert v.message == (f"GPU 1 ({gpus[1].uuid}): NVLink fabric health Unhealthy; "
                         f"GPU 2 ({gpus[2].uuid}): NVLink health mask 0x119A: route unhealthy")


def test_a_v2_driver_has_only_the_mask_and_an_old_one_neither() -> None:
    v2 = [gpu(0, mask=DEGRADED_BW_MASK, summary=None), gpu(1, summary=None)]
    assert fh.judge(node(*v2), "", known(*v2)).gpus == (0,)
    v1 = [gpu(0, mask=None, summary=None)]
    assert fh.judge(node(*v1), "", known(*v1)).healthy


def test_a_fabric_not_started_names_the_gpus_and_the_state() -> None:
    gpus = [gpu(0), gpu(1, state="NotStarted"), gpu(2), gpu(3, state="NotStarted")]
    v = fh.judge(node(*gpus), "", known(*gpus))
    assert v.reason == fh.NOT_READY and v.gpus == (1, 3)
    assert "GPU 1 fabric registration is NotStarted" in v.message


def test_a_gpu_that_fell_off_the_bus_is_missing_by_its_first_index() -> None:
    """NVML enumerates the remaining GPUs 0..2: GPU 3 was GPU 2's index before; the missing one is
    named by the index it had when seen."""
    before = known(*FOUR)
    left = [gpu(0), gpu(1), gpu(3).model_copy(update={"index": 2})]
    v = fh.judge(node(*left), "", before)
    assert v.reason == fh.GPU_MISSING and v.gpus == (2,)
    assert v.message == f"GPU 2 ({FOUR[2].uuid}) missing: NVML lists 3 of the 4 GPUs this node had since boot"


def test_nvml_errors_name_every_known_gpu_unknown() -> None:
    v = fh.judge(NodeDiscovery(reason="x"), "NVML could not be initialised: Driver Not Loaded", known(*FOUR))
    assert v.reason == fh.NVML_ERROR and v.gpus == (0, 1, 2, 3)
    assert v.message.startswith("NVML could not be initialised: Driver Not Loaded; health of GPU 0 (")
    fresh = fh.judge(NodeDiscovery(reason="x"), "NVML could not be initialised: Driver Not Loaded", {})
    assert fresh.message == "NVML could not be initialised: Driver Not Loaded" and fresh.gpus == ()


def test_the_worst_problem_wins() -> None:
    """A missing GPU hides the fabric state of the others; NVML failing hides everything."""
    sick = [gpu(0, state="InProgress"), gpu(1, mask=DEGRADED_BW_MASK)]
    assert fh.judge(node(*sick), "", known(*sick)).reason == fh.NOT_READY
    assert fh.judge(node(*sick), "", known(*sick, gpu(2))).reason == fh.GPU_MISSING
    assert fh.judge(node(*sick), "NVML query failed: GPU is lost", known(*sick)).reason == fh.NVML_ERROR


@given(st.lists(st.tuples(st.sampled_from(["Completed", "InProgress", "NotStarted"]),
                          st.integers(min_value=0, max_value=0xFFFF),
                          st.sampled_from([None, "NotSupported", "Healthy", "Unhealthy", "LimitedCapacity"])),
                min_size=1, max_size=4))
def test_a_verdict_is_healthy_exactly_when_no_gpu_has_a_problem(readings: list[tuple[str, int, str | None]]) -> None:
    gpus = [gpu(i, state=s, mask=m, summary=h) for i, (s, m, h) in enumerate(readings)]
    v = fh.judge(node(*gpus), "", known(*gpus))
    problem = any(s != "Completed" or fh.mask_problems(m) or h in fh.BAD_SUMMARIES for s, m, h in readings)
    assert v.healthy is not problem
    assert v.healthy == (v.gpus == ())
    assert set(v.gpus) <= set(range(len(gpus)))
    for i in v.gpus:
        assert f"GPU {i}" in v.message or v.reason == fh.NOT_READY


# -- what the node remembers, and its taint list ----------------------------------------------------------


def test_known_gpus_survive_an_agent_restart_but_not_a_reboot(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    first = fh.KnownGpus(path, "boot-1")
    assert first.update(FOUR) == known(*FOUR)
    assert first.update(FOUR[:3]) == known(*FOUR)  # memory only grows
    assert fh.KnownGpus(path, "boot-1").update([]) == known(*FOUR)  # a restarted agent
    assert fh.KnownGpus(path, "boot-2").update(FOUR[:3]) == known(*FOUR[:3])  # a new boot
    path.write_text("{not json")
    assert fh.KnownGpus(path, "boot-2").update([]) == {}  # a broken file is ignored, not fatal


def test_our_taint_is_added_and_removed_leaving_the_others() -> None:
    others = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
              {"key": "example.com/rack", "value": "r1", "effect": "NoSchedule"}]
    sick = fh.Verdict(False, fh.DEGRADED, "m", (0,))
    tainted = fh.wanted_taints(others, sick)
    assert tainted == [*others, {"key": "nvlfabric.io/fabric-unhealthy", "value": "FabricDegraded",
                                 "effect": "NoSchedule"}]
    assert fh.wanted_taints(tainted, fh.Verdict(True, fh.REGISTERED, "ok")) == others
    assert fh.wanted_taints(tainted, sick) == tainted
