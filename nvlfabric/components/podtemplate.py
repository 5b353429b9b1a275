"""The user's pod template bound to a ComputeDomain (pure): the domain's claim, the GPU limit, the
reservation gate or the PodGroup, the racks' tolerations and, on NVIDIA's backend, the affinity that
keeps a job in one clique.
"""

from __future__ import annotations

import copy
from typing import Any

from nvlfabric.api.names import (
    CLIQUE_GROUP_ANNOTATION,
    COMPUTE_DOMAIN_LABEL,
    GROUP_SIZE_ANNOTATION,
    POD_GROUP_ANNOTATION,
    RESERVATION_GATE,
    WORKLOAD_LABEL,
)
from nvlfabric.api.nvidia import CLIQUE_LABEL as NVIDIA_CLIQUE_LABEL
from nvlfabric.api.nvidia import Backend
from nvlfabric.components import program
from nvlfabric.components.templatechecks import CLAIM_REF
from nvlfabric.components.workloadargs import BATCH_KINDS, BoundJobArgs


def tolerating(tpl: dict[str, Any], taints: list[dict[str, str]]) -> dict[str, Any]:
    """`tpl` with a toleration for each of `taints` it does not tolerate yet (pure): the taints the
    program's racks put on their Nodes, which the job's pods must tolerate to run there."""
    out = copy.deepcopy(tpl)
    spec = out["spec"]
    have = list(spec.get("tolerations") or [])
    added = [{"key": t["key"], "operator": "Equal", "value": t.get("value", ""), "effect": t["effect"]}
             for t in taints if not program.tolerates(have, t)]
    if added:
        spec["tolerations"] = [*have, *added]
    return out


def bound_pod_template(args: BoundJobArgs, *, claim_name: Any, domain: str, group: int | None = None,
                       pod_group: str | None = None) -> dict[str, Any]:
    """The user's pod template with the domain's claim and the GPUs added (pure); `group`: the
    clique group of a MultiClique domain these pods form; `pod_group`: the PodGroup they belong
    to when Kubernetes schedules them (then the gate stays only for a multi-clique job's ranks)."""
    tpl = copy.deepcopy(args.pod_template)
    meta = tpl["metadata"] = tpl.get("metadata") or {}
    meta["labels"] = {**(meta.get("labels") or {}), COMPUTE_DOMAIN_LABEL: domain}
    meta["annotations"] = {**(meta.get("annotations") or {}), GROUP_SIZE_ANNOTATION: str(args.gang_size),
                           **({CLIQUE_GROUP_ANNOTATION: str(group)} if group is not None else {})}
    spec = tpl["spec"]
    spec.setdefault("restartPolicy", "Never" if args.kind in BATCH_KINDS else "Always")
    ref = "resourceClaimTemplateName" if args.backend is Backend.NVIDIA else "resourceClaimName"
    spec["resourceClaims"] = [*(spec.get("resourceClaims") or []), {"name": CLAIM_REF, ref: claim_name}]
    if args.backend is Backend.NVIDIA and args.one_clique:
        _keep_in_one_clique(spec, {COMPUTE_DOMAIN_LABEL: domain, WORKLOAD_LABEL: args.name})
    gates = spec.get("schedulingGates") or []
    if pod_group is not None:
        spec["schedulingGroup"] = {"podGroupName": pod_group}
        meta["annotations"][POD_GROUP_ANNOTATION] = pod_group  # what the driver's policy sets it from
    gated = args.gated and (pod_group is None or args.clique_groups > 1)
    if gated and not any(g.get("name") == RESERVATION_GATE for g in gates):
        spec["schedulingGates"] = [*gates, {"name": RESERVATION_GATE}]
    gpu_container = args.gpu_container or spec["containers"][0]["name"]
    for c in spec["containers"]:
        res = c["resources"] = c.get("resources") or {}  # (null is as good as absent)
        claims = res["claims"] = res.get("claims") or []
        if not any(cl.get("name") == CLAIM_REF for cl in claims):
            claims.append({"name": CLAIM_REF})
        if args.gpu_resource and args.gpus_per_pod and c["name"] == gpu_container:
            # One container holds the pod's GPUs: on every container (a sidecar too) a pod of
            # gpus_per_pod would ask for that many times more.
            res["limits"] = {**(res.get("limits") or {}), args.gpu_resource: str(args.gpus_per_pod)}
    return tpl


def _keep_in_one_clique(spec: dict[str, Any], selector: dict[str, str]) -> None:
    """Add to the pod spec a required pod affinity among the job's pods on NVIDIA's clique label
    (the user's own affinity terms kept): NVIDIA's driver lets a domain's pods land anywhere."""
    affinity = spec["affinity"] = dict(spec.get("affinity") or {})
    pod_affinity = affinity["podAffinity"] = dict(affinity.get("podAffinity") or {})
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    pod_affinity[key] = [*(pod_affinity.get(key) or []),
                         {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": NVIDIA_CLIQUE_LABEL}]
