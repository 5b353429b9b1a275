"""Tenants who cannot reach each other (docs/tenants.md), tried as a tenant on a real API server.

The tenant is a service account of namespace `tenant-b-*` bound to the built-in ClusterRole `edit`
there, as a platform gives a team its namespace; nvlfabric's `nvlfabric-edit` is aggregated into
it. The scheduler allocates a channel of a clique's pool to any claim of the DeviceClass
`imex-channel.nvlfabric.io` a pod uses, before any agent can refuse it, so the driver's admission
policy `nvlfabric-channel-claims` refuses, at creation, every channel claim that is not a
ComputeDomain's own claim of the same namespace; how many channels a namespace may hold is its
ResourceQuota's.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import ResourceQuotaSpec, ResourceQuotaStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, ResourceQuota
from lightkube.resources.rbac_authorization_v1 import ClusterRole
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.cluster import eventually
from tests.conftest import Cluster
from tests.support.policies import denied, install_driver_objects, policy_in_effect, remove_policies
from tests.support.tenants import make_tenant

pytestmark = pytest.mark.cluster
POLICY = "nvlfabric-channel-claims"
QUOTA_KEY = f"{names.DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"


@dataclass(frozen=True)
class Tenants:
    admin: Client
    tenant: Client  # the service account `team` of namespace b
    a: str  # another team's namespace
    b: str  # the tenant's own


@pytest.fixture(scope="module")
def tenants(cluster: Cluster) -> Iterator[Tenants]:
    admin = cluster.client
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    suffix = uuid.uuid4().hex[:5]
    a, b = f"tenant-a-{suffix}", f"tenant-b-{suffix}"
    tenant: Client | None = None
    try:
        install_driver_objects(admin)
        tenant = make_tenant(admin, kubeconfig, a, b)
        t = Tenants(admin=admin, tenant=tenant, a=a, b=b)
        policy_in_effect(lambda: admin.create(codecs.from_dict(_claim(b, "probe")), dry_run=True))
        eventually("the tenant's `edit` (with nvlfabric-edit aggregated) to be in effect", lambda: _can_list(t))
        yield t
    finally:
        if tenant is not None:
            tenant.close()
        for ns in (a, b):
            with contextlib.suppress(ApiError):
                admin.delete(Namespace, ns)
        remove_policies(admin)  # the suite's other tests write claims by hand, without a domain's owner


def _can_list(t: Tenants) -> bool:
    try:
        list(t.tenant.list(ResourceClaim, namespace=t.b))
        list(t.tenant.list(ComputeDomainResource, namespace=t.b))
    except ApiError as exc:
        if exc.status.code in (403, 429):  # RBAC's aggregation, or the CRD's storage, on its way
            return False
        raise
    return True


def _claim(namespace: str, name: str, *, config: list[dict[str, Any]] | None = None,
           owners: list[dict[str, Any]] | None = None, device_class: str = names.DEVICE_CLASS) -> dict[str, Any]:
    """A hand-written channel claim, as a tenant would write one."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, **({"ownerReferences": owners} if owners else {})},
            "spec": {"devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": device_class}}],
                                 **({"config": config} if config else {})}}}


def _domain(client: Client, namespace: str, name: str) -> Any:
    return client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace=namespace), spec={}))


