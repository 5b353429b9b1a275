"""The simulated kubelet's device-health cache and the pods' allocatedResourcesStatus it writes
(nvlfabric/sim/kubelet/health.py), against the real kubelet's rules (1.37 pkg/kubelet/cm/dra:
healthinfo.go, UpdateAllocatedResourcesStatus). The stream itself, from the real agent, runs in
tests/e2e/test_fabric_health.py."""

from __future__ import annotations

from lightkube.resources.core_v1 import Pod

from nvlfabric.api.kubelet.types import PreparedDevice
from nvlfabric.sim.kubelet.devicehealth import (
    HEALTHY,
    UNHEALTHY,
    UNKNOWN,
    HealthCache,
    Reported,
    allocated_resources_status,
)

DRIVER = "channel.nvlfabric.io"
POOL = "clique-x.1"
CDI = "k8s.channel.nvlfabric.io/claim=uid-1-channel-3"


def pod(claims: list[dict[str, str]]) -> Pod:
    return Pod.from_dict({
        "metadata": {"name": "p", "namespace": "default", "uid": "pod-1"},
        "spec": {"resourceClaims": [{"name": "channel", "resourceClaimName": "cd-channel"},
                                    {"name": "tmpl", "resourceClaimTemplateName": "t"}],
                 "containers": [{"name": "worker", "image": "x", "resources": {"claims": claims}},
                                {"name": "sidecar", "image": "x"}]},
        "status": {"resourceClaimStatuses": [{"name": "tmpl", "resourceClaimName": "p-tmpl-abcde"}]}})


PREPARED = {"cd-channel": {DRIVER: [PreparedDevice(request_names=("channel",), pool_name=POOL,
                                                   device_name="channel-3", cdi_device_ids=(CDI,))]},
            "p-tmpl-abcde": {DRIVER: [PreparedDevice(request_names=("gpu",), pool_name="node-pool",
                                                     device_name="gpu-0", cdi_device_ids=())]}}


def test_never_reported_stale_and_ended_streams_read_unknown() -> None:
    cache = HealthCache()
    assert cache.get(DRIVER, POOL, "channel-3", 0.0) == (UNKNOWN, "")
    changed = cache.update(DRIVER, [Reported(POOL, "channel-3", UNHEALTHY, "GPU 0: degraded", 30)], 100.0)
    assert changed == {(DRIVER, POOL, "channel-3")}
    assert cache.get(DRIVER, POOL, "channel-3", 110.0) == (UNHEALTHY, "GPU 0: degraded")
    assert cache.update(DRIVER, [Reported(POOL, "channel-3", UNHEALTHY, "GPU 0: degraded", 30)], 120.0) == set()
    assert cache.get(DRIVER, POOL, "channel-3", 151.0) == (UNKNOWN, "")  # older than its 30 s timeout
    cache.update(DRIVER, [Reported(POOL, "channel-3", HEALTHY, "", 0)], 200.0)
    assert cache.get(DRIVER, POOL, "channel-3", 229.0) == (HEALTHY, "")  # timeout 0: the default 30 s
    # A report without the device leaves it until it is stale, then reports its change to Unknown.
    assert cache.update(DRIVER, [], 210.0) == set()
    assert cache.update(DRIVER, [], 231.0) == {(DRIVER, POOL, "channel-3")}
    cache.update(DRIVER, [Reported(POOL, "channel-3", HEALTHY)], 300.0)
    assert cache.clear(DRIVER) == {(DRIVER, POOL, "channel-3")}
    assert cache.get(DRIVER, POOL, "channel-3", 300.0) == (UNKNOWN, "")


def test_each_container_claim_lists_its_devices_by_their_first_cdi_id() -> None:
    cache = HealthCache()
    cache.update(DRIVER, [Reported(POOL, "channel-3", UNHEALTHY, "GPU 0 (GPU-1): NVLink fabric health "
                                   "LimitedCapacity")], 0.0)
    out = allocated_resources_status(pod([{"name": "channel"}, {"name": "tmpl", "request": "gpu"}]), PREPARED, cache,
                                     1.0)
    assert out == {"worker": [
        {"name": "claim:channel", "resources": [{"resourceID": CDI, "health": UNHEALTHY,
                                                 "message": "GPU 0 (GPU-1): NVLink fabric health LimitedCapacity"}]},
        # No CDI id: <driver>/<pool>/<device>; never reported: Unknown, no message.
        {"name": "claim:tmpl/gpu", "resources": [{"resourceID": f"{DRIVER}/node-pool/gpu-0", "health": UNKNOWN}]}]}


def test_a_request_without_prepared_devices_and_unprepared_claims_are_left_out() -> None:
    cache = HealthCache()
    assert allocated_resources_status(pod([{"name": "tmpl", "request": "other"}]), PREPARED, cache, 0.0) == {}
    assert allocated_resources_status(pod([{"name": "channel"}]), {}, cache, 0.0) == {}
