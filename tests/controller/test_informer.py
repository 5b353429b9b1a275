"""The controller's informers on the real API server: a cache that follows the cluster with one
list and one watch, and a running controller whose passes read that cache, not the API server
(before, every pass listed every agent's Node and each clique's slices and read every claim:
O(nodes + domains) requests per pass, passes O(changes) times)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace

from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.controller.informer import Informer
from nvlfabric.controller.reconcile import Controller
from nvlfabric.sim.cluster import eventually
from tests.conftest import Cluster
from tests.support.domains import provider_domain, remove_domain

pytestmark = pytest.mark.cluster
LABEL = {"inf-test": "yes"}


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"inf-{uuid.uuid4().hex[:6]}"
    cluster.client.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    cluster.client.delete(Namespace, name)


def test_an_informer_follows_creates_updates_and_deletes(cluster: Cluster, namespace: str) -> None:
    client = cluster.client
    client.create(ConfigMap(metadata=ObjectMeta(name="before", namespace=namespace, labels=LABEL), data={"v": "0"}))
    seen: list[tuple[str, str, Any]] = []
    inf: Informer[str] = Informer(client, ConfigMap, slim=lambda cm: (cm.data or {}).get("v", ""),
                                  fields={"metadata.namespace": namespace}, labels={"inf-test": None})
    inf.listen(lambda kind, key, old, new: seen.append((kind, key[1], new)))
    assert inf.fresh() == {(namespace, "before"): "0"}, "not watching: fresh() lists"
    stop = threading.Event()
    inf.start(stop.is_set)
    try:
        assert inf.synced.wait(10)
        eventually("the informer to watch", lambda: inf.watching)
        client.create(ConfigMap(metadata=ObjectMeta(name="later", namespace=namespace, labels=LABEL), data={"v": "1"}))
        client.patch(ConfigMap, "before", {"data": {"v": "2"}}, namespace=namespace)
        client.delete(ConfigMap, "later", namespace=namespace)
        eventually("the informer to see all three changes", lambda: (namespace, "later") not in inf.items()
                   and inf.get((namespace, "before")) == "2" and ("DELETED", "later", None) in seen)
        assert ("ADDED", "later", "1") in seen and ("MODIFIED", "before", "2") in seen
        # A write that changes nothing the record holds is no news to its listeners.
        before = len(seen)
        client.patch(ConfigMap, "before", {"metadata": {"annotations": {"x": "y"}}}, namespace=namespace)
        client.create(ConfigMap(metadata=ObjectMeta(name="marker", namespace=namespace, labels=LABEL), data={"v": "3"}))
        eventually("the marker", lambda: inf.get((namespace, "marker")) == "3")
        assert [s[1] for s in seen[before:]] == ["marker"]
    finally:
        stop.set()


class Counting(Client):
    """The real client, counting the requests a caller makes other than watches."""

    def __init__(self, base: Client) -> None:
        self.__dict__.update(base.__dict__)
        self.requests: list[str] = []

    def list(self, res: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.requests.append(f"list {res.__name__}")
        return super().list(res, *args, **kwargs)

    def get(self, res: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.requests.append(f"get {res.__name__}")
        return super().get(res, *args, **kwargs)


def test_a_running_controller_reads_its_informers_not_the_api_server(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    clique, _ = clique_nodes
    client = Counting(cluster.client)
    names = [f"inf-{uuid.uuid4().hex[:5]}" for _ in range(3)]
    claims = [provider_domain(cluster.client, n, {"placement": {"clique": clique}}) for n in names]
    stop = threading.Event()
    ctl = Controller(client, channels_per_clique=4)
    ctl.cache.start(stop.is_set)
    threading.Thread(target=ctl.run, kwargs={"stop": stop.is_set}, daemon=True).start()
    try:
        for n in names:
            eventually(f"domain {n} summarised", lambda n=n: (
                (cluster.client.get(ComputeDomainResource, n, namespace="default").status or {}).get("phase")))
        settled = len(client.requests)
        # Five seconds: two full passes and the pokes of our own status writes. Each used to list
        # the agents' Nodes and the pool slices and read all three claims.
        threading.Event().wait(5)
        extra = client.requests[settled:]
        # What is read on a clock, not per pass: the pools' owner (the DeviceClass) and the domains'
        # namespace for its channel quota (quota.RECHECK_S), each every 10 s: once at most in 5 s.
        assert sorted(set(extra)) == sorted(extra), extra
        assert set(extra) <= {"get DeviceClass", "get Namespace"}, extra
    finally:
        stop.set()
        for n, c in zip(names, claims, strict=True):
            remove_domain(cluster.client, n, c, [])