def _domain_claim(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The claim the provider makes for domain `name` (nvlfabric/provider/computedomain.py)."""
    return channel_claim(name, namespace, uid, api.ComputeDomainSpec())


def _claims(t: Tenants) -> list[str]:
    return [c.metadata.name for c in t.admin.list(ResourceClaim, namespace=t.b) if c.metadata]


def test_a_channel_claim_without_configuration_is_refused_at_creation(tenants: Tenants) -> None:
    msg = denied(lambda: tenants.tenant.create(codecs.from_dict(_claim(tenants.b, "stolen"))))
    assert f"ResourceClaim {tenants.b}/stolen requests DeviceClass {names.DEVICE_CLASS} but carries 0 " \
           "channel.nvlfabric.io configurations naming a ComputeDomain" in msg, msg
    assert "declare a ComputeDomain and use its claim" in msg
    assert "stolen" not in _claims(tenants)


def test_a_claim_naming_another_namespaces_domain_is_refused_even_with_its_uid(tenants: Tenants) -> None:
    theirs = _domain(tenants.admin, tenants.a, "train")  # team a's domain, its uid copied
    forged = _domain_claim(tenants.a, "train", theirs.metadata.uid)
    forged["metadata"].update(namespace=tenants.b, name="stolen")
    msg = denied(lambda: tenants.tenant.create(codecs.from_dict(forged)))
    assert f"ResourceClaim {tenants.b}/stolen names ComputeDomain {tenants.a}/train" in msg, msg
    assert f"only for a ComputeDomain of its own namespace {tenants.b}" in msg
    assert "stolen" not in _claims(tenants)


def test_a_claim_its_domain_does_not_own_is_refused(tenants: Tenants) -> None:
    """The configuration of the tenant's own domain, but a claim the domain did not make: a second
    channel for one domain, or a claim that outlives it."""
    own = _domain(tenants.tenant, tenants.b, "mine")
    claim = _domain_claim(tenants.b, "mine", own.metadata.uid)
    claim["metadata"].update(name="extra", ownerReferences=[])
    msg = denied(lambda: tenants.tenant.create(codecs.from_dict(claim)))
    assert f"ResourceClaim {tenants.b}/extra is not owned by the ComputeDomain its configuration names " \
           f"({tenants.b}/mine, uid {own.metadata.uid}, a controller owner reference of apiVersion " \
           f"{api.API_VERSION})" in msg, msg
    claim["metadata"]["ownerReferences"] = [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "mine",
                                            "uid": str(uuid.uuid4())}]
    assert "is not owned by" in denied(lambda: tenants.tenant.create(codecs.from_dict(claim)))


def test_a_claim_template_for_channels_is_refused(tenants: Tenants) -> None:
    own = _domain(tenants.tenant, tenants.b, "per-pod")
    claim = _domain_claim(tenants.b, "per-pod", own.metadata.uid)
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "per-pod", "namespace": tenants.b, "ownerReferences":
                             claim["metadata"]["ownerReferences"]},
                "spec": {"spec": claim["spec"]}}
    msg = denied(lambda: tenants.tenant.create(codecs.from_dict(template)))
    assert f"ResourceClaimTemplate {tenants.b}/per-pod requests DeviceClass {names.DEVICE_CLASS}" in msg, msg
    assert "never a claim per pod" in msg
    assert not list(tenants.admin.list(ResourceClaimTemplate, namespace=tenants.b))


def test_claims_of_other_device_classes_are_not_ours_to_judge(tenants: Tenants) -> None:
    other = _claim(tenants.b, "gpus", device_class="gpu.example.com")
    tenants.tenant.create(codecs.from_dict(other), dry_run=True)


def test_the_tenants_own_domain_claim_is_admitted_and_quota_bounds_its_channels(tenants: Tenants) -> None:
    """A team's own domains get their channels; its ResourceQuota, not the clique's 2047, is what
    bounds how many it holds."""
    tenants.admin.create(ResourceQuota(metadata=ObjectMeta(name="channels", namespace=tenants.b),
                                       spec=ResourceQuotaSpec(hard={QUOTA_KEY: "1"})))
    eventually("the quota controller to count the namespace's channels", lambda: (tenants.admin.get(
        ResourceQuota, "channels", namespace=tenants.b).status or ResourceQuotaStatus()).hard)
    first = _domain(tenants.tenant, tenants.b, "first")
    tenants.tenant.create(codecs.from_dict(_domain_claim(tenants.b, "first", first.metadata.uid)))
    second = _domain(tenants.tenant, tenants.b, "second")
    with pytest.raises(ApiError) as info:
        tenants.tenant.create(codecs.from_dict(_domain_claim(tenants.b, "second", second.metadata.uid)))
    assert info.value.status.code == 403 and "exceeded quota: channels" in (info.value.status.message or "")
    assert QUOTA_KEY in (info.value.status.message or "")
    assert _claims(tenants) == ["first-channel"]


def _owned(claim: dict[str, Any], **ref: Any) -> dict[str, Any]:
    """The claim with its owner reference changed."""
    claim["metadata"]["ownerReferences"] = [{**claim["metadata"]["ownerReferences"][0], **ref}]
    return claim


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda c: _owned(c, apiVersion="nvlfabric.io/v9"), "is not owned by"),  # no such version is served
    (lambda c: _owned(c, apiVersion="nvlfabric.io.evil/v1alpha1"), "is not owned by"),
    (lambda c: _owned(c, controller=False), "is not owned by"),
    (lambda c: _owned(c, kind="ConfigMap"), "is not owned by"),
    (lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=127) or c,
     "(request channel has count 127)"),
    (lambda c: (c["spec"]["devices"]["requests"][0]["exactly"].pop("count") and
     c["spec"]["devices"]["requests"][0]["exactly"].update(allocationMode="All")) or c,
     "(request channel has allocationMode All)"),
    (lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(adminAccess=True) or c,
     "(request channel has adminAccess)"),  # where the platform allows admin access in the namespace
    (lambda c: c["spec"]["devices"]["requests"].append(
        {"name": "more", "exactly": {"deviceClassName": names.DEVICE_CLASS}}) or c, "(2 requests)"),
    (lambda c: c["spec"]["devices"].update(requests=[{"name": "channel", "firstAvailable": [
        {"name": "a", "deviceClassName": names.DEVICE_CLASS, "count": 2}]}]) or c,
     "request channel uses firstAvailable"),
], ids=["unserved-version", "other-group", "not-controller", "not-a-domain", "count", "all-mode", "admin-access",
        "two-requests", "first-available"])
def test_a_claim_of_another_shape_than_its_domains_is_refused(tenants: Tenants, change: Any, refusal: str) -> None:
    """Issue 49: an owner of a version the API does not serve passed (`startsWith('nvlfabric.io/')`),
    and count/allocationMode were unbounded: with `edit` alone a tenant allocated 127 of a clique's
    128 channels with no ComputeDomain anywhere. One shape is admitted, the provider's."""
    if "adminAccess" in refusal:  # else the API server refuses it first, without the namespace's label
        tenants.admin.patch(Namespace, tenants.b, {"metadata": {"labels": {"resource.kubernetes.io/admin-access":
                                                                           "true"}}})
    name = f"shaped-{uuid.uuid4().hex[:5]}"
    own = _domain(tenants.tenant, tenants.b, name)
    claim = change(_domain_claim(tenants.b, name, own.metadata.uid))
    claim["metadata"]["name"] = "odd"
    msg = denied(lambda: tenants.tenant.create(codecs.from_dict(claim)))
    assert f"ResourceClaim {tenants.b}/odd" in msg and refusal in msg, msg
    assert "odd" not in _claims(tenants)


def test_edit_gives_a_team_its_domains_and_nothing_of_their_status_or_other_namespaces(tenants: Tenants) -> None:
    """nvlfabric-edit and nvlfabric-view aggregate into the built-in roles: `edit` in its own
    namespace is all a platform grants for a team to declare its domains."""
    mine = _domain(tenants.tenant, tenants.b, "declared")
    assert "declared" in [d.metadata.name for d in tenants.tenant.list(ComputeDomainResource, namespace=tenants.b)]
    tenants.tenant.patch(ComputeDomainResource, "declared", {"spec": {"numNodes": 2}}, namespace=tenants.b,
                         patch_type=PatchType.MERGE)
    with pytest.raises(ApiError) as info:  # the status is the controller's
        tenants.tenant.patch(ComputeDomainResource.Status, "declared", {"status": {"phase": "Ready"}},
                             namespace=tenants.b, patch_type=PatchType.MERGE)
    assert info.value.status.code == 403
    with pytest.raises(ApiError) as info:  # nothing in another namespace
        _domain(tenants.tenant, tenants.a, "elsewhere")
    assert info.value.status.code == 403
    with pytest.raises(ApiError) as info:
        list(tenants.tenant.list(ComputeDomainResource, namespace=tenants.a))
    assert info.value.status.code == 403
    tenants.tenant.delete(ComputeDomainResource, "declared", namespace=tenants.b)
    assert mine.metadata.uid


def test_the_aggregated_roles_say_what_they_grant(tenants: Tenants) -> None:
    edit, view = tenants.admin.get(ClusterRole, "edit"), tenants.admin.get(ClusterRole, "view")
    def grants(role: Any, verb: str) -> bool:
        return any(names.GROUP in (r.apiGroups or []) and "computedomains" in (r.resources or []) and verb in r.verbs
                   for r in role.rules or [])
    assert grants(edit, "create") and grants(edit, "delete") and grants(view, "list")
    assert not grants(view, "create")
