"""Two teams on one simulated rack, with nvlfabric's driver running (agents, keepers, controller):
each team's domain, even under the same name, gets its own channel, its own nodes in its status and
its own reservations; a tenant's pod that names a claim only the other team has gets nothing of it
(docs/tenants.md). The tenant acts with its service account's token, bound to the built-in `edit`
in its own namespace (nvlfabric-edit aggregated into it); the other team's objects are made as the
provider makes them, and its job runs on the node the tenant attacks from. Each attack of issue 49
is tried, and the other team's pod, claim and channel are the same, to the byte, before and after.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import (
    Container,
    PodResourceClaim,
    PodSchedulingGate,
    PodSpec,
    ResourceRequirements,
)
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod, ResourceQuota
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric import manifests
from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.cluster import eventually, install_crd, ready_domain_status
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import simulated_rack
from tests.support.agents import edits
from tests.support.tenants import make_tenant

pytestmark = pytest.mark.cluster
RACK = 167  # addresses 127.10.167.x: a rack number no other test uses


@dataclass(frozen=True)
class Teams:
    cp: ControlPlane
    admin: Client  # the platform, and team a through it
    tenant: Client  # team b's service account
    a: str
    b: str
    nodes: list[str]


@pytest.fixture(scope="module")
def teams() -> Iterator[Teams]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=2, field_manager="tenants-test",
                        prefix="nvlten-") as (cp, admin):
        install_crd(admin)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            admin.apply(obj, field_manager="tenants-test", force=True)
        suffix = uuid.uuid4().hex[:5]
        a, b = f"team-a-{suffix}", f"team-b-{suffix}"
        tenant = make_tenant(admin, yaml.safe_load(cp.kubeconfig.read_text()), a, b)
        try:
            yield Teams(cp=cp, admin=admin, tenant=tenant, a=a, b=b, nodes=sorted(n.name for n in cp.nodes()))
        finally:
            tenant.close()


def domain(client: Client, namespace: str, name: str, spec: dict[str, Any] | None = None) -> str:
    """A ComputeDomain and its claim as the provider makes them; the claim's name."""
    cd = eventually("the Role to let the domain be created", lambda: _created(client, namespace, name, spec or {}),
                    timeout=30)
    claim = channel_claim(name, namespace, cd.metadata.uid, api.ComputeDomainSpec.model_validate(spec or {}))
    client.create(codecs.from_dict(claim))
    return str(claim["metadata"]["name"])


def _created(client: Client, namespace: str, name: str, spec: dict[str, Any]) -> Any:
    try:
        return client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec))
    except ApiError as exc:
        if exc.status.code == 403 and "ValidatingAdmissionPolicy" not in (exc.status.message or ""):
            return None  # RBAC, not in effect yet
        raise


