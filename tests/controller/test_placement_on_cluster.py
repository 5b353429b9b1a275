"""Placement by fit on the real scheduler: whole-rack domains started together get a rack each,
a domain with no room anywhere waits gated with an Event saying why, and takes room once it frees."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSchedulingGate, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim

from nvlfabric.api import computedomain as api
from nvlfabric.api.names import CLIQUE_LABEL, GROUP_SIZE_ANNOTATION, RESERVATION_GATE
from nvlfabric.controller import feasibility, pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.controller.reconcile import Controller
from nvlfabric.controller.reservations import Reserver
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes
from tests.conftest import Cluster
from tests.support.domains import provider_domain, remove_domain

pytestmark = pytest.mark.cluster
NODES_PER_CLIQUE, GPUS = 2, 4


@pytest.fixture
def racks(cluster: Cluster) -> Iterator[tuple[str, dict[str, str]]]:
    """Three cliques of two 4-GPU nodes each, labelled for this test only: (run, node → clique)."""
    run = uuid.uuid4().hex[:5]
    cliques = [f"{uuid.uuid4()}.{i}" for i in range(3)]
    where = {f"plc-{run}-{c}{n}": cliques[c] for c in range(3) for n in range(NODES_PER_CLIQUE)}
    client = cluster.client
    install_crd(client)
    make_ready_nodes(client, {n: {CLIQUE_LABEL: c, "ctl-test": run} for n, c in where.items()})
    for n in where:
        client.patch(Node.Status, n, {"status": {"capacity": {"nvidia.com/gpu": str(GPUS)},
                                                 "allocatable": {"nvidia.com/gpu": str(GPUS)}}})
    with contextlib.suppress(ApiError):
        client.create(DeviceClass(metadata=ObjectMeta(name="imex-channel.nvlfabric.io"), spec=DeviceClassSpec(
            selectors=[DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{pools.DRIVER}"'))])))
    Controller(client, channels_per_clique=4).reconcile_pools()
    yield run, where
    delete_nodes(client, list(where))
    for c in cliques:
        pools.withdraw(client, c)


def whole_rack_pod(name: str, claim: str, run: str) -> Pod:
    """A pod of a whole-rack group, as BoundJob makes it: gated, its group size annotated, 4 GPUs."""
    return Pod(metadata=ObjectMeta(name=name, namespace="default",
                                   annotations={GROUP_SIZE_ANNOTATION: str(NODES_PER_CLIQUE)}), spec=PodSpec(
        nodeSelector={"ctl-test": run}, terminationGracePeriodSeconds=0,
        schedulingGates=[PodSchedulingGate(name=RESERVATION_GATE)],
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=claim)],
        containers=[Container(name="w", image="registry.invalid/w:1", resources=ResourceRequirements(
            claims=[ContainerClaim(name="channel")], limits={"nvidia.com/gpu": str(GPUS)}))]))


def test_whole_rack_domains_get_a_rack_each_and_one_without_room_waits_saying_why(
        cluster: Cluster, racks: tuple[str, dict[str, str]]) -> None:
    client: Client = cluster.client
    run, where = racks
    domains = [f"plc-{run}-d{i}" for i in range(4)]
    pods = {d: [f"{d}-{i}" for i in range(NODES_PER_CLIQUE)] for d in domains}
    claims = {d: provider_domain(client, d) for d in domains}
    reserver = Reserver(client, pools.DRIVER, channels_per_clique=4)
    stop = threading.Event()
    worker = threading.Thread(target=reserver.run, args=(stop.is_set,), daemon=True)
    worker.start()

    def node_of(pod: str) -> str | None:
        return client.get(Pod, pod, namespace="default").spec.nodeName

    def bound(d: str) -> bool:
        return all(node_of(p) for p in pods[d])

    try:
        # Three whole-rack domains at once, their pods interleaved as three Jobs would create them.
        for i in range(NODES_PER_CLIQUE):
            for d in domains[:3]:
                client.create(whole_rack_pod(pods[d][i], claims[d], run))
        eventually("the three domains' pods to be bound", lambda: all(bound(d) for d in domains[:3]), timeout=60)
        used = []
        for d in domains[:3]:
            cliques = {where[n] for p in pods[d] if (n := node_of(p))}
            assert len(cliques) == 1, f"{d} split across cliques: {cliques}"
            used.append(cliques.pop())
        assert len(set(used)) == 3, f"two domains share a rack: {used}"

        # A fourth: no room anywhere. Its pods stay gated (none holds a GPU) and say why.
        for p in pods[domains[3]]:
            client.create(whole_rack_pod(p, claims[domains[3]], run))
        event = eventually("an Event saying no clique has room", lambda: next((
            e for e in client.list(Event, namespace="default", fields={"involvedObject.name": claims[domains[3]]})
            if e.reason == "NoCliqueRoom"), None), timeout=30)
        assert f"no NVLink clique has room for {NODES_PER_CLIQUE} pods x {GPUS} GPUs" in (event.message or "")
        assert list(client.list(Event, namespace="default", fields={"involvedObject.name": pods[domains[3]][0],
                                                                   "reason": "NoCliqueRoom"}))
        for p in pods[domains[3]]:
            spec = client.get(Pod, p, namespace="default").spec
            assert [g.name for g in spec.schedulingGates or []] == [RESERVATION_GATE] and not spec.nodeName

        # The first domain ends: its rack is free again, and the waiting domain takes it whole.
        for p in pods[domains[0]]:
            client.delete(Pod, p, namespace="default", grace_period=0)
        eventually("the waiting domain to be bound", lambda: bound(domains[3]), timeout=60)
        nodes = {node_of(p) for p in pods[domains[3]]}
        assert {where[n] for n in nodes if n} == {used[0]}
        failed = [e.involvedObject.name for e in client.list(Event, namespace="default",
                                                             fields={"reason": "FailedScheduling"})
                  if e.involvedObject.name in {p for d in domains for p in pods[d]}]
        assert not failed, f"pods failed scheduling: {failed}"
    finally:
        stop.set()
        for d in domains:
            remove_domain(client, d, claims[d], pods[d])
        worker.join(timeout=5)


def multi_domain(client: Client, name: str, cliques: int) -> list[str]:
    """A MultiClique ComputeDomain and its claims as the provider makes them; the claims' names."""
    spec = api.ComputeDomainSpec.model_validate({"placement": {"scope": "MultiClique", "cliques": cliques}})
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"),
                                             spec=spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    for g in range(cliques):
        client.create(ResourceClaim.from_dict(channel_claim(name, "default", cd.metadata.uid, spec, g)))
    return api.channel_claim_names(name, spec)


