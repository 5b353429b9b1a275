"""`BoundJob`: a user's pod template run as a Kubernetes Job whose pods join a ComputeDomain.

The component adds what binding takes, so users write none of it: the pod-level claim reference
to the domain's one shared channel claim (`resourceClaims: [{name: channel, resourceClaimName:
<claim>}]`), each container's `resources.claims: [{name: channel}]`, and the GPU limit. Placement
inside one NVLink clique needs no affinity: the claim's allocation carries the clique's node
selector (docs/architecture.md, "DRA design").
"""

from __future__ import annotations

import copy
from typing import Any, Final

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from components._args import DNS_LABEL, ComponentArgsError, validate
from components._args import labels as nvl_labels
from components.computedomain import MAX_PODS_PER_DOMAIN, ComputeDomain

CLAIM_REF: Final = "channel"
GPUS_PER_NODE: Final = 4
GPUS_PER_CLIQUE: Final = 72
COMPUTE_DOMAIN_LABEL: Final = "nvlfabric.io/compute-domain"


class BoundJobArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_LABEL, max_length=52,
                      description="a DNS label of at most 52 characters (pod names add a suffix)")
    pod_template: dict[str, Any] = Field(
        description="a PodTemplateSpec as a dict: {'metadata': {...}, 'spec': {'containers': [{'name', 'image'}]}}")
    parallelism: int = Field(1, ge=1, le=MAX_PODS_PER_DOMAIN,
                             description=f"pods running at once, 1..{MAX_PODS_PER_DOMAIN} "
                                         "(a claim's reservedFor limit)")
    completions: int | None = Field(None, ge=1, description="pods that must succeed (default: parallelism)")
    gpus_per_pod: int = Field(GPUS_PER_NODE, ge=0, le=GPUS_PER_NODE,
                              description=f"GPUs per pod, 0..{GPUS_PER_NODE} "
                                          f"(a GB200 compute tray has {GPUS_PER_NODE})")
    gpu_resource: str | None = Field("nvidia.com/gpu",
                                     description="the extended resource GPUs are requested as; None requests none "
                                                 "(GPUs allocated by another DRA driver, or the simulator)")
    wait: bool = Field(False, description="wait for the Job to complete during `pulumi up`")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels of the Job")

    @field_validator("pod_template")
    @classmethod
    def _template(cls, tpl: dict[str, Any]) -> dict[str, Any]:
        spec = tpl.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
            raise ValueError("needs spec.containers: a non-empty list of containers")
        for i, c in enumerate(spec["containers"]):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                raise ValueError(f"spec.containers[{i}] needs a name and an image")
        if spec.get("restartPolicy") not in (None, "Never", "OnFailure"):
            raise ValueError("spec.restartPolicy of a Job's pods must be Never or OnFailure")
        if any(rc.get("name") == CLAIM_REF for rc in spec.get("resourceClaims") or []):
            raise ValueError(f"spec.resourceClaims already has an entry named {CLAIM_REF!r}, which BoundJob adds")
        return tpl

    @model_validator(mode="after")
    def _sizes(self) -> BoundJobArgs:
        if self.completions is not None and self.completions < self.parallelism:
            raise ValueError(f"completions ({self.completions}) must be >= parallelism ({self.parallelism})")
        if self.gpu_resource and self.parallelism * self.gpus_per_pod > GPUS_PER_CLIQUE:
            raise ValueError(
                f"parallelism x gpus_per_pod = {self.parallelism * self.gpus_per_pod} GPUs, more than one NVL72 "
                f"clique has ({GPUS_PER_CLIQUE}); a ComputeDomain lives in one clique: use fewer pods or GPUs per pod")
        return self


