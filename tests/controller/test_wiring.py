"""The controller's wiring (nvlfabric/controller/wiring.py): the leader's work builds its parts on one
set of informers and starts them, so one running `work` reserves and places gated pods (the
Reserver and its placement) and summarises their domain (the reconciler). Each part's own rules are
tested in its own file; the real process, Lease and all, in test_faults.py."""

from __future__ import annotations

import threading

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api.names import CLIQUE_LABEL
from nvlfabric.controller import wiring
from nvlfabric.controller.__main__ import settings
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import eventually
from tests.conftest import Cluster
from tests.controller.pods import channel_pod
from tests.support.domains import provider_domain, remove_domain

pytestmark = pytest.mark.cluster


def test_the_leaders_work_reserves_places_and_summarises_on_one_set_of_informers(
        cluster: Cluster, clique_nodes: tuple[str, list[str]]) -> None:
    client: Client = cluster.client
    clique, nodes = clique_nodes
    run = nodes[0].split("-")[1]
    domain = f"wire-{run}"
    claim = provider_domain(client, domain)
    cfg = settings(["--channels-per-clique", "4", "--channel-quota-per-namespace", "0"])
    stop = threading.Event()
    worker = threading.Thread(target=wiring.work, args=(client, cfg, stop.is_set), daemon=True)
    pods = [f"{domain}-{i}" for i in range(3)]
    try:
        worker.start()
        for p in pods:
            client.create(channel_pod(p, claim, run, gated=True))
        eventually("every pod to be let through and bound", lambda: all(
            client.get(Pod, p, namespace="default").spec.nodeName for p in pods) or None, timeout=60)
        selectors = [client.get(Pod, p, namespace="default").spec.nodeSelector or {} for p in pods]
        assert [s.get(CLIQUE_LABEL) for s in selectors].count(clique) == 1, \
            f"placement sent no pioneer to the clique: {selectors}"
        st = client.get(ResourceClaim, claim, namespace="default").status
        assert st and sorted(r.name for r in st.reservedFor or [] if r.resource == "pods") == sorted(pods)
        assert [r.name for r in st.reservedFor or [] if r.resource != "pods"] == [domain]  # its domain's hold
        status = eventually("the reconciler to summarise the domain", lambda: (
            s if (s := client.get(ComputeDomainResource, domain, namespace="default").status or {}).get("clique")
            else None), timeout=30)
        assert status["clique"] == clique and status["phase"] == "Allocating"
    finally:
        stop.set()
        remove_domain(client, domain, claim, pods)
        worker.join(timeout=10)
        assert not worker.is_alive(), "the leader's work did not end when told to stop"