def test_a_multi_clique_domain_gets_a_clique_per_group_all_at_once_or_none(
        cluster: Cluster, racks: tuple[str, dict[str, str]]) -> None:
    client: Client = cluster.client
    run, where = racks
    first, second = f"plc-{run}-m0", f"plc-{run}-m1"
    claims = {first: multi_domain(client, first, 2), second: multi_domain(client, second, 2)}
    pods = {d: [f"{d}-g{g}-{i}" for g in range(2) for i in range(NODES_PER_CLIQUE)] for d in claims}
    reserver = Reserver(client, pools.DRIVER, channels_per_clique=4)
    stop = threading.Event()
    worker = threading.Thread(target=reserver.run, args=(stop.is_set,), daemon=True)
    worker.start()

    def node_of(pod: str) -> str | None:
        return client.get(Pod, pod, namespace="default").spec.nodeName

    try:
        for p in pods[first]:
            client.create(whole_rack_pod(p, claims[first][int(p.split("-g")[1][0])], run))
        eventually("the first domain's pods to be bound", lambda: all(node_of(p) for p in pods[first]), timeout=60)
        by_group = [{where[n] for p in pods[first] if f"-g{g}-" in p and (n := node_of(p))} for g in range(2)]
        assert all(len(c) == 1 for c in by_group), f"a group split across cliques: {by_group}"
        assert by_group[0] != by_group[1], "two groups of one domain in one clique"
        ctl = Controller(client, channels_per_clique=4)
        ctl.reconcile_domains()
        status = client.get(ComputeDomainResource, first, namespace="default").status
        assert status["placedCliques"] == 2 and status["phase"] == "Allocating"
        assert [(g["claim"], g["clique"]) for g in status["groups"]] == [
            (claims[first][g], by_group[g].pop()) for g in range(2)]

        # The second domain needs two cliques; one is free: none of its pods start, it says why.
        for p in pods[second]:
            client.create(whole_rack_pod(p, claims[second][int(p.split("-g")[1][0])], run))
        event = eventually("an Event naming the job's shortfall", lambda: next((
            e for e in client.list(Event, namespace="default", fields={"involvedObject.name": claims[second][0]})
            if e.reason == "NoCliqueRoom"), None), timeout=30)
        assert "a job of 2 clique groups needs 2 cliques with room, 1 have it" in (event.message or "")
        for p in pods[second]:
            spec = client.get(Pod, p, namespace="default").spec
            assert spec.schedulingGates and not spec.nodeName, f"{p} started without its whole job"
        ctl.reconcile_domains()
        status = client.get(ComputeDomainResource, second, namespace="default").status
        assert status["phase"] == "Pending" and "0 of 2 clique groups have a channel" in str(status["conditions"])
    finally:
        stop.set()
        for d, names_ in claims.items():
            for p in pods[d]:
                with contextlib.suppress(ApiError):
                    client.delete(Pod, p, namespace="default", grace_period=0)
            for c in names_:
                with contextlib.suppress(ApiError):
                    client.delete(ResourceClaim, c, namespace="default")
            with contextlib.suppress(ApiError):
                client.delete(ComputeDomainResource, d, namespace="default")
        worker.join(timeout=5)


