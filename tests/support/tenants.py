"""Service-account clients as the driver's processes and a platform's tenants hold them: a fresh
TokenRequest token (pod-bound when asked, as a projected token is), and a tenant set up as a
platform sets up a team (its namespace, service account and `edit` there)."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import RoleBinding

from nvlfabric.api import names

#: The tenant's service account (and Role) in its own namespace.
TENANT = "team"


def token_client(admin: Client, server: str, ca_data: str, service_account: str, *, bound_pod: Pod | None,
                 manager: str, namespace: str = names.NAMESPACE) -> Client:
    """A client authenticating with a fresh TokenRequest token of the service account (of `namespace`);
    bound to `bound_pod` when given (the token then carries the pod's node, as a projected token does)."""
    bound = None
    if bound_pod is not None:
        assert bound_pod.metadata is not None
        bound = BoundObjectReference(kind="Pod", apiVersion="v1", name=bound_pod.metadata.name,
                                     uid=bound_pod.metadata.uid)
    req = ServiceAccount.Token(metadata=ObjectMeta(name=service_account, namespace=namespace),
                               spec=TokenRequestSpec(audiences=[], expirationSeconds=3600, boundObjectRef=bound))
    resp = admin.create(req, service_account, namespace=namespace)
    assert resp.status is not None and resp.status.token
    config = KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "sim", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": service_account, "user": {"token": resp.status.token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sim", "user": service_account}}],
    })
    return Client(config=config, field_manager=manager)


def make_tenant(admin: Client, kubeconfig: dict[str, Any], other: str, own: str) -> Client:
    """Namespaces `other` and `own`, and a client of the tenant's service account of `own` bound to
    the built-in ClusterRole `edit` there (a RoleBinding: nothing in any other namespace), as a
    platform sets a team up. What `edit` gives on ComputeDomains is nvlfabric's aggregated
    `nvlfabric-edit` (driver.yaml)."""
    for ns in (other, own):
        admin.create(Namespace(metadata=ObjectMeta(name=ns)))
    admin.create(ServiceAccount(metadata=ObjectMeta(name=TENANT, namespace=own)))
    admin.create(RoleBinding(metadata=ObjectMeta(name=TENANT, namespace=own), roleRef=RoleRef(
        apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
        subjects=[Subject(kind="ServiceAccount", name=TENANT, namespace=own)]))
    cluster = kubeconfig["clusters"][0]["cluster"]
    return token_client(admin, cluster["server"], cluster["certificate-authority-data"], TENANT, bound_pod=None,
                        manager="tenant", namespace=own)
