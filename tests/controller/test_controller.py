"""The reconciler (nvlfabric/controller/reconcile.py): clique pools follow the Nodes; each
ComputeDomain's summary follows its members and its channel claim. Pure rules first, then the
real API server and scheduler. Reservations: test_reservationplan.py (their rules) and
test_reservations.py (the passes)."""

from __future__ import annotations

import contextlib
import datetime
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    DeviceClaim,
    DeviceRequest,
    ExactDeviceRequest,
    ResourceClaimSpec,
)
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.nodereports import node_report, node_report_key
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.controller.reconcile import Controller, SlotRequest, assign_port_slots, summarize
from nvlfabric.sim.cluster import delete_nodes, eventually
from tests.conftest import Cluster
from tests.controller.pods import channel_pod
from tests.support.domains import provider_domain, remove_domain

T0 = datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.UTC)


def status(*nodes: tuple[str, bool], phase: api.Phase | None = None) -> api.ComputeDomainStatus:
    return api.ComputeDomainStatus(phase=phase, nodes=[
        api.NodeStatus(name=n, ready=r, message=None if r else "IMEX daemon not ready") for n, r in nodes])


@pytest.mark.parametrize(("spec", "st", "alloc", "phase", "message"), [
    pytest.param(api.ComputeDomainSpec(), status(), None, "Pending", "waiting for a member pod", id="no-channel"),
    pytest.param(api.ComputeDomainSpec(), status(("n1", False)), ("c.1", 5), "Allocating",
                 "0 of 1 nodes ready; node n1: IMEX daemon not ready", id="joining"),
    pytest.param(api.ComputeDomainSpec(), status(("n1", True), ("n2", True)), ("c.1", 5), "Ready",
                 "2 of 2 nodes ready", id="all-ready-no-count"),
    pytest.param(api.ComputeDomainSpec(numNodes=3), status(("n1", True), ("n2", True)), ("c.1", 5), "Allocating",
                 "2 of 2 nodes ready (numNodes 3)", id="fewer-than-numNodes"),
    pytest.param(api.ComputeDomainSpec(), status(("n1", True), ("n2", False), phase=api.Phase.READY), ("c.1", 5),
                 "Degraded", "1 of 2 nodes ready; node n2: IMEX daemon not ready", id="was-ready"),
    # every member gone, the channel held (a JobSet restarting, or a job done): said so
    pytest.param(api.ComputeDomainSpec(), status(phase=api.Phase.READY), ("c.1", 5), "Degraded",
                 "no member pod runs; the domain keeps its clique and channel", id="members-gone-channel-held"),
])
def test_phase_rules(spec: api.ComputeDomainSpec, st: api.ComputeDomainStatus, alloc: tuple[str, int] | None,
                     phase: str, message: str) -> None:
    out = summarize(spec, st, 4, alloc, now=T0)
    assert out["phase"] == phase
    assert message in out["conditions"][0]["message"]
    assert out["observedGeneration"] == 4 and out["totalNodes"] == len(st.nodes)
    assert out["conditions"][0]["status"] == ("True" if phase == "Ready" else "False")
    if alloc:
        assert (out["clique"], out["channel"]) == alloc


def test_an_unchanged_condition_keeps_its_transition_time() -> None:
    first = summarize(api.ComputeDomainSpec(), status(("n1", True)), 1, ("c.1", 2), now=T0)
    prev = api.ComputeDomainStatus.model_validate({"phase": "Ready", "nodes": [{"name": "n1", "ready": True}],
                                                   "conditions": first["conditions"]})
    later = summarize(api.ComputeDomainSpec(), prev, 1, ("c.1", 2), now=T0 + datetime.timedelta(hours=1))
    assert later["conditions"][0]["lastTransitionTime"] == first["conditions"][0]["lastTransitionTime"]