def test_domains_the_cluster_cannot_satisfy_fail_naming_why_and_hold_no_channel(
        cluster: Cluster, racks: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A domain pinned to a clique no node is in, and one of a mode the driver does not allow: both
    Failed with the reason, their pods still gated, their claims unallocated. A domain pinned to a
    clique that exists gets that clique, not the one placement would choose for it."""
    monkeypatch.setattr(feasibility, "INVENTORY_GRACE_S", 0.0)  # the agents here are all up
    client: Client = cluster.client
    run, where = racks
    pinned_to = max(where.values())  # ties go to the first clique by name: pin the last
    specs: dict[str, dict[str, Any]] = {
        f"plc-{run}-unknown": {"placement": {"clique": f"{uuid.uuid4()}.7"}},
        f"plc-{run}-dedicated": {"imexMode": "Dedicated"},
        f"plc-{run}-pinned": {"placement": {"clique": pinned_to}},
    }
    claims = {d: provider_domain(client, d, s) for d, s in specs.items()}
    pods = {d: [f"{d}-{i}" for i in range(NODES_PER_CLIQUE)] for d in specs}
    modes = frozenset({api.IMEXMode.CLIQUE_SCOPED})
    reserver = Reserver(client, pools.DRIVER, channels_per_clique=4, imex_modes=modes)
    stop = threading.Event()
    worker = threading.Thread(target=reserver.run, args=(stop.is_set,), daemon=True)
    worker.start()
    try:
        for d in specs:
            for p in pods[d]:
                client.create(whole_rack_pod(p, claims[d], run))
        pinned = f"plc-{run}-pinned"
        eventually("the pinned domain's pods to be bound", lambda: all(
            client.get(Pod, p, namespace="default").spec.nodeName for p in pods[pinned]), timeout=60)
        assert {where[client.get(Pod, p, namespace="default").spec.nodeName] for p in pods[pinned]} == {pinned_to}

        ctl = Controller(client, channels_per_clique=4, imex_modes=modes)
        ctl.reconcile_domains()
        for d, reason, words in [(f"plc-{run}-unknown", "UnknownClique", "is not a clique of this cluster"),
                                 (f"plc-{run}-dedicated", "IMEXModeNotAllowed", "imexMode Dedicated is not allowed")]:
            status = client.get(ComputeDomainResource, d, namespace="default").status
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            assert (status["phase"], ready["reason"]) == ("Failed", reason), status
            assert words in ready["message"]
            claim = client.get(ResourceClaim, claims[d], namespace="default")
            assert claim.status is None or claim.status.allocation is None, f"{d}'s claim holds a channel"
            for p in pods[d]:
                spec = client.get(Pod, p, namespace="default").spec
                assert spec.schedulingGates and not spec.nodeName, f"{p} was let through"
        assert client.get(ComputeDomainResource, pinned, namespace="default").status["phase"] != "Failed"
    finally:
        stop.set()
        for d in specs:
            remove_domain(client, d, claims[d], pods[d])
        worker.join(timeout=5)
