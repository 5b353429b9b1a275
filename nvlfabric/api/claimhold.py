"""A ComputeDomain's hold on its channel claims: the `reservedFor` entry that keeps a claim allocated
between one set of its pods and the next.

kube-controller-manager deallocates a claim as soon as the last consumer in its reservedFor has
gone. A workload that recreates all its pods (a JobSet restart, an LWS group restart, a Job
deleted and made again by `pulumi up`) would then lose its channel and clique between its old
pods and its new ones, and come back wherever the scheduler found room, in a new IMEX domain.
So the controller also reserves each channel claim for the ComputeDomain itself, a consumer the
resourceclaim controller keeps (it only checks pods and pod groups), for as long as the domain
and claim exist; the provider's delete and the controller release it when the claim goes
(nvlfabric/controller/reservations.py). This module is the entry's one shape: making it,
recognising it, and the patch that takes it off.
"""

from __future__ import annotations

from typing import Any

from nvlfabric.api.computedomain import PLURAL
from nvlfabric.api.names import GROUP

__all__ = ["hold_consumer", "is_hold", "release_hold_patch"]


def hold_consumer(cd_name: str, cd_uid: str) -> dict[str, str]:
    """The `reservedFor` entry by which ComputeDomain `cd_name` holds its channel claim."""
    return {"apiGroup": GROUP, "resource": PLURAL, "name": cd_name, "uid": cd_uid}


def is_hold(consumer: dict[str, Any]) -> bool:
    """Whether a `reservedFor` entry is a ComputeDomain's hold (not a pod or a pod group)."""
    return consumer.get("apiGroup") == GROUP and consumer.get("resource") == PLURAL


def release_hold_patch(claim: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A JSON patch of the claim's status removing its domain's hold, applied only while the claim
    and that entry are as read; None when the claim has no hold."""
    meta, entries = claim.get("metadata") or {}, (claim.get("status") or {}).get("reservedFor") or []
    for i, consumer in enumerate(entries):
        if is_hold(consumer):
            return [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
                    {"op": "test", "path": f"/status/reservedFor/{i}/uid", "value": consumer.get("uid")},
                    {"op": "remove", "path": f"/status/reservedFor/{i}"}]
    return None
