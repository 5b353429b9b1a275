"""ComputeDomains and their channel claims as the provider makes them, for controller tests on the
real API server."""

from __future__ import annotations

import contextlib
from typing import Any

from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api import computedomain as api
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim


def provider_domain(client: Client, name: str, spec: dict[str, Any] | None = None) -> str:
    """A ComputeDomain and its channel claim as the provider makes them (the claim's opaque channel
    config is what a strategic-merge patch of its status trips over); returns the claim's name."""
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec=spec or {}))
    body = channel_claim(name, "default", cd.metadata.uid, api.ComputeDomainSpec.model_validate(spec or {}))
    client.create(ResourceClaim.from_dict(body))
    return str(body["metadata"]["name"])


def remove_domain(client: Client, name: str, claim: str, pods: list[str]) -> None:
    """Delete what a test made of a domain, whatever of it exists."""
    for pod in pods:
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod, namespace="default", grace_period=0)
    with contextlib.suppress(ApiError):
        client.delete(ComputeDomainResource, name, namespace="default")
    with contextlib.suppress(ApiError):
        client.delete(ResourceClaim, claim, namespace="default")
