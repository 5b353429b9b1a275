"""nvlfabric's RBAC and ValidatingAdmissionPolicies from driver.yaml on the session's API server,
and how a test sees a policy refuse: for the admission policy tests and the tenants' tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Namespace

from nvlfabric import manifests
from nvlfabric.api import names
from nvlfabric.sim.cluster import eventually, install_crd

NAMESPACE = names.NAMESPACE
# What the tests install from driver.yaml: everything but the workloads (nothing would run them).
INSTALL = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
POLICIES = ("nvlfabric-agent-own-node", "nvlfabric-controller-slices", "nvlfabric-controller-pods",
            "nvlfabric-channel-claims", "nvlfabric-agent-certificates")
POLICY_EFFECTIVE_S = 30.0


def denied(action: Callable[[], Any]) -> str:
    """Run an action that the admission policy must refuse; return the refusal's message."""
    with pytest.raises(ApiError) as info:
        action()
    status = info.value.status
    assert status.code == 403 and "ValidatingAdmissionPolicy" in (status.message or ""), (status.code, status.message)
    return str(status.message)


def _refusal(exc: ApiError) -> str | None:
    """The admission policy's refusal message; None for RBAC's 403 (a grant or policy on its way);
    any other error raised again."""
    message = exc.status.message or ""
    if exc.status.code == 403 and "ValidatingAdmissionPolicy" in message:
        return message
    if exc.status.code == 403:
        return None
    raise exc


def policy_in_effect(dry_run: Callable[[], Any]) -> str:
    """Wait until a dry-run request the policy must refuse is refused by it (admitted, or refused by
    RBAC, means: not in effect yet); the refusal's message."""
    def refusal() -> str | None:
        try:
            dry_run()
        except ApiError as exc:
            return _refusal(exc)
        return None
    return eventually("the admission policy to come into effect", refusal, timeout=POLICY_EFFECTIVE_S)


def eventually_denied(action: Callable[[], Any]) -> str:
    """Like `denied`, while a fresh RBAC grant may still be on its way (RBAC refuses until then)."""
    def refusal() -> str | None:
        try:
            action()
        except ApiError as exc:
            return _refusal(exc)
        raise AssertionError("the request was admitted")
    return eventually("the admission policy to refuse the request", refusal, timeout=POLICY_EFFECTIVE_S)


def install_driver_objects(admin: Client) -> None:
    install_crd(admin)
    eventually(f"namespace {NAMESPACE} not to be terminating (a previous run's deletion)",
               lambda: _namespace_usable(admin))
    for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
        if obj.kind in INSTALL:
            admin.apply(obj, field_manager="nvlfabric-tests", force=True)


def _namespace_usable(admin: Client) -> bool:
    try:
        ns = admin.get(Namespace, NAMESPACE)
    except ApiError as exc:
        return exc.status.code == 404
    return ns.metadata is None or ns.metadata.deletionTimestamp is None


def remove_policies(admin: Client) -> None:
    for name in POLICIES:
        with contextlib.suppress(ApiError):
            admin.delete(ValidatingAdmissionPolicyBinding, name)
        with contextlib.suppress(ApiError):
            admin.delete(ValidatingAdmissionPolicy, name)