@pytest.mark.cluster
def test_pools_follow_nodes_and_a_domain_goes_pending_allocating_ready_degraded(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    client, (clique, names) = cluster.client, clique_nodes
    ctl = Controller(client, channels_per_clique=4)
    assert clique in ctl.reconcile_pools()
    assert [s.metadata.name for s in pools.existing_slices(client, clique)] == [pools.slice_name(clique, 0)]

    run = names[0].split("-")[1]
    cd = f"cd-{run}"
    client.create(ComputeDomainResource(metadata=ObjectMeta(name=cd, namespace="default"), spec={}))
    client.create(ResourceClaim(metadata=ObjectMeta(name=f"{cd}-channel", namespace="default"),
                                spec=ResourceClaimSpec(devices=DeviceClaim(requests=[DeviceRequest(
                                    name="channel", exactly=ExactDeviceRequest(
                                        deviceClassName="imex-channel.nvlfabric.io"))]))))
    try:
        def phase() -> str | None:
            ctl.reconcile_domains()
            return client.get(ComputeDomainResource, cd, namespace="default").status.get("phase")

        assert phase() == "Pending"
        client.create(channel_pod(f"{cd}-0", f"{cd}-channel", run))
        eventually("the channel to be allocated", lambda: phase() == "Allocating")

        def report(node: str, ready: bool) -> None:  # what each node's agent writes, on its own Node
            agent_report(client, node, cd, api.NodeStatus(
                name=node, ready=ready, clique=clique, message=None if ready else "IMEX daemon not ready"))

        report(names[0], True)
        report(names[1], True)
        assert phase() == "Ready"
        st = client.get(ComputeDomainResource, cd, namespace="default").status
        assert st["clique"] == clique and 1 <= st["channel"] <= 4 and st["readyNodes"] == 2
        assert [n["name"] for n in st["nodes"]] == names  # the agents' reports, copied by the controller
        report(names[1], False)
        assert phase() == "Degraded"
        cond = client.get(ComputeDomainResource, cd, namespace="default").status["conditions"][0]
        assert cond["message"] == f"1 of 2 nodes ready; node {names[1]}: IMEX daemon not ready"
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Pod, f"{cd}-0", namespace="default", grace_period=0)
        with contextlib.suppress(ApiError):
            client.delete(ResourceClaim, f"{cd}-channel", namespace="default")
        with contextlib.suppress(ApiError):
            client.delete(ComputeDomainResource, cd, namespace="default")

    delete_nodes(client, names)
    eventually("the clique's pool to be withdrawn once its nodes are gone",
               lambda: (clique not in ctl.reconcile_pools() and not pools.existing_slices(client, clique)) or None)
    assert not list(client.list(ResourceSlice, labels={pools.POOL_LABEL: pools.pool_name(clique)}))


def agent_report(client: Client, node: str, domain: str, entry: api.NodeStatus) -> None:
    """What a node's agent writes for a domain: an annotation of its own Node."""
    client.patch(Node, node, {"metadata": {"annotations": node_report("default", domain, entry)}})


