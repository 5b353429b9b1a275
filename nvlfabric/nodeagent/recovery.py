"""The rebuild of a lost checkpoint from the API server and the disk.

A checkpoint moved aside as corrupt, lost with its directory or deleted by hand forgets claims whose
files are still here. A claim a pod on this node still holds is validated like a prepare and recorded
as completed (its files rewritten; housekeeping then starts its IMEX domain), so the kubelet's
unprepare later finds it; any other CDI spec is removed. Then channel nodes no claim uses go: the
agent is their only creator, so an unused one is a leftover.
"""

from __future__ import annotations

import logging
from typing import Any

from nvlfabric.api import errors
from nvlfabric.api.kubelet.types import ClaimRef
from nvlfabric.nodeagent import cdi, checkpoint, claims, kubeapi
from nvlfabric.nodeagent.claims import NodeIdentity, PrepareError
from nvlfabric.nodeagent.kubeapi import Client
from nvlfabric.nodeagent.prepared import PreparedClaims

__all__ = ["held_here", "recover"]

log = logging.getLogger("nvlfabric.nodeagent.driver")  # the driver's log: its lines keep their logger name


def held_here(client: Client, node_name: str, claim: dict[str, Any]) -> bool:
    """A pod on this node is among the claim's consumers, itself or through its PodGroup (a claim
    Kubernetes reserved for a whole pod group)."""
    namespace = (claim.get("metadata") or {}).get("namespace", "")
    for consumer in (claim.get("status") or {}).get("reservedFor") or []:
        if consumer.get("resource") == "podgroups" and consumer.get("name"):
            if _group_here(client, node_name, namespace, consumer["name"]):
                return True
            continue
        if consumer.get("resource") != "pods" or not consumer.get("name"):
            continue
        try:
            pod = client.get(kubeapi.path("v1", "pods", consumer["name"], namespace=namespace))
        except errors.NotFound:
            continue
        if (pod.get("spec") or {}).get("nodeName") == node_name and \
                (pod.get("metadata") or {}).get("uid") == consumer.get("uid"):
            return True
    return False


def _group_here(client: Client, node_name: str, namespace: str, group: str) -> bool:
    pods = client.list(kubeapi.path("v1", "pods", namespace=namespace), field_selector=f"spec.nodeName={node_name}")
    return any(((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") == group for p in pods)


def recover(client: Client, node: NodeIdentity, prepared: PreparedClaims) -> None:
    """Adopt or remove the claims whose CDI spec is on disk but not in the checkpoint, then sweep
    unused channel nodes (module doc). API errors propagate: the caller tries again later."""
    known = {e.uid for e in prepared.state.claims}
    orphans = [uid for uid in cdi.claim_spec_uids(prepared.paths.cdi_dir) if uid not in known]
    adopted, removed = [], []
    if orphans:
        live = {(c.get("metadata") or {}).get("uid"): c
                for c in client.list(kubeapi.path(claims.RESOURCE_API, "resourceclaims"))}
        for uid in orphans:
            claim = live.get(uid)
            meta = (claim or {}).get("metadata") or {}
            ref = ClaimRef(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=uid)
            try:
                if claim is None or not held_here(client, node.name, claim):
                    raise PrepareError("no pod on this node holds it")
                valid = claims.validate(ref, claim, node)
                allocation = claims.allocation_of(ref, valid.pool, valid.device, valid.config)
                prepared.adopt(checkpoint.ClaimRef(uid=uid, namespace=ref.namespace, name=ref.name), allocation)
                adopted.append(uid)
            except (PrepareError, checkpoint.CheckpointError, ValueError) as exc:
                cdi.remove_claim_spec(prepared.paths.cdi_dir, uid)
                removed.append(f"{uid} ({exc})")
    swept = prepared.sweep_channel_nodes()
    if adopted or removed or swept:
        log.warning("checkpoint rebuilt from the API server: %d claim(s) adopted (%s), %d CDI spec(s) removed "
                    "(%s), %d unused channel node(s) removed (%s)", len(adopted), ", ".join(adopted) or "-",
                    len(removed), "; ".join(removed) or "-", len(swept), ", ".join(map(str, swept)) or "-")
