"""Clique channel pools: consistent pool bookkeeping (property-tested), and the DRA design's two
promises checked on the real scheduler: all pods of a ComputeDomain land in one clique, and no
two ComputeDomains share a channel within a clique."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lightkube import ApiError
from lightkube.models.core_v1 import (
    Container,
    PodResourceClaim,
    PodSpec,
    ResourceRequirements,
)
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    CELDeviceSelector,
    DeviceClaim,
    DeviceClassSpec,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaimSpec,
)
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from nvlfabric.controller import pools
from nvlfabric.sim.cluster import delete_nodes, eventually, make_ready_nodes
from tests.conftest import Cluster


def apply_in_memory(store: dict[str, ResourceSlice], p: pools.Plan) -> None:
    for s in [*p.create, *p.update]:
        assert s.metadata is not None and s.metadata.name is not None
        store[s.metadata.name] = s
    for name in p.delete:
        del store[name]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=5))
def test_a_pool_is_consistent_after_every_change_and_plans_are_idempotent(counts: list[int]) -> None:
    store: dict[str, ResourceSlice] = {}
    last_gen = 0
    for n in counts:
        apply_in_memory(store, pools.plan("c1.7", n, list(store.values())))
        gens = {s.spec.pool.generation for s in store.values()}
        assert len(gens) == 1
        gen = gens.pop()
        assert gen >= last_gen
        last_gen = gen
        assert {s.spec.pool.resourceSliceCount for s in store.values()} == {len(store)}
        channels = sorted(d.attributes["channel"].int for s in store.values() for d in s.spec.devices)
        assert channels == list(range(1, n + 1))
        assert all(len(s.spec.devices) <= pools.MAX_DEVICES_PER_SLICE for s in store.values())
        assert pools.plan("c1.7", n, list(store.values())).empty()


def test_channel_zero_is_never_offered_and_the_ceiling_is_enforced() -> None:
    devices = pools.desired_slices("c.1", 3, 1)[0].spec.devices
    assert [d.name for d in devices] == ["channel-1", "channel-2", "channel-3"]
    with pytest.raises(ValueError, match="between 1 and 2047"):
        pools.desired_slices("c.1", 2048, 1)


CLASS = "imex-channel.test.nvlfabric.io"


@pytest.fixture
def two_cliques(cluster: Cluster) -> Iterator[dict[str, list[str]]]:
    client = cluster.client
    run = uuid.uuid4().hex[:5]
    cliques = {f"{run}-a.32766": [f"pool-{run}-a{i}" for i in range(2)],
               f"{run}-b.32766": [f"pool-{run}-b{i}" for i in range(2)]}
    make_ready_nodes(client, {name: {pools.CLIQUE_LABEL: clique, "pools-test": run}
                              for clique, names in cliques.items() for name in names})
    for clique in cliques:
        pools.apply(client, clique, channels=3)
    with contextlib.suppress(ApiError):
        client.create(DeviceClass(metadata=ObjectMeta(name=CLASS), spec=DeviceClassSpec(selectors=[
            DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{pools.DRIVER}"'))])))
    yield cliques
    for clique, names in cliques.items():
        pools.withdraw(client, clique)
        delete_nodes(client, names)


@pytest.mark.cluster
def test_pods_of_a_domain_share_one_channel_in_one_clique_and_domains_never_share(
        cluster: Cluster, two_cliques: dict[str, list[str]]) -> None:
    client = cluster.client
    run = next(iter(two_cliques)).split("-")[0]
    domains = [f"cd-{run}-{i}" for i in range(4)]
    for cd in domains:
        client.create(ResourceClaim(metadata=ObjectMeta(name=f"{cd}-channel", namespace="default"),
                                    spec=ResourceClaimSpec(devices=DeviceClaim(requests=[DeviceRequest(
                                        name="channel", exactly=ExactDeviceRequest(deviceClassName=CLASS))]))))
        for p in range(3):
            client.create(Pod(metadata=ObjectMeta(name=f"{cd}-{p}", namespace="default"), spec=PodSpec(
                nodeSelector={"pools-test": run},
                resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{cd}-channel")],
                containers=[Container(name="w", image="registry.invalid/w:1",
                                      resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
    try:
        node_clique = {n: c for c, ns in two_cliques.items() for n in ns}
        deadline = time.monotonic() + 90
        while True:
            pods = {cd: [client.get(Pod, f"{cd}-{p}", namespace="default") for p in range(3)] for cd in domains}
            if all(p.spec.nodeName for ps in pods.values() for p in ps):
                break
            assert time.monotonic() < deadline, "not every pod was scheduled"
            time.sleep(0.5)
        taken: dict[tuple[str, str], str] = {}
        per_clique: dict[str, int] = defaultdict(int)
        for cd in domains:
            claim = client.get(ResourceClaim, f"{cd}-channel", namespace="default")
            (result,) = claim.status.allocation.devices.results
            clique = result.pool.removeprefix("clique-")
            assert {node_clique[p.spec.nodeName] for p in pods[cd]} == {clique}, f"{cd} spans cliques"
            assert (result.pool, result.device) not in taken, f"{cd} and {taken.get((result.pool, result.device))}"
            taken[(result.pool, result.device)] = cd
            assert len([r for r in claim.status.reservedFor if r.resource == "pods"]) == 3
            per_clique[clique] += 1
        assert sum(per_clique.values()) == 4  # 4 domains fit in 2 cliques of 3 channels each
    finally:
        for cd in domains:
            for p in range(3):
                with contextlib.suppress(ApiError):
                    client.delete(Pod, f"{cd}-{p}", namespace="default", grace_period=0)
            with contextlib.suppress(ApiError):
                client.delete(ResourceClaim, f"{cd}-channel", namespace="default")


@pytest.mark.cluster
def test_a_domain_pinned_to_a_clique_lands_there_or_nowhere(cluster: Cluster,
                                                            two_cliques: dict[str, list[str]]) -> None:
    """spec.placement.clique becomes a CEL selector in the provider's channel claim; the scheduler
    puts the pods in that clique even though the other one has free channels too."""
    from nvlfabric.api.computedomain import ComputeDomainSpec, Placement
    from nvlfabric.provider.computedomain import channel_claim

    client = cluster.client
    run = next(iter(two_cliques)).split("-")[0]
    target = sorted(two_cliques)[1]
    cd = f"pin-{run}"
    # (model_construct: this fixture's clique names are shorter than real ones)
    spec = ComputeDomainSpec.model_construct(placement=Placement.model_construct(clique=target))
    manifest = channel_claim(cd, "default", str(uuid.uuid4()), spec)
    manifest["metadata"].pop("ownerReferences")  # no ComputeDomain object in this test
    manifest["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = CLASS
    manifest["spec"]["devices"].pop("config")
    client.create(ResourceClaim.from_dict(manifest))
    try:
        for p in range(2):
            client.create(Pod(metadata=ObjectMeta(name=f"{cd}-{p}", namespace="default"), spec=PodSpec(
                nodeSelector={"pools-test": run},
                resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{cd}-channel")],
                containers=[Container(name="w", image="registry.invalid/w:1",
                                      resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
        nodes = eventually("the pinned pods to be scheduled", lambda: (
            ns if all(ns := [client.get(Pod, f"{cd}-{p}", namespace="default").spec.nodeName for p in range(2)])
            else None), timeout=90)
        assert set(nodes) <= set(two_cliques[target])
        (result,) = client.get(ResourceClaim, f"{cd}-channel", namespace="default").status.allocation.devices.results
        assert result.pool == pools.pool_name(target)
    finally:
        for p in range(2):
            with contextlib.suppress(ApiError):
                client.delete(Pod, f"{cd}-{p}", namespace="default", grace_period=0)
        with contextlib.suppress(ApiError):
            client.delete(ResourceClaim, f"{cd}-channel", namespace="default")
