"""Channel claims as the provider and the scheduler would make them, for driving one node agent
directly: a ComputeDomain, its claim (spec, owner, opaque config), allocated by the real scheduler
for a pod or written as allocated without one, and their removal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.models.resource_v1 import (
    DeviceClaim,
    DeviceClaimConfiguration,
    DeviceRequest,
    ExactDeviceRequest,
    OpaqueDeviceConfiguration,
    ResourceClaimSpec,
)
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import computedomain as cdapi
from nvlfabric.api import names
from nvlfabric.api.channelconfig import ChannelConfig, ComputeDomainRef
from nvlfabric.api.names import CLIQUE_LABEL, DEVICE_CLASS, DRIVER
from nvlfabric.sim.agenthost import Host
from nvlfabric.sim.cluster import eventually

ComputeDomainResource = create_namespaced_resource(names.GROUP, cdapi.VERSION, cdapi.KIND, cdapi.PLURAL)


@dataclass(frozen=True)
class Claim:
    """A claim as the kubelet names it to the agent."""

    namespace: str
    name: str
    uid: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _uid(obj: Any) -> str:
    """The UID the API server gave `obj` (a created object always has one)."""
    assert obj.metadata is not None and obj.metadata.uid is not None, f"{obj!r} has no UID"
    return str(obj.metadata.uid)


def claim_spec(parameters: object) -> ResourceClaimSpec:
    """A channel claim of our DeviceClass with `parameters` as its opaque config: anything, not only
    a mapping, since the agent must refuse malformed configs (the model does not check)."""
    return ResourceClaimSpec(devices=DeviceClaim(
        requests=[DeviceRequest(name="channel", exactly=ExactDeviceRequest(deviceClassName=DEVICE_CLASS))],
        config=[DeviceClaimConfiguration(opaque=OpaqueDeviceConfiguration(
            driver=DRIVER, parameters=cast("dict[str, Any]", parameters)))]))


def compute_domain(client: Client, name: str, namespace: str = "default") -> ChannelConfig:
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace=namespace), spec={}))
    return ChannelConfig(compute_domain=ComputeDomainRef(name=name, namespace=namespace, uid=_uid(cd)))


def claim_meta(name: str, namespace: str, parameters: object, labels: dict[str, str] | None = None,
               owner: ComputeDomainRef | None = None) -> ObjectMeta:
    """A channel claim's metadata as the provider writes it: owned (a controller reference) by
    `owner`, else by the ComputeDomain its configuration names, when it names one (the agent
    prepares no other claim; an owner that does not exist has the garbage collector delete it)."""
    cd = owner.model_dump() if owner is not None else \
        parameters.get("computeDomain") if isinstance(parameters, dict) else None
    owners = [OwnerReference(apiVersion=cdapi.API_VERSION, kind=cdapi.KIND, name=str(cd.get("name")),
                             uid=str(cd.get("uid")), controller=True)] \
        if isinstance(cd, dict) and cd.get("name") and cd.get("uid") else None
    return ObjectMeta(name=name, namespace=namespace, labels=labels, ownerReferences=owners)


def scheduled_claim(client: Client, host: Host, name: str, parameters: object | None = None,
                    namespace: str = "default") -> Claim:
    """A ComputeDomain's shared claim allocated by the real scheduler for a pod on `host` (as the
    provider makes them); `parameters` replaces the opaque config (default: the CD's valid one)."""
    config = compute_domain(client, name, namespace)
    params = config.to_kube() if parameters is None else parameters
    claim = client.create(ResourceClaim(metadata=claim_meta(f"{name}-channel", namespace, params),
                                        spec=claim_spec(params)))
    client.create(Pod(metadata=ObjectMeta(name=f"{name}-0", namespace=namespace), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": host.node.name},
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{name}-channel")],
        containers=[Container(name="w", image="registry.invalid/w:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
    return Claim(namespace, f"{name}-channel", _uid(claim))


def allocated_claim(client: Client, host: Host, name: str, parameters: object, *, channel: int,
                    namespace: str = "default", labels: dict[str, str] | None = None,
                    owner: ComputeDomainRef | None = None) -> Claim:
    """A claim allocated without a pod: its status written as the scheduler would (admin only).
    Much faster than scheduling a pod per claim; the agent reads nothing else. `owner`: its
    ComputeDomain when `parameters` may not name it (a fuzzed configuration)."""
    claim = client.create(ResourceClaim(metadata=claim_meta(name, namespace, parameters, labels, owner),
                                        spec=claim_spec(parameters)))
    client.patch(ResourceClaim.Status, name, {"status": {"allocation": allocation(host, channel, parameters)}},
                 namespace=namespace, patch_type=PatchType.MERGE)
    return Claim(namespace, name, _uid(claim))


def allocation(host: Host, channel: int, parameters: object) -> dict[str, object]:
    """`status.allocation` of a claim given `channel` of the host's clique pool, with the claim's
    opaque config, as the scheduler writes it."""
    return {"devices": {
        "results": [{"request": "channel", "driver": DRIVER, "pool": names.pool_name(host.clique),
                     "device": names.channel_device(channel)}],
        "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": CLIQUE_LABEL, "operator": "In", "values": [host.clique]}]}]}}


def wait_allocated(client: Client, claims: Sequence[Claim], timeout: float = 120) -> None:
    for c in claims:
        def allocated(c: Claim = c) -> object:
            status = client.get(ResourceClaim, c.name, namespace=c.namespace).status
            return status.allocation if status else None

        eventually(f"claim {c.ref} to be allocated", allocated, timeout=timeout)


def delete_domain(client: Client, name: str, namespace: str = "default") -> None:
    """The domain's pod, claim and ComputeDomain (as scheduled_claim made them), those that exist."""
    with contextlib.suppress(ApiError):
        client.delete(Pod, f"{name}-0", namespace=namespace, grace_period=0)
    with contextlib.suppress(ApiError):
        client.delete(ResourceClaim, f"{name}-channel", namespace=namespace)
    with contextlib.suppress(ApiError):
        client.delete(ComputeDomainResource, name, namespace=namespace)
