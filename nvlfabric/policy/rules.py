"""The policy pack's rules, as pure functions (what `pack/__main__.py` registers).

- `bound-workloads-request-gpus`: every workload a BoundJob creates asks for GPUs on some
  container; a GPU-less bound workload (gpu_resource=None) is spread over nodes by nothing, so a
  domain's numNodes may never be reached.
- `no-force-delete`: no ComputeDomain has force_delete set: it deletes the domain (and its channel
  claim) while pods still use it.
- `channels-within-the-driver`: the program's ComputeDomains do not need more channels than the
  declared racks have (each clique group takes one channel of one clique's pool, whose size is the
  driver's channels_per_clique, CHANNELS_PER_CLIQUE on its controller).

A rule that needs the preview's operation (say, "no domain replaced while its pods run") cannot be
one: the policy SDK shows a policy the resource's new properties, not whether it is replaced. The
impact report (`nvlfabric preview-report`) shows replaces with the pods they disrupt instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nvlfabric.api.names import (
    COMPUTE_DOMAIN_LABEL,
    COMPUTE_DOMAIN_TYPES,
    GPU_RESOURCE,
    RACK_LABEL,
    RACK_NODES_TYPES,
)

DOMAIN_TYPES = COMPUTE_DOMAIN_TYPES
WORKLOAD_TEMPLATES = {
    "kubernetes:batch/v1:Job": ("spec", "template"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template"),
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": ("spec", "leaderWorkerTemplate", "workerTemplate"),
}
GPU = GPU_RESOURCE


def _at(obj: Any, path: Iterable[str]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def bound_workload_without_gpus(resource_type: str, props: Mapping[str, Any]) -> str | None:
    """Why a bound workload breaks `bound-workloads-request-gpus`, or None."""
    labels = _at(props, ("metadata", "labels")) or {}
    if resource_type not in WORKLOAD_TEMPLATES or COMPUTE_DOMAIN_LABEL not in labels:
        return None
    containers = _at(props, (*WORKLOAD_TEMPLATES[resource_type], "spec", "containers")) or []
    if any(GPU in ((c.get("resources") or {}).get("limits") or {}) for c in containers if isinstance(c, Mapping)):
        return None
    name = _at(props, ("metadata", "name"))
    domain = labels[COMPUTE_DOMAIN_LABEL]
    return (f"{resource_type.rsplit(':', 1)[-1]} {name} is bound to ComputeDomain {domain} but no container "
            f"asks for {GPU}: nothing spreads its pods over the nodes, so the domain's numNodes may never be "
            "reached; give the BoundJob gpus_per_pod (and leave gpu_resource set)")


def force_deleted_domain(resource_type: str, props: Mapping[str, Any]) -> str | None:
    """Why a domain breaks `no-force-delete`, or None."""
    if resource_type in DOMAIN_TYPES and props.get("force_delete"):
        return (f"ComputeDomain {props.get('namespace') or 'default'}/{props.get('name')} has force_delete=True: "
                "deleting it would take the channel from running pods; delete its workloads first instead")
    return None


def channel_shortfall(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> str | None:
    """Why the stack breaks `channels-within-the-driver`, or None (nothing to judge without the
    driver's setting or the racks in the program)."""
    per_clique, racks, groups = None, set(), 0
    for resource_type, props in resources:
        if resource_type == "kubernetes:apps/v1:Deployment" and _at(props, ("metadata", "name")) == \
                "nvlfabric-controller":
            for c in _at(props, ("spec", "template", "spec", "containers")) or []:
                for e in c.get("env") or []:
                    if e.get("name") == "CHANNELS_PER_CLIQUE":
                        per_clique = int(e.get("value") or 0)
        elif resource_type in RACK_NODES_TYPES:
            rack = (props.get("labels") or {}).get(RACK_LABEL)
            if rack:
                racks.add(rack)
        elif resource_type == "kubernetes:core/v1:NodePatch":  # racks of releases before 0.2
            rack = (_at(props, ("metadata", "labels")) or {}).get(RACK_LABEL)
            if rack:
                racks.add(rack)
        elif resource_type in DOMAIN_TYPES and props.get("backend") != "nvidia":  # NVIDIA's: channel 0, no pool
            groups += int(_at(props, ("spec", "placement", "cliques")) or 1)
    if per_clique is None or not racks or groups <= per_clique * len(racks):
        return None
    return (f"the program's ComputeDomains need {groups} channels (one per clique group), but its {len(racks)} "
            f"rack(s) have {per_clique * len(racks)} ({per_clique} per clique: NvlfabricDriver channels_per_clique); "
            "the rest would wait Pending (ChannelPoolExhausted): raise channels_per_clique, or declare more racks")