@pytest.mark.cluster
def test_a_running_controller_summarizes_a_domain_as_soon_as_its_members_report(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    """The loop's interval here is 300 s: only the watch of the agents' Nodes can make the summary
    follow their reports within the wait below."""
    client, (clique, names) = cluster.client, clique_nodes
    ctl = Controller(client, channels_per_clique=4)
    run = names[0].split("-")[1]
    claim = provider_domain(client, f"live-{run}")
    stop = threading.Event()
    ctl.cache.start(stop.is_set)
    loop = threading.Thread(target=ctl.run, kwargs={"interval_s": 300.0, "stop": stop.is_set}, daemon=True)
    loop.start()
    pod = f"live-{run}-0"
    try:
        client.create(channel_pod(pod, claim, run))
        eventually("the pod to be bound", lambda: client.get(Pod, pod, namespace="default").spec.nodeName)
        for node in names:  # what each member's agent writes
            agent_report(client, node, f"live-{run}", api.NodeStatus(name=node, ready=True, clique=clique))
        status = eventually("the summary to follow the members", lambda: (
            s if (s := client.get(ComputeDomainResource, f"live-{run}", namespace="default").status or {}
                  ).get("phase") == "Ready" else None), timeout=20)
        assert status["clique"] == clique and status["readyNodes"] == 2
    finally:
        stop.set()
        remove_domain(client, f"live-{run}", claim, [pod])


@pytest.mark.cluster
def test_an_entry_an_older_agent_applied_itself_is_dropped_and_the_status_then_stays_put(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    """Agents before session 6 applied their own status.nodes entry under their own field
    manager; the controller's apply cannot remove such an item, so a node that left stayed a
    member and the status was rewritten every pass."""
    client, (clique, names) = cluster.client, clique_nodes
    ctl = Controller(client, channels_per_clique=4)
    run = names[0].split("-")[1]
    cd = f"old-{run}"
    claim = provider_domain(client, cd)
    try:
        old = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": cd, "namespace": "default"},
               "status": {"nodes": [{"name": "gone-node", "ready": True, "clique": clique}]}}
        client.patch(ComputeDomainResource.Status, cd, old, namespace="default", patch_type=PatchType.APPLY,
                     field_manager="nvlfabric-agent-gone-node", force=True)
        agent_report(client, names[0], cd, api.NodeStatus(name=names[0], ready=True, clique=clique))
        ctl.reconcile_domains()
        obj = client.get(ComputeDomainResource, cd, namespace="default")
        assert [n["name"] for n in obj.status["nodes"]] == [names[0]]
        version = obj.metadata.resourceVersion
        ctl.reconcile_domains()
        assert client.get(ComputeDomainResource, cd, namespace="default").metadata.resourceVersion == version
    finally:
        client.patch(Node, names[0], {"metadata": {"annotations": {node_report_key("default", cd): None}}})
        remove_domain(client, cd, claim, [])


@pytest.mark.cluster
def test_uninstalling_the_driver_withdraws_the_pools(cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    client, (clique, _) = cluster.client, clique_nodes
    ctl = Controller(client, channels_per_clique=4)
    ctl.reconcile_pools()
    (published,) = pools.existing_slices(client, clique)
    owner = published.metadata.ownerReferences[0]
    assert (owner.kind, owner.name) == ("DeviceClass", "imex-channel.nvlfabric.io")
    client.delete(DeviceClass, "imex-channel.nvlfabric.io")  # what removing the driver install does
    eventually("the garbage collector to remove the pools with their DeviceClass",
               lambda: not pools.existing_slices(client, clique), timeout=60)
    ctl.reconcile_pools()  # without the DeviceClass nothing is published again
    assert not pools.existing_slices(client, clique)


# ----------------------------------------------------------------------------------------------
# IMEX port slots of dedicated domains

slot_requests = st.lists(st.builds(
    SlotRequest, key=st.text("abcdef", min_size=1, max_size=4), clique=st.sampled_from([None, "c.1", "c.2"]),
    slot=st.one_of(st.none(), st.integers(min_value=-1, max_value=101)), created=st.sampled_from(["t1", "t2", "t3"])),
    max_size=40, unique_by=lambda r: r.key)


@given(slot_requests)
def test_port_slots_are_unique_per_clique_and_held_slots_stay(requests: list[SlotRequest]) -> None:
    out = assign_port_slots(requests)
    assert set(out) == {r.key for r in requests}
    for clique in ("c.1", "c.2"):
        mine = [r for r in requests if r.clique == clique]
        given_slots = [out[r.key] for r in mine if out[r.key] is not None]
        assert len(given_slots) == len(set(given_slots)), "two dedicated domains of one clique share a slot"
        assert all(1 <= s <= names.MAX_IMEX_PORT_SLOT for s in given_slots)
        # every domain gets a slot while slots last
        assert len(given_slots) == min(len(mine), names.MAX_IMEX_PORT_SLOT)
        # a valid slot held by exactly one domain of the clique is kept
        held = [r.slot for r in mine if r.slot is not None and 1 <= r.slot <= names.MAX_IMEX_PORT_SLOT]
        for r in mine:
            if r.slot is not None and held.count(r.slot) == 1 and 1 <= r.slot <= names.MAX_IMEX_PORT_SLOT:
                assert out[r.key] == r.slot
    assert all(out[r.key] is None for r in requests if r.clique is None)


def test_a_new_dedicated_domain_gets_the_lowest_free_slot_and_a_contested_slot_goes_to_the_older() -> None:
    out = assign_port_slots([SlotRequest("ns/a", "c.1", 1, "t1"), SlotRequest("ns/b", "c.1", None, "t2"),
                             SlotRequest("ns/c", "c.1", 3, "t3"), SlotRequest("ns/d", "c.1", 3, "t2"),
                             SlotRequest("ns/e", "c.2", None, "t1")])
    assert out == {"ns/a": 1, "ns/d": 3, "ns/b": 2, "ns/c": 4, "ns/e": 1}


def test_a_dedicated_domain_without_a_free_slot_fails_naming_the_way_out() -> None:
    spec = api.ComputeDomainSpec(imexMode=api.IMEXMode.DEDICATED)
    out = summarize(spec, api.ComputeDomainStatus(), 1, ("c.1", 5), port_slot=None, now=T0)
    assert out["phase"] == "Failed" and "imexPortSlot" not in out
    assert "CliqueScoped" in out["conditions"][0]["message"]
    ok = summarize(spec, api.ComputeDomainStatus(), 1, ("c.1", 5), port_slot=7, now=T0)
    assert ok["imexPortSlot"] == 7 and ok["phase"] == "Allocating"
