"""Fail a lost node's pods of a ComputeDomain, so that their workload replaces them (the rules of
who is lost: nodeloss.py).

A NotReady node's pods stay Running in the API until the taint manager evicts them (after their
tolerationSeconds, 300 s by default) and Terminating after that while their kubelet is away; a
deleted Node's pods wait for PodGC's 40 s quarantine. A replacement needs the old pod terminal
first (a Job with a podFailurePolicy replaces only terminal pods). So, as PodGC does for a pod on
a Node that is gone, the controller sets the pod's phase to Failed with the condition
DisruptionTarget (reason names.DISRUPTION_REASON) and deletes it: a terminal pod is deleted at
once, the resourceclaim controller drops it from the claim's reservedFor, and a BoundJob's Job,
whose podFailurePolicy ignores DisruptionTarget, creates the pod of the same index again without
counting a failure. The replacement is placed like every joining pod (reservations.py).

Before acting the Node is read again from the API server: a node that came back, or whose Node
merely left the informer's label selector, is not acted on. Only pods that name one of the
domain's channel claims are touched (the admission policy nvlfabric-controller-pods holds the
controller to that shape).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.controller")


def still_lost(client: Client, lost: api.LostNode) -> bool:
    """Whether the API server still says so: the Node is gone, NotReady, or its fabric unhealthy."""
    try:
        with api_call(f"read Node {lost.name}"):
            node = client.get(Node, lost.name)
    except errors.NotFound:
        return True
    if lost.reason is api.LostReason.NODE_DELETED:
        return False  # a Node of that name exists again
    conditions = {c.type: c.status for c in ((node.status.conditions if node.status else None) or [])}
    if lost.reason is api.LostReason.NODE_NOT_READY:
        return conditions.get("Ready") != "True"
    return conditions.get(names.FABRIC_CONDITION) == "False"


def fail_pods(client: Client, namespace: str, lost: api.LostNode, claims: Sequence[str], why: str) -> list[str]:
    """Fail and delete the pods on `lost`'s node that name one of `claims`; returns their names."""
    if not still_lost(client, lost):
        log.info("node %s is no longer lost (%s); its pods are left alone", lost.name, lost.reason)
        return []
    with api_call(f"list the pods on Node {lost.name}"):
        pods = list(client.list(Pod, namespace=namespace, fields={"spec.nodeName": lost.name}))
    wanted = set(claims)
    done = []
    stamp = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    for pod in pods:
        meta, spec, status = pod.metadata, pod.spec, pod.status
        if meta is None or spec is None or not meta.name:
            continue
        named = {rc.resourceClaimName for rc in spec.resourceClaims or [] if rc.resourceClaimName}
        ours = any(c.type == "DisruptionTarget" and c.reason == names.DISRUPTION_REASON
                   for c in (status.conditions if status else None) or [])
        ended = status is not None and status.phase in ("Succeeded", "Failed")
        if not named & wanted or (ended and not ours):
            continue  # (failed by us before, and its delete failed: deleted now)
        body = {"status": {"phase": "Failed", "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": names.DISRUPTION_REASON,
            "message": why[:1024], "lastTransitionTime": stamp}]}}
        try:
            if not ours:
                with api_call(f"fail pod {namespace}/{meta.name} of lost Node {lost.name}"):
                    client.patch(Pod.Status, meta.name, body, namespace=namespace, patch_type=PatchType.STRATEGIC)
            with api_call(f"delete pod {namespace}/{meta.name} of lost Node {lost.name}"):
                client.delete(Pod, meta.name, namespace=namespace)
        except errors.NotFound:
            continue  # gone meanwhile: what we wanted
        done.append(meta.name)
        log.warning("pod %s/%s on lost node %s (%s) failed as disrupted and deleted", namespace, meta.name,
                    lost.name, lost.reason)
    return done
