"""Pods as the controller's tests make them (not a test module: the tests of the reconciler, the
reservation passes and the wiring share it)."""

from __future__ import annotations

from lightkube.models.core_v1 import Container, PodResourceClaim, PodSchedulingGate, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from nvlfabric.api.names import RESERVATION_GATE


def channel_pod(name: str, claim: str, where: str, *, gated: bool = False) -> Pod:
    """A pod using `claim` (a domain's shared channel claim) on the test nodes labelled
    `ctl-test=<where>`, optionally held by the reservation gate as BoundJob's pods are."""
    return Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"ctl-test": where}, terminationGracePeriodSeconds=0,
        schedulingGates=[PodSchedulingGate(name=RESERVATION_GATE)] if gated else None,
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=claim)],
        containers=[Container(name="w", image="registry.invalid/w:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))]))
