"""The controller: clique pools follow the Nodes; each ComputeDomain's summary follows its
members and its channel claim; an allocated channel claim is reserved for its pending pods.
Pure rules first, then the real API server and scheduler."""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSchedulingGate, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    DeviceClaim,
    DeviceRequest,
    ExactDeviceRequest,
    ResourceClaimSpec,
)
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.claimhold import hold_consumer, release_hold_patch
from nvlfabric.api.names import RESERVATION_GATE
from nvlfabric.api.nodereports import node_report, node_report_key
from nvlfabric.controller import pools, reservationplan
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.controller.reconcile import Controller, SlotRequest, assign_port_slots, summarize
from nvlfabric.controller.reservationplan import (
    ClaimState,
    PendingPod,
    claim_state,
    hold_change,
    pending_pod,
    pioneer,
    releasable,
    reservation_patch,
    to_reserve,
)
from nvlfabric.controller.reservations import Reserver
from nvlfabric.sim.cluster import delete_nodes, eventually
from tests.conftest import Cluster
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


def channel_pod(name: str, claim: str, where: str, *, gated: bool = False) -> Pod:
    """A pod using `claim` (a domain's shared channel claim) on the test nodes labelled
    `ctl-test=<where>`, optionally held by the reservation gate as BoundJob's pods are."""
    return Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"ctl-test": where}, terminationGracePeriodSeconds=0,
        schedulingGates=[PodSchedulingGate(name=RESERVATION_GATE)] if gated else None,
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=claim)],
        containers=[Container(name="w", image="registry.invalid/w:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))]))


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


# ----------------------------------------------------------------------------------------------
# Reserving a channel claim for its pending pods ahead of the scheduler

def _pod(name: str, *, claims: tuple[str, ...] = ("cd-channel",), ns: str = "default", **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", **extra.pop("meta", {})}
    spec = {"resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)],
            **extra.pop("spec", {})}
    return {"metadata": meta, "spec": spec, "status": extra.pop("status", {"phase": "Pending"})}


@pytest.mark.parametrize(("pod", "why"), [
    pytest.param(_pod("p", spec={"nodeName": "n1"}), "bound: the scheduler has reserved it", id="bound"),
    pytest.param(_pod("p", meta={"deletionTimestamp": "2026-11-29T12:00:00Z"}), "being deleted", id="deleting"),
    pytest.param(_pod("p", status={"phase": "Succeeded"}), "finished", id="done"),
    pytest.param(_pod("p", claims=()), "uses no named claim", id="no-claim"),
    pytest.param({"metadata": {"name": "p", "uid": "u"}, "spec": {"resourceClaims": [
        {"name": "c", "resourceClaimTemplateName": "t"}]}}, "per-pod claims are not shared", id="template-claim"),
])
def test_only_unbound_live_pods_that_name_a_claim_are_reserved_ahead(pod: dict[str, Any], why: str) -> None:
    assert pending_pod(pod) is None, why


pending_pods = st.lists(st.builds(
    PendingPod, namespace=st.sampled_from(["default", "other"]), name=st.text("abc", min_size=1, max_size=3),
    uid=st.text("uvwxyz", min_size=1, max_size=3),
    claims=st.frozensets(st.sampled_from(["cd-channel", "x-channel"]), max_size=2)), max_size=60)


@given(pending_pods, st.lists(st.text("uvwxyz", min_size=1, max_size=3), max_size=20, unique=True),
       st.integers(min_value=0, max_value=30))
def test_reservation_adds_each_waiting_user_of_the_claim_once_and_never_overfills(
        pods: list[PendingPod], reserved: list[str], limit: int) -> None:
    out = to_reserve("default", "cd-channel", reserved, pods, limit=limit)
    uids = [p.uid for p in out]
    assert len(uids) == len(set(uids)), "a pod reserved twice"
    assert not set(uids) & set(reserved), "a pod reserved again"
    assert all(p.namespace == "default" and "cd-channel" in p.claims for p in out)
    assert len(reserved) + len(out) <= max(limit, len(reserved))
    eligible = {p.uid for p in pods if p.namespace == "default" and "cd-channel" in p.claims} - set(reserved)
    assert len(out) == min(len(eligible), max(0, limit - len(reserved))), "room left but a waiting pod left out"
    test, *adds = reservation_patch("claim-uid", out)
    assert test == {"op": "test", "path": "/metadata/uid", "value": "claim-uid"}
    assert all(op["op"] == "add" and op["path"] == "/status/reservedFor/-" for op in adds)
    assert [op["value"]["uid"] for op in adds] == uids


def _claim(reserved: list[dict[str, str]], *, deleting: bool = False, owner: bool = True) -> dict[str, Any]:
    """A channel claim allocated from our pools, reserved for `reserved`."""
    meta: dict[str, Any] = {"name": "cd-channel", "namespace": "default", "uid": "claim-uid",
                            "labels": {names.COMPUTE_DOMAIN_LABEL: "cd"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "cd", "uid": "cd-uid",
                                    "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T12:00:00Z"
    return {"metadata": meta, "status": {"reservedFor": reserved, "allocation": {"devices": {"results": [
        {"driver": pools.DRIVER, "pool": "pool-x", "device": "channel-1", "request": "channel"}]}}}}


POD_ENTRY = {"resource": "pods", "name": "p0", "uid": "p0-uid"}
HOLD = hold_consumer("cd", "cd-uid")


@given(reserved=st.integers(0, 256), unreserved=st.integers(0, 300), adding=st.integers(0, 300),
       held=st.booleans(), deleting=st.booleans())
def test_the_domains_hold_never_takes_a_place_a_pod_needs_and_goes_with_the_claim(
        reserved: int, unreserved: int, adding: int, held: bool, deleting: bool) -> None:
    entries = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(reserved)]
    if held and entries:
        entries[0] = HOLD
    claim = claim_state(_claim(entries, deleting=deleting), pools.DRIVER)
    adding = min(adding, unreserved)
    add, release = hold_change(claim, unreserved, adding)
    assert not (add and release)
    if claim.hold_at is not None:
        assert not add
        assert release == (deleting or reserved + unreserved > reservationplan.MAX_RESERVED)
    else:
        assert not release
        # added only to a claim in use, with every waiting pod reserved and a place left beside them
        assert add == (reserved > 0 and not deleting and adding == unreserved
                       and reserved + adding < reservationplan.MAX_RESERVED)


def test_a_claim_of_no_domain_or_of_a_pod_group_gets_no_hold() -> None:
    assert hold_change(claim_state(_claim([POD_ENTRY], owner=False), pools.DRIVER), 0, 0) == (False, False)
    group = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g", "uid": "g-uid"}
    assert hold_change(claim_state(_claim([group]), pools.DRIVER), 0, 0) == (False, False)
    assert hold_change(claim_state(_claim([POD_ENTRY]), pools.DRIVER), 0, 0) == (True, False)


def test_the_hold_is_added_last_and_released_first_with_its_place_tested() -> None:
    claim = claim_state(_claim([HOLD, POD_ENTRY]), pools.DRIVER)
    assert claim.domain == ("cd", "cd-uid") and claim.hold_at == 0
    pod = PendingPod("default", "p1", "p1-uid", frozenset({"cd-channel"}))
    assert reservation_patch("claim-uid", [pod], hold=HOLD) == [
        {"op": "test", "path": "/metadata/uid", "value": "claim-uid"},
        {"op": "add", "path": "/status/reservedFor/-", "value": {"resource": "pods", "name": "p1", "uid": "p1-uid"}},
        {"op": "add", "path": "/status/reservedFor/-", "value": HOLD}]
    assert reservation_patch("claim-uid", [pod], release=(0, "cd-uid"))[:3] == [
        {"op": "test", "path": "/metadata/uid", "value": "claim-uid"},
        {"op": "test", "path": "/status/reservedFor/0/uid", "value": "cd-uid"},
        {"op": "remove", "path": "/status/reservedFor/0"}]
    assert release_hold_patch(_claim([POD_ENTRY, HOLD])) == [
        {"op": "test", "path": "/metadata/uid", "value": "claim-uid"},
        {"op": "test", "path": "/status/reservedFor/1/uid", "value": "cd-uid"},
        {"op": "remove", "path": "/status/reservedFor/1"}]
    assert release_hold_patch(_claim([POD_ENTRY])) is None


@pytest.mark.cluster
def test_pending_pods_of_an_allocated_channel_claim_are_reserved_in_one_write(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    """The first pod allocates the claim; every later pod is in reservedFor before the scheduler
    binds it, including pods that cannot be placed yet; when such a pod goes, kube-controller-
    manager drops its entry as it does the scheduler's own."""
    client, (_, names) = cluster.client, clique_nodes
    Controller(client, channels_per_clique=4).reconcile_pools()
    run = names[0].split("-")[1]
    claim = provider_domain(client, f"rsv-{run}")

    def pod(name: str, where: str) -> Pod:
        return channel_pod(name, claim, where)

    def reserved() -> list[str]:  # the pods (the domain's hold aside)
        st = client.get(ResourceClaim, claim, namespace="default").status
        return [r.name for r in (st.reservedFor or []) if r.resource == "pods"] if st else []

    reserver = Reserver(client, pools.DRIVER, coalesce_s=0.05)
    stop = threading.Event()
    worker = threading.Thread(target=reserver.run, args=(stop.is_set,), daemon=True)
    worker.start()
    placeable = [f"rsv-{run}-{i}" for i in range(12)]
    stranded = [f"rsv-{run}-nowhere-{i}" for i in range(4)]
    try:
        client.create(pod(placeable[0], run))
        eventually("the first pod to allocate the claim", lambda: reserved() == [placeable[0]] or None)
        for name in stranded:
            client.create(pod(name, "nowhere"))
        for name in placeable[1:]:
            client.create(pod(name, run))
        entries = eventually("every pod of the claim to be reserved",
                             lambda: r if set(r := reserved()) == {*placeable, *stranded} else None)
        assert len(entries) == len(set(entries)) == 16, f"a pod reserved twice: {entries}"
        eventually("the placeable pods to be bound", lambda: all(
            client.get(Pod, n, namespace="default").spec.nodeName for n in placeable) or None)
        assert not any(client.get(Pod, n, namespace="default").spec.nodeName for n in stranded)
        assert reserver.writer.reserved >= len(stranded), "the stranded pods were reserved by someone else"
        assert reserver.writer.patches < reserver.writer.reserved, "one write per pod: nothing was batched"

        for name in stranded:
            client.delete(Pod, name, namespace="default", grace_period=0)
        eventually("kube-controller-manager to drop the deleted pods' entries",
                   lambda: set(reserved()) == set(placeable) or None)
    finally:
        stop.set()
        remove_domain(client, f"rsv-{run}", claim, [*placeable, *stranded])
        worker.join(timeout=5)


@pytest.mark.cluster
def test_a_claim_whose_pods_all_went_keeps_its_channel_for_its_domain_until_it_is_deleted(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    """What a JobSet restart needs: with every pod of the domain gone, its claim stays allocated
    (reserved for the domain itself), so the next pod gets the same channel in the same clique;
    deleting the claim releases the hold and the claim goes."""
    client, (_, names_) = cluster.client, clique_nodes
    Controller(client, channels_per_clique=4).reconcile_pools()
    run = names_[0].split("-")[1]
    domain = f"hold-{run}"
    claim = provider_domain(client, domain)
    uid = client.get(ComputeDomainResource, domain, namespace="default").metadata.uid

    def consumers() -> list[tuple[str, str]]:
        st = client.get(ResourceClaim, claim, namespace="default").status
        return [(r.resource, r.name) for r in (st.reservedFor or [])] if st else []

    def allocation() -> Any:
        st = client.get(ResourceClaim, claim, namespace="default").status
        return st.allocation.to_dict() if st and st.allocation else None

    reserver = Reserver(client, pools.DRIVER, coalesce_s=0.05)
    stop = threading.Event()
    worker = threading.Thread(target=reserver.run, args=(stop.is_set,), daemon=True)
    worker.start()
    pods = [f"{domain}-a", f"{domain}-b"]
    try:
        client.create(channel_pod(pods[0], claim, run))
        eventually("the claim to be held for its domain beside its pod", lambda: set(consumers()) == {
            ("pods", pods[0]), ("computedomains", domain)} or None)
        hold = next(r for r in client.get(ResourceClaim, claim, namespace="default").status.reservedFor
                if r.resource == "computedomains")
        assert (hold.apiGroup, hold.uid) == ("nvlfabric.io", uid)
        first = allocation()
        client.delete(Pod, pods[0], namespace="default", grace_period=0)
        eventually("the pod's entry to go", lambda: consumers() == [("computedomains", domain)] or None)
        time.sleep(2)  # kube-controller-manager deallocates at once what nothing reserves: not this one
        assert allocation() == first
        client.create(channel_pod(pods[1], claim, run))
        eventually("the next pod to be bound", lambda: client.get(Pod, pods[1], namespace="default").spec.nodeName)
        assert allocation() == first, "the next pod got another channel"

        client.delete(Pod, pods[1], namespace="default", grace_period=0)
        client.delete(ResourceClaim, claim, namespace="default")
        eventually("the claim to go once the controller released the hold", lambda: not list(client.list(
            ResourceClaim, namespace="default", fields={"metadata.name": claim})), timeout=30)
    finally:
        stop.set()
        remove_domain(client, domain, claim, pods)
        worker.join(timeout=5)


@pytest.mark.cluster
def test_gated_pods_wait_for_their_reservation_and_none_fails_scheduling(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    """BoundJob's pods carry the reservation gate: the controller lifts one (the pioneer, whose
    scheduling allocates the claim), reserves the claim for the others in one write and lifts
    their gates; the scheduler never races on the claim. A pod whose claim does not exist stays
    gated."""
    client, (_, names) = cluster.client, clique_nodes
    Controller(client, channels_per_clique=4).reconcile_pools()
    run = names[0].split("-")[1]
    claim = provider_domain(client, f"gate-{run}")

    def pod(name: str, claim_name: str) -> Pod:
        return channel_pod(name, claim_name, run, gated=True)

    reserver = Reserver(client, pools.DRIVER)
    stop = threading.Event()
    worker = threading.Thread(target=reserver.run, args=(stop.is_set,), daemon=True)
    members = [f"gate-{run}-{i}" for i in range(16)]
    orphan = f"gate-{run}-orphan"
    try:
        # Half the pods exist before the controller starts (found by its first listing), half after.
        for name in members[:8]:
            client.create(pod(name, claim))
        worker.start()
        for name in members[8:]:
            client.create(pod(name, claim))
        client.create(pod(orphan, f"gate-{run}-missing"))
        eventually("every member to be bound", lambda: all(
            (p := client.get(Pod, n, namespace="default")).spec and p.spec.nodeName for n in members) or None)
        st = client.get(ResourceClaim, claim, namespace="default").status
        assert st and sorted(r.name for r in st.reservedFor or [] if r.resource == "pods") == sorted(members)
        assert [r.name for r in st.reservedFor or [] if r.resource != "pods"] == [f"gate-{run}"]  # its domain's hold
        assert reserver.writer.ungated == len(members)
        assert reserver.writer.reserved == len(members) - 1, "the pioneer reserves itself; the controller the rest"
        assert reserver.writer.patches <= 3, f"{reserver.writer.patches} writes for {len(members) - 1} reservations"
        failed = [e.involvedObject.name for e in client.list(Event, namespace="default",
                                                             fields={"reason": "FailedScheduling"})
                  if e.involvedObject.name in members]
        assert not failed, f"pods failed scheduling: {failed}"
        gates = client.get(Pod, orphan, namespace="default").spec.schedulingGates
        assert [g.name for g in gates or []] == [RESERVATION_GATE], "a pod without its claim was let go"
    finally:
        stop.set()
        remove_domain(client, f"gate-{run}", claim, [*members, orphan])
        if worker.is_alive():
            worker.join(timeout=5)


@pytest.mark.cluster
def test_a_gate_lifts_only_once_the_claim_watch_shows_the_reservation(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    """The scheduler reads claims from its own informer: a pod let through on the answer to our
    reservation write alone could be scheduled against a copy of the claim without itself, and its
    PreBind would fail ("add reservation to claim"). So the gate lifts once the claim watch, which
    this test plays by hand against the real API server (the informers' `put`: what their watch
    would tell), has shown the write; and after WATCH_SEEN_S without it, at the next resync."""
    client, (_, names) = cluster.client, clique_nodes
    Controller(client, channels_per_clique=4).reconcile_pools()
    run = names[0].split("-")[1]
    claim = provider_domain(client, f"seen-{run}")
    first, gated = f"seen-{run}-0", [f"seen-{run}-{i}" for i in range(1, 4)]
    reserver = Reserver(client, pools.DRIVER)

    def watch_shows_claim() -> None:
        reserver.cache.claims.put(client.get(ResourceClaim, claim, namespace="default"))

    def gates(name: str) -> list[str]:
        return [g.name for g in client.get(Pod, name, namespace="default").spec.schedulingGates or []]

    try:
        client.create(channel_pod(first, claim, run))  # ungated: the scheduler allocates the claim
        eventually("the first pod to allocate the claim", lambda: (
            (st := client.get(ResourceClaim, claim, namespace="default").status) and st.reservedFor) or None)
        for name in gated:
            reserver.cache.unbound_pods.put(client.create(channel_pod(name, claim, run, gated=True)))
        watch_shows_claim()
        reserver.pass_once()
        st = client.get(ResourceClaim, claim, namespace="default").status
        assert st and {r.name for r in st.reservedFor or [] if r.resource == "pods"} == {first, *gated}, \
            "not reserved in the pass"
        assert all(gates(n) == [RESERVATION_GATE] for n in gated), "a gate lifted before the watch showed the claim"

        watch_shows_claim()
        reserver.pass_once()
        assert all(gates(n) == [] for n in gated), "the watch showed the reservation, the gates stayed"

        # A watch that never shows the write (lost, re-listing) delays the gate by WATCH_SEEN_S only.
        late = f"seen-{run}-late"
        pod = client.create(channel_pod(late, claim, run, gated=True))
        reserver.cache.unbound_pods.put(pod)
        reserver.pass_once()
        assert gates(late) == [RESERVATION_GATE]
        assert pod.metadata and pod.metadata.uid
        reserver.watch_seen_s = 0.0  # as if WATCH_SEEN_S had passed since the write
        reserver.resync()
        reserver.pass_once()
        assert gates(late) == [], "an unseen reservation held the gate past WATCH_SEEN_S"
    finally:
        remove_domain(client, f"seen-{run}", claim, [first, *gated, f"seen-{run}-late"])


def _pp(name: str, *, gated: bool = True, created: str = "t1", claims: tuple[str, ...] = ("a",)) -> PendingPod:
    return PendingPod("default", name, f"uid-{name}", frozenset(claims), gated, created)


def test_the_pioneer_is_the_oldest_gated_pod_and_only_while_no_pod_is_ungated() -> None:
    assert pioneer([_pp("b", created="t2"), _pp("c", created="t1"), _pp("a", created="t3")]).name == "c"
    assert pioneer([_pp("b"), _pp("a")]).name == "a", "equal ages: by name"
    assert pioneer([_pp("b", created="t0"), _pp("x", gated=False)]) is None, "an ungated pod will allocate the claim"
    assert pioneer([]) is None


ALLOCATED = ClaimState("c-uid", ("uid-p",), allocated=True, ours=True)


@pytest.mark.parametrize(("claims", "pioneer_of", "release"), [
    pytest.param({"a": ALLOCATED}, frozenset(), True, id="reserved-on-its-channel-claim"),
    pytest.param({"a": ClaimState("c-uid", ("uid-x",), True, True)}, frozenset(), False, id="not-reserved-yet"),
    pytest.param({}, frozenset(), False, id="claim-missing"),
    pytest.param({"a": ClaimState("c-uid")}, frozenset(), False, id="unallocated-not-pioneer"),
    pytest.param({"a": ClaimState("c-uid")}, frozenset({"a"}), True, id="unallocated-pioneer"),
    pytest.param({"a": ClaimState("c-uid", (), True, False)}, frozenset(), True, id="another-drivers-claim"),
])
def test_a_gate_lifts_once_the_pod_is_reserved_on_each_channel_claim(
        claims: dict[str, ClaimState], pioneer_of: frozenset[str], release: bool) -> None:
    assert releasable(_pp("p"), claims, pioneer_of) is release


def test_a_pod_of_two_claims_waits_for_both() -> None:
    pod = _pp("p", claims=("a", "b"))
    assert not releasable(pod, {"a": ALLOCATED, "b": ClaimState("b-uid", (), True, True)})
    assert releasable(pod, {"a": ALLOCATED, "b": ClaimState("b-uid", ("uid-p",), True, True)})


def test_a_pending_pod_knows_whether_it_waits_for_the_reservation_gate() -> None:
    gated = pending_pod(_pod("p", spec={"schedulingGates": [{"name": "x/other"}, {"name": RESERVATION_GATE}]},
                             meta={"creationTimestamp": "2026-11-29T12:00:00Z"}))
    assert gated is not None and gated.gated and gated.created == "2026-11-29T12:00:00Z"
    other = pending_pod(_pod("p", spec={"schedulingGates": [{"name": "x/other"}]}))
    assert other is not None and not other.gated
