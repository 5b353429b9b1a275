"""Kubernetes' scheduling objects of a BoundJob that Kubernetes schedules (pure): its Workload, over
several cliques its CompositePodGroup, and one PodGroup per clique group with the group's channel
claim as a pod-group claim.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from nvlfabric.api.names import CLIQUE_LABEL, COMPOSITE_GROUP_TEMPLATE, POD_GROUP_TEMPLATE
from nvlfabric.clusterview.scheduling import WorkloadApis
from nvlfabric.components.templatechecks import CLAIM_REF
from nvlfabric.components.workloadargs import BoundJobArgs

SCHEDULING_KINDS: Final = ("Workload", "CompositePodGroup", "PodGroup")


def pod_group_name(args: BoundJobArgs, group: int) -> str:
    """The PodGroup of clique group `group`: the job's own name over one clique, else `<name>-<g>`."""
    return args.name if args.clique_groups == 1 else f"{args.name}-{group}"


def pod_group_manifests(args: BoundJobArgs, *, namespace: str, claims: list[Any], apis: WorkloadApis,
                        labels: dict[str, str]) -> list[dict[str, Any]]:
    """Kubernetes' scheduling objects of the job (pure): a Workload with a gang template of one
    clique group (topology: the clique label), over several cliques inside a composite template
    whose gang is all the groups, then the CompositePodGroup and one PodGroup per group, each with
    its group's channel claim as a pod-group claim."""
    n, k = args.group_size, args.clique_groups
    template = {"name": POD_GROUP_TEMPLATE, "schedulingPolicy": {"gang": {"minCount": n}},
                "schedulingConstraints": {"topology": [{"key": CLIQUE_LABEL}]}}

    def meta(name: str) -> dict[str, Any]:
        # Nothing to await: a group is scheduled when its pods exist, after the objects are made.
        return {"name": name, "namespace": namespace, "labels": labels, "annotations": {"pulumi.com/skipAwait": "true"}}

    if k == 1:
        spec: dict[str, Any] = {"podGroupTemplates": [template]}
    else:
        spec = {"podGroupTemplates": [], "compositePodGroupTemplates": [{
            "name": COMPOSITE_GROUP_TEMPLATE, "schedulingPolicy": {"gang": {"minGroupCount": k}},
            "podGroupTemplates": [template]}]}
    out = [{"apiVersion": apis.workload, "kind": "Workload", "metadata": meta(args.name), "spec": spec}]
    if k > 1:
        if apis.composite is None:
            raise ValueError("a job over several cliques needs CompositePodGroup, which the cluster does not serve")
        out.append({"apiVersion": apis.composite, "kind": "CompositePodGroup", "metadata": meta(args.name), "spec": {
            "workloadRef": {"workloadName": args.name, "templateName": COMPOSITE_GROUP_TEMPLATE},
            "schedulingPolicy": {"gang": {"minGroupCount": k}}}})
    for g, claim in enumerate(claims):
        group = {"workloadRef": {"workloadName": args.name, "templateName": POD_GROUP_TEMPLATE},
                 **({"parentCompositePodGroupName": args.name} if k > 1 else {}),
                 "schedulingPolicy": template["schedulingPolicy"],
                 "schedulingConstraints": template["schedulingConstraints"],
                 "resourceClaims": [{"name": CLAIM_REF, "resourceClaimName": claim}]}
        out.append({"apiVersion": apis.pod_group, "kind": "PodGroup", "metadata": meta(pod_group_name(args, g)),
                    "spec": copy.deepcopy(group)})
    return out