def gated_pod(client: Client, namespace: str, name: str, claim: str, node: str) -> Pod:
    """A pod as BoundJob makes one: the domain's claim and the reservation gate the controller lifts."""
    return client.create(Pod(metadata=ObjectMeta(name=name, namespace=namespace), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node},
        schedulingGates=[PodSchedulingGate(name=names.RESERVATION_GATE)],
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=claim)],
        containers=[Container(name="worker", image="registry.invalid/train:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))


def _running(client: Client, namespace: str, name: str) -> bool:
    return client.get(Pod, name, namespace=namespace).status.phase == "Running"


@dataclass(frozen=True)
class TeamA:
    """Team a's job: domain a/train, its claim, and pod train-0 running on the first node."""

    claim: str
    pod: Pod
    node: str


@pytest.fixture(scope="module")
def team_a(teams: Teams) -> TeamA:
    t = teams
    eventually("the agents to label the nodes with their clique", lambda: all(
        (t.admin.get(Node, n).metadata.labels or {}).get(names.CLIQUE_LABEL) for n in t.nodes), timeout=120)
    claim = domain(t.admin, t.a, "train")
    pod = gated_pod(t.admin, t.a, "train-0", claim, t.nodes[0])
    eventually(f"{t.a}/train-0 to run", lambda: _running(t.admin, t.a, "train-0"), timeout=120)
    ready_domain_status(t.admin, "train", t.a)
    return TeamA(claim=claim, pod=pod, node=t.nodes[0])


def team_a_as_seen(t: Teams, a: TeamA) -> dict[str, Any]:
    """Everything of team a's job an attack could disturb: its pod's identity, containers and
    restarts, its claim (allocation and reservations), its domain's channel and members, and the
    container edits (the channel device) its runtime applied."""
    pod = t.admin.get(Pod, "train-0", namespace=t.a).to_dict()
    claim = t.admin.get(ResourceClaim, a.claim, namespace=t.a).to_dict()
    status = ready_domain_status(t.admin, "train", t.a)
    return {"pod": (pod["metadata"]["uid"], pod["spec"].get("nodeName"),
                    [(c.get("containerID"), c.get("restartCount"), (c.get("state") or {}).get("running"))
                     for c in pod["status"].get("containerStatuses") or []]),
            "claim": json.dumps({"uid": claim["metadata"]["uid"], "status": claim.get("status")}, sort_keys=True),
            "domain": (status["channel"], status["clique"], [n["name"] for n in status["nodes"]]),
            "edits": edits(t.cp.state_dir, a.node, "train-0", namespace=t.a)}


def test_same_named_domains_of_two_teams_keep_their_channels_nodes_and_reservations(
        teams: Teams, team_a: TeamA) -> None:
    t, (node_a, node_b) = teams, teams.nodes
    claim_a, pod_a = team_a.claim, team_a.pod
    claim_b = domain(t.tenant, t.b, "train")  # the same name, in the tenant's namespace
    secret = domain(t.admin, t.a, "secret")  # a claim only team a has
    pod_b = gated_pod(t.tenant, t.b, "train-0", claim_b, node_b)
    spy = gated_pod(t.tenant, t.b, "spy", secret, node_b)  # names team a's claim, in its own namespace

    eventually(f"{t.b}/train-0 to run", lambda: _running(t.admin, t.b, "train-0"), timeout=120)
    status_a, status_b = ready_domain_status(t.admin, "train", t.a), ready_domain_status(t.admin, "train", t.b)
    assert [n["name"] for n in status_a["nodes"]] == [node_a], status_a
    assert [n["name"] for n in status_b["nodes"]] == [node_b], status_b
    assert status_a["channel"] != status_b["channel"]
    for ns, node, status in ((t.a, node_a, status_a), (t.b, node_b, status_b)):
        rec = edits(t.cp.state_dir, node, "train-0", namespace=ns)
        assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{status['channel']}",
                                       "type": "c", "major": 507, "minor": status["channel"]}], rec
    reserved = {ns: [r.uid for r in t.admin.get(ResourceClaim, claim, namespace=ns).status.reservedFor or []
                     if r.resource == "pods"]
                for ns, claim in ((t.a, claim_a), (t.b, claim_b))}
    assert reserved == {t.a: [pod_a.metadata.uid], t.b: [pod_b.metadata.uid]}

    time.sleep(3)  # several controller passes: the spy must get nothing from them
    spied = t.admin.get(Pod, "spy", namespace=t.b)
    assert spied.status.phase == "Pending" and spied.spec.nodeName is None
    assert [g.name for g in spied.spec.schedulingGates or []] == [names.RESERVATION_GATE], "the gate stays"
    kept = t.admin.get(ResourceClaim, secret, namespace=t.a)
    assert not (kept.status and kept.status.reservedFor), kept.status
    assert spy.metadata.uid not in str(kept.to_dict())
    t.tenant.delete(Pod, "spy", namespace=t.b)


def test_all_channels_of_a_dedicated_domain_are_its_own_on_a_node_another_team_uses(
        teams: Teams, team_a: TeamA) -> None:
    """Hole 1: `channelAllocationMode: All` gave the pod every channel of its node,
    channel0..channel2047, team a's among them. All is every channel of the pod's own domain."""
    t = teams
    before = team_a_as_seen(t, team_a)
    claim = domain(t.tenant, t.b, "every", {"imexMode": "Dedicated", "channelAllocationMode": "All"})
    gated_pod(t.tenant, t.b, "every-0", claim, team_a.node)  # on team a's node
    eventually(f"{t.b}/every-0 to run", lambda: _running(t.admin, t.b, "every-0"), timeout=120)
    own = ready_domain_status(t.admin, "every", t.b)["channel"]
    rec = edits(t.cp.state_dir, team_a.node, "every-0", namespace=t.b)
    assert [d["path"] for d in rec["deviceNodes"]] == [f"/dev/nvidia-caps-imex-channels/channel{own}"], rec
    assert f"NVLFABRIC_IMEX_CHANNEL={own}" in rec["env"], rec["env"]
    assert before["domain"][0] != own
    assert team_a_as_seen(t, team_a) == before


