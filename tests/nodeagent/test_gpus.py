"""The node's GPUs as DRA devices (nvlfabric/nodeagent/gpus.py): which GPUs a verdict taints and
since when, the slice and the CDI spec they are published as. What the cluster does with them
(the scheduler skipping a tainted GPU, NoExecute's eviction, the pod's allocatedResourcesStatus) is
tested on the simulator (tests/e2e/test_fabric_health.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.api import names
from nvlfabric.api.kubelet.cdi import Spec
from nvlfabric.nodeagent import fabrichealth as fh
from nvlfabric.nodeagent import gpus
from tests.nodeagent.test_fabrichealth import DEGRADED_BW_MASK, FOUR, gpu, known, node

T0, T1 = "2026-12-07T08:00:00Z", "2026-12-07T08:05:00Z"


def test_only_the_gpus_at_fault_are_tainted_and_keep_the_time_they_turned_sick() -> None:
    sick = [*FOUR[:3], gpu(3, mask=DEGRADED_BW_MASK, summary="LimitedCapacity")]
    verdict = fh.judge(node(*sick), "", known(*sick))
    first = gpus.taints(verdict, [0, 1, 2, 3], {}, T0)
    assert first == {3: gpus.Taint(fh.DEGRADED, T0)}
    # Still sick a reading later, and when a second GPU joins it: the first keeps its time.
    worse = [gpu(0, mask=DEGRADED_BW_MASK, summary="LimitedCapacity"), *sick[1:]]
    later = gpus.taints(fh.judge(node(*worse), "", known(*worse)), [0, 1, 2, 3], first, T1)
    assert later == {0: gpus.Taint(fh.DEGRADED, T1), 3: gpus.Taint(fh.DEGRADED, T0)}
    assert gpus.taints(fh.judge(node(*FOUR), "", known(*FOUR)), [0, 1, 2, 3], later, T1) == {}


def test_a_missing_gpu_stays_published_tainted_and_nvml_errors_taint_every_gpu() -> None:
    missing = fh.judge(node(*FOUR[:3]), "", known(*FOUR))
    assert gpus.taints(missing, [0, 1, 2, 3], {}, T0) == {3: gpus.Taint(fh.GPU_MISSING, T0)}
    unreadable = fh.judge(node(), "NVML: driver not loaded", known(*FOUR))
    assert set(gpus.taints(unreadable, [0, 1, 2, 3], {}, T0)) == {0, 1, 2, 3}


@given(st.lists(st.sampled_from(["healthy", "degraded", "not-started"]), min_size=1, max_size=8),
       st.sets(st.integers(0, 7)))
def test_tainted_gpus_are_exactly_the_published_ones_the_verdict_names(states: list[str], before: set[int]) -> None:
    readings = [gpu(i, mask=DEGRADED_BW_MASK, summary="LimitedCapacity") if s == "degraded" else
                gpu(i, state="InProgress") if s == "not-started" else gpu(i) for i, s in enumerate(states)]
    verdict = fh.judge(node(*readings), "", known(*readings))
    indexes = list(range(len(states)))
    out = gpus.taints(verdict, indexes, {i: gpus.Taint("Old", T0) for i in before}, T1)
    assert set(out) == ({i for i in indexes if i in verdict.gpus} if not verdict.healthy else set())
    assert all(t.since == (T0 if i in before else T1) and t.reason == verdict.reason for i, t in out.items())


def test_the_slice_is_the_nodes_own_pool_with_the_taint_effect_of_the_setting() -> None:
    found = node(*FOUR)
    spec = gpus.slice_spec("gb-1", FOUR, found.clique, found.driver_version,
                           {2: gpus.Taint(fh.DEGRADED, T0)}, "NoExecute")
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (names.GPU_DRIVER, "gb-1",
                                                                {"name": "gb-1", "resourceSliceCount": 1})
    devices = {d["name"]: d for d in spec["devices"]}
    assert list(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert devices["gpu-2"]["taints"] == [{"key": names.FABRIC_UNHEALTHY_TAINT, "value": fh.DEGRADED,
                                           "effect": "NoExecute", "timeAdded": T0}]
    assert all("taints" not in devices[d] for d in ("gpu-0", "gpu-1", "gpu-3"))
    attrs = devices["gpu-1"]["attributes"]
    assert attrs["type"] == {"string": "gpu"} and attrs["uuid"] == {"string": FOUR[1].uuid}
    assert attrs["clique"] == {"string": found.clique} and attrs["index"] == {"int": 1}
    assert devices["gpu-1"]["capacity"] == {"memory": {"value": "189471Mi"}}
    body = gpus.slice_object("gb-1", "uid-1", spec, 7)
    assert body["metadata"]["name"] == names.gpu_slice_name("gb-1") == "gb-1-gpus"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "gb-1", "uid": "uid-1"}]
    assert body["spec"]["pool"]["generation"] == 7 and "generation" not in spec["pool"]


def test_a_long_node_name_still_makes_a_valid_slice_name() -> None:
    name = names.gpu_slice_name("n" * 253)
    assert len(name) <= 253 and names.is_dns_subdomain(name)
    assert name != names.gpu_slice_name("n" * 252 + "m")


def test_the_cdi_spec_gives_each_gpu_its_device_node_and_every_one_nvidiactl() -> None:
    spec = gpus.gpu_spec(FOUR)
    assert spec is not None and gpus.gpu_spec([]) is None
    parsed = Spec.model_validate(json.loads(spec.to_json()))
    assert parsed.kind == names.GPU_CDI_KIND
    by_name = {d.name: d for d in parsed.devices}
    (dev,) = by_name["gpu-2"].container_edits.device_nodes
    assert (dev.path, dev.type, dev.major, dev.minor) == ("/dev/nvidia2", "c", names.NVIDIA_GPU_MAJOR, 2)
    assert [n.path for n in parsed.container_edits.device_nodes] == ["/dev/nvidiactl"]