def job_manifest(args: BoundJobArgs, *, namespace: str, claim_name: Any, domain: str) -> dict[str, Any]:
    """The Job (a dict in the API's shape) with the claim and GPUs added (pure: tested without a cluster)."""
    tpl = copy.deepcopy(args.pod_template)
    meta = tpl.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), COMPUTE_DOMAIN_LABEL: domain,
                      "batch.kubernetes.io/job-name": args.name}
    spec = tpl["spec"]
    spec.setdefault("restartPolicy", "Never")
    spec["resourceClaims"] = [*(spec.get("resourceClaims") or []),
                              {"name": CLAIM_REF, "resourceClaimName": claim_name}]
    for c in spec["containers"]:
        res = c.setdefault("resources", {})
        claims = res.setdefault("claims", [])
        if not any(cl.get("name") == CLAIM_REF for cl in claims):
            claims.append({"name": CLAIM_REF})
        if args.gpu_resource and args.gpus_per_pod:
            res.setdefault("limits", {})[args.gpu_resource] = str(args.gpus_per_pod)
    # Deleting waits (foreground) until the Job's pods are gone, so the ComputeDomain, deleted
    # after its workloads, finds its channel no longer in use. Not waiting for completion is a
    # `waitFor` that the created Job already meets: `skipAwait` would skip the delete await too.
    annotations = {"pulumi.com/deletionPropagationPolicy": "foreground"}
    if not args.wait:
        annotations["pulumi.com/waitFor"] = "jsonpath={.metadata.uid}"
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": args.name, "namespace": namespace, "annotations": annotations,
                     "labels": nvl_labels("workload", {**args.labels, COMPUTE_DOMAIN_LABEL: domain})},
        "spec": {"parallelism": args.parallelism, "completions": args.completions or args.parallelism,
                 "completionMode": "Indexed", "backoffLimit": 0, "template": tpl},
    }


class BoundJob(pulumi.ComponentResource):
    """A batch/v1 Job whose pods all use `compute_domain`'s IMEX channel."""

    job_name: pulumi.Output[str]
    namespace: pulumi.Output[str]
    pods: pulumi.Output[int]
    claim_name: pulumi.Output[str]

    def __init__(self, resource_name: str, *, compute_domain: ComputeDomain, pod_template: dict[str, Any],
                 name: str | None = None, parallelism: int = 1, completions: int | None = None,
                 gpus_per_pod: int = GPUS_PER_NODE, gpu_resource: str | None = "nvidia.com/gpu",
                 wait: bool = False, labels: dict[str, str] | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        self.args = validate(BoundJobArgs, "BoundJob", resource_name, {
            "name": name if name is not None else resource_name, "pod_template": pod_template,
            "parallelism": parallelism, "completions": completions, "gpus_per_pod": gpus_per_pod,
            "gpu_resource": gpu_resource, "wait": wait, "labels": labels or {}})
        if not isinstance(compute_domain, ComputeDomain):
            raise ComponentArgsError(
                f"BoundJob {resource_name!r}: invalid arguments\n  compute_domain: expected a "
                f"components.ComputeDomain (got {type(compute_domain).__name__})")
        compute_domain.bind(self.args.name, self.args.parallelism)
        super().__init__("nvlfabric:index:BoundJob", resource_name, None, opts)
        m = job_manifest(self.args, namespace=compute_domain.namespace, claim_name=compute_domain.claim_name,
                         domain=compute_domain.name)
        self.job = k8s.batch.v1.Job(resource_name, metadata=m["metadata"], spec=m["spec"],
                                    opts=pulumi.ResourceOptions(parent=self, depends_on=[compute_domain]))
        given = self.args.name
        self.job_name = self.job.metadata.apply(lambda md: (md.name if md is not None else None) or given)
        self.namespace = pulumi.Output.from_input(compute_domain.namespace)
        self.pods = pulumi.Output.from_input(self.args.parallelism)
        self.claim_name = compute_domain.claim_name
        self.register_outputs({"job_name": self.job_name, "namespace": self.namespace, "pods": self.pods,
                               "claim_name": self.claim_name})