def test_a_claim_that_is_not_its_domains_own_is_deleted_and_never_prepared(teams: Teams, team_a: TeamA) -> None:
    """Hole 2: what an admission policy cannot see. A claim owned by, and configured for, a domain of
    the tenant's own namespace passes any policy: under a name that is not the domain's claim (a
    second channel for one domain) the controller deletes it within a pass and never places its
    gated pods; with team a's domain uid under the tenant's own domain name, no agent prepares it
    (the garbage collector, finding no owner of that uid, deletes it too), and its pod never runs."""
    t = teams
    before = team_a_as_seen(t, team_a)
    domain(t.tenant, t.b, "own")
    own = t.admin.get(ComputeDomainResource, "own", namespace=t.b).metadata.uid
    second = channel_claim("own", t.b, own, api.ComputeDomainSpec())
    second["metadata"]["name"] = "own-extra"
    t.tenant.create(codecs.from_dict(second))  # admitted: its namespace, owner and configuration agree
    gated_pod(t.tenant, t.b, "extra-0", "own-extra", team_a.node)

    def stray_event() -> Any:
        return next((e for e in t.admin.list(Event, namespace=t.b) if e.reason == "StrayChannelClaim"
                     and e.involvedObject.name == "own-extra"), None)
    seen = eventually("the controller to delete the stray claim", stray_event, timeout=15)
    assert f"ComputeDomain {t.b}/own's channel claim is own-channel, not own-extra" in seen.message, seen.message
    eventually("the stray claim to be gone", lambda: _gone(t.admin, "own-extra", t.b), timeout=15)
    pod = t.admin.get(Pod, "extra-0", namespace=t.b)
    assert pod.spec.nodeName is None and [g.name for g in pod.spec.schedulingGates or []] == \
        [names.RESERVATION_GATE], "a stray claim's gated pod is never placed"

    theirs = t.admin.get(ComputeDomainResource, "train", namespace=t.a).metadata.uid
    forged = channel_claim("own", t.b, theirs, api.ComputeDomainSpec())
    forged["metadata"]["name"] = "borrowed"
    t.tenant.create(codecs.from_dict(forged))  # admitted: the policy cannot look the uid up
    # A pod as a tenant writes one, without the gate: the scheduler allocates the claim at once.
    t.tenant.create(Pod(metadata=ObjectMeta(name="thief", namespace=t.b), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": team_a.node},
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName="borrowed")],
        containers=[Container(name="worker", image="registry.invalid/train:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
    eventually("the forged claim to be deleted", lambda: _gone_or_deleting(t.admin, "borrowed", t.b), timeout=15)
    time.sleep(3)  # the kubelet tries to prepare it meanwhile, and the agent refuses
    thief = t.admin.get(Pod, "thief", namespace=t.b)
    assert thief.status.phase != "Running", thief.status
    refusals = [e.message for e in t.admin.list(Event, namespace=t.b)
                if e.involvedObject.name == "thief" and e.reason == "FailedPrepareDynamicResources"]
    if thief.spec.nodeName:  # bound (its claim allocated before the deletion): the agent said why not
        assert any(f"uid {theirs}" in m for m in refusals), refusals
    t.tenant.delete(Pod, "thief", namespace=t.b)
    t.tenant.delete(Pod, "extra-0", namespace=t.b)
    eventually("the forged claim to be gone with its pod", lambda: _gone(t.admin, "borrowed", t.b), timeout=60)
    assert team_a_as_seen(t, team_a) == before


def _gone_or_deleting(client: Client, name: str, namespace: str) -> bool:
    try:
        claim = client.get(ResourceClaim, name, namespace=namespace)
    except ApiError as exc:
        return exc.status.code == 404
    return claim.metadata is not None and claim.metadata.deletionTimestamp is not None


def _gone(client: Client, name: str, namespace: str) -> bool:
    try:
        client.get(ResourceClaim, name, namespace=namespace)
    except ApiError as exc:
        return exc.status.code == 404
    return False


def test_a_namespace_holds_no_more_channels_than_the_drivers_quota(teams: Teams, team_a: TeamA) -> None:
    """Hole 3: how many channels a namespace may hold was a doc, not the driver's. The controller
    keeps a ResourceQuota in every namespace with a domain (64 channels by default), and a platform
    sets one team's bound with an annotation on its Namespace, which `edit` cannot change."""
    t = teams
    before = team_a_as_seen(t, team_a)
    quota = eventually("the controller's channel quota in the tenant's namespace", lambda: _quota(t.admin, t.b))
    assert quota.spec.hard == {names.CHANNEL_QUOTA_RESOURCE: str(names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE)}
    with pytest.raises(ApiError) as info:  # a tenant cannot raise its own bound
        t.tenant.patch(Namespace, t.b, {"metadata": {"annotations": {names.CHANNEL_QUOTA_ANNOTATION: "9999"}}})
    assert info.value.status.code == 403
    held = len(list(t.admin.list(ResourceClaim, namespace=t.b)))  # quota counts claims' devices, allocated or not
    t.admin.patch(Namespace, t.b, {"metadata": {"annotations": {names.CHANNEL_QUOTA_ANNOTATION: str(held)}}})
    eventually("the platform's bound to reach the quota", lambda: (q := _quota(t.admin, t.b)) is not None and
               q.spec.hard == {names.CHANNEL_QUOTA_RESOURCE: str(held)} and q.status is not None and
               (q.status.hard or {}).get(names.CHANNEL_QUOTA_RESOURCE) == str(held), timeout=60)
    cd = eventually("the domain to be created", lambda: _created(t.tenant, t.b, "one-more", {}), timeout=30)
    with pytest.raises(ApiError) as info:
        t.tenant.create(codecs.from_dict(channel_claim("one-more", t.b, cd.metadata.uid, api.ComputeDomainSpec())))
    message = info.value.status.message or ""
    assert info.value.status.code == 403 and f"exceeded quota: {names.CHANNEL_QUOTA_NAME}" in message, message
    assert team_a_as_seen(t, team_a) == before


def _quota(client: Client, namespace: str) -> ResourceQuota | None:
    try:
        return client.get(ResourceQuota, names.CHANNEL_QUOTA_NAME, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
