"""Two teams on one simulated rack, with nvlfabric's driver running (agents, keepers, controller):
each team's domain, even under the same name, gets its own channel, its own nodes in its status and
its own reservations; a tenant's pod that names a claim only the other team has gets nothing of it
(docs/tenants.md). The tenant acts with its service account's token and a namespaced Role
(tests/manifests/test_tenants.py); the other team's objects are made as the provider makes them.
"""

from __future__ import annotations

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
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric import manifests
from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller.reconcile import ComputeDomainResource
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


def domain(client: Client, namespace: str, name: str) -> str:
    """A ComputeDomain and its claim as the provider makes them; the claim's name."""
    cd = eventually("the Role to let the domain be created", lambda: _created(client, namespace, name), timeout=30)
    claim = channel_claim(name, namespace, cd.metadata.uid, api.ComputeDomainSpec())
    client.create(codecs.from_dict(claim))
    return str(claim["metadata"]["name"])


def _created(client: Client, namespace: str, name: str) -> Any:
    try:
        return client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace=namespace), spec={}))
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


def test_same_named_domains_of_two_teams_keep_their_channels_nodes_and_reservations(teams: Teams) -> None:
    t, (node_a, node_b) = teams, teams.nodes
    eventually("the agents to label the nodes with their clique", lambda: all(
        (t.admin.get(Node, n).metadata.labels or {}).get(names.CLIQUE_LABEL) for n in t.nodes), timeout=120)
    claim_a = domain(t.admin, t.a, "train")
    claim_b = domain(t.tenant, t.b, "train")  # the same name, in the tenant's namespace
    secret = domain(t.admin, t.a, "secret")  # a claim only team a has
    pod_a = gated_pod(t.admin, t.a, "train-0", claim_a, node_a)
    pod_b = gated_pod(t.tenant, t.b, "train-0", claim_b, node_b)
    spy = gated_pod(t.tenant, t.b, "spy", secret, node_b)  # names team a's claim, in its own namespace

    for ns in (t.a, t.b):
        eventually(f"{ns}/train-0 to run", lambda ns=ns: _running(t.admin, ns, "train-0"), timeout=120)
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

