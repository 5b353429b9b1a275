"""Service-account clients as the driver's processes and a platform's tenants hold them: a fresh
TokenRequest token (pod-bound when asked, as a projected token is), and a tenant set up as a
platform sets up a team (its namespace, service account and a namespaced Role)."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

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


def tenant_rules() -> list[PolicyRule]:
    """What a platform gives a team in its namespace: claims, claim templates, pods and ComputeDomains."""
    verbs = ["create", "get", "list", "watch", "delete"]
    return [PolicyRule(apiGroups=["resource.k8s.io"], resources=["resourceclaims", "resourceclaimtemplates"],
                       verbs=verbs),
            PolicyRule(apiGroups=[""], resources=["pods"], verbs=verbs),
            PolicyRule(apiGroups=[names.GROUP], resources=["computedomains"], verbs=verbs)]


def make_tenant(admin: Client, kubeconfig: dict[str, Any], other: str, own: str) -> Client:
    """Namespaces `other` and `own`, and a client of the tenant's service account of `own` with a
    Role there (`tenant_rules`), as a platform sets a team up."""
    for ns in (other, own):
        admin.create(Namespace(metadata=ObjectMeta(name=ns)))
    admin.create(ServiceAccount(metadata=ObjectMeta(name=TENANT, namespace=own)))
    admin.create(Role(metadata=ObjectMeta(name=TENANT, namespace=own), rules=tenant_rules()))
    admin.create(RoleBinding(metadata=ObjectMeta(name=TENANT, namespace=own), roleRef=RoleRef(
        apiGroup="rbac.authorization.k8s.io", kind="Role", name=TENANT),
        subjects=[Subject(kind="ServiceAccount", name=TENANT, namespace=own)]))
    cluster = kubeconfig["clusters"][0]["cluster"]
    return token_client(admin, cluster["server"], cluster["certificate-authority-data"], TENANT, bound_pod=None,
                        manager="tenant", namespace=own)
