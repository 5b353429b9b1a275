"""The reservation passes (nvlfabric/controller/reservations.py and the modules it orders) on the
real API server and scheduler: an allocated channel claim is reserved for its pending pods in
one write, a domain holds its claim, gated pods go once reserved (the pioneer first) and only
once the claim watch shows it. The pure rules: test_reservationplan.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api.names import RESERVATION_GATE
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.controller.reconcile import Controller
from nvlfabric.controller.reservations import Reserver
from nvlfabric.sim.cluster import eventually
from tests.conftest import Cluster
from tests.controller.pods import channel_pod
from tests.support.domains import provider_domain, remove_domain


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
