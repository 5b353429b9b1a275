"""`BoundJob`: a user's pod template run as a workload whose pods all join a ComputeDomain.

The component adds what binding takes, so users write none of it: the pod-level claim reference
to the domain's one shared channel claim (`resourceClaims: [{name: channel, resourceClaimName:
<claim>}]`), each container's `resources.claims: [{name: channel}]`, the GPU limit, and the
scheduling gate `nvlfabric.io/channel-reservation`, which nvlfabric's controller lifts once the pod
is reserved on the claim (nvlfabric/controller/reservations.py). Placement inside one NVLink clique needs no
affinity: the claim's allocation carries the clique's node selector (docs/architecture.md, "DRA
design").

It also adds what a distributed launcher needs (nvlfabric/api/names.py, "a distributed launcher's
environment"): each container gets the pod's rank (the kind's own pod index, through the downward
API), the world size, rank 0's stable DNS name and a port, as NVLFABRIC_* and PyTorch's names,
ahead of the user's env (which may refer to them, and whose own entries of those names win). Pods
get stable DNS names from a headless Service: BoundJob's own for a Job or a StatefulSet; JobSet
and LeaderWorkerSet make theirs.

The workload's shape (`kind`):
- `Job` (default): an Indexed batch/v1 Job of `parallelism` pods;
- `StatefulSet`: apps/v1, `parallelism` replicas started in parallel (all members must come up
  together), with the headless Service it needs for stable pod names;
- `JobSet` (jobset.x-k8s.io/v1alpha2): one replicated Job of `parallelism` Indexed pods;
- `LeaderWorkerSet` (leaderworkerset.x-k8s.io/v1): one group of `parallelism` pods, the leader
  from the same template.
JobSet and LeaderWorkerSet need their controllers in the cluster (they are not part of
Kubernetes); the component creates the object with the binding inside, and at preview asks the
cluster whether it serves the kind (`cluster_serves`): where it does not, a warning, and `up`
stops. A JobSet's `max_restarts` is its failure policy: all its Jobs recreated, the new pods on
the same claims (and so the same cliques and channels).

Over a MultiClique ComputeDomain (`placement.cliques: K`) the job is K groups of parallelism / K
pods, group g's pods using the domain's claim g: K Indexed Jobs or StatefulSets `<name>-<g>`, or
one JobSet with K replicated Jobs `workers-<g>` (a LeaderWorkerSet's groups share one template,
so it cannot), one headless Service `<name>` over all of them. The controller places the groups
all at once, each in a clique of its own, and writes each pod's rank in the whole job
(`nvlfabric.io/rank`, from the group and the pod's index) as it lifts the pod's gate, which
NVLFABRIC_RANK reads; so such a job needs the reservation gate.

On a ComputeDomain of NVIDIA's backend (nvlfabric/api/nvidia.py) the pods reference the
ResourceClaimTemplate NVIDIA's controller makes (`resourceClaimTemplateName`), as NVIDIA documents
for workloads: each pod gets a claim of its own, so neither the 256-pod nor the one-clique limit
of a shared claim applies. NVIDIA's driver places nothing, so the component keeps a job whose GPUs
fit one NVL72 clique in one clique by required pod affinity on NVIDIA's clique label
(`nvidia.com/gpu.clique`, written by GPU Feature Discovery), the recipe NVIDIA gives; a bigger job
spans cliques, one IMEX domain per clique. Nothing of nvlfabric's controller runs there: no
reservation gate, no Workload or PodGroups (kube-scheduler places the pods alone).

Queued by Kueue (`queue_name`): the Job or JobSet carries Kueue's queue label, Kueue suspends it
at creation and admits it whole by quota and, with nvlfabric's AdmissionCheck in its
ClusterQueue, only once nvlfabric's controller has placed every group (controller/admission.py);
over a MultiClique domain only a JobSet, which is one Kueue workload.

Who places the groups (`scheduler`): where the cluster offers Kubernetes' own workload scheduling
(1.37's Workload, PodGroup and CompositePodGroup with their gates on; nvlfabric/provider/scheduling.py
checks at preview), the component declares it and kube-scheduler places each clique group as a
gang constrained to one clique, the whole job as a gang of its groups, with each group's channel
claim reserved for its PodGroup rather than for each pod (no per-pod `reservedFor` entry). The
pods then carry `spec.schedulingGroup` and, over one clique, no gate; over several, the gate
stays, for the controller to write the ranks (it places nothing then). Elsewhere nvlfabric's
controller places, as above.
"""

from __future__ import annotations

import copy
from typing import Any, Final, Literal

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvlfabric.api.names import (
    CLIQUE_GROUP_ANNOTATION,
    CLIQUE_LABEL,
    COMPOSITE_GROUP_TEMPLATE,
    COMPUTE_DOMAIN_LABEL,
    DEFAULT_MASTER_PORT,
    DNS_LABEL,
    GPUS_PER_CLIQUE,
    GPUS_PER_NODE,
    GROUP_SIZE_ANNOTATION,
    JOB_COMPLETION_INDEX,
    KUEUE_API_VERSION,
    KUEUE_QUEUE_LABEL,
    LWS_LEADER_ADDRESS_ENV,
    LWS_WORKER_INDEX,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    MAX_CLIQUES_PER_DOMAIN,
    MAX_PODS_PER_CLAIM,
    PLACEMENT_CHECK_CONTROLLER,
    POD_GROUP_ANNOTATION,
    POD_GROUP_TEMPLATE,
    RANK_ANNOTATION,
    RANK_ENV,
    RESERVATION_GATE,
    STATEFULSET_POD_INDEX,
    TORCH_MASTER_ADDR_ENV,
    TORCH_MASTER_PORT_ENV,
    TORCH_RANK_ENVS,
    TORCH_WORLD_SIZE_ENV,
    WORKLOAD_LABEL,
    WORLD_SIZE_ENV,
)
from nvlfabric.api.nvidia import CLIQUE_LABEL as NVIDIA_CLIQUE_LABEL
from nvlfabric.api.nvidia import Backend
from nvlfabric.components import capacity, program
from nvlfabric.components._args import ComponentArgsError, validate
from nvlfabric.components._args import labels as nvl_labels
from nvlfabric.components.computedomain import ComputeDomain
from nvlfabric.provider import discovery, kube, scheduling
from nvlfabric.provider.scheduling import WorkloadApis

CLAIM_REF: Final = "channel"
NOT_AWAITED: Final = {"pulumi.com/skipAwait": "true", "pulumi.com/deletionPropagationPolicy": "background"}
"""A Job or StatefulSet that `pulumi up` does not wait for (wait=False). Not `waitFor` on a field
the created object already has: pulumi-kubernetes' refresh still runs its own readiness check of
these two kinds (a Job: complete; a StatefulSet: every replica ready), records a running Job as
"failed to initialize", and every `preview` after a `refresh` then showed it as an update with an
empty diff. skipAwait skips that check too, and the delete await as well (for these two kinds),
so deletion is in the background (the Job object goes at once: a replacement of the same name is
created right after it) and the ComputeDomain, deleted after its workloads, waits for their pods
to stop (nvlfabric/provider/computedomain.py)."""
WorkloadKind = Literal["Job", "StatefulSet", "JobSet", "LeaderWorkerSet"]
Scheduler = Literal["auto", "nvlfabric", "kubernetes"]
#: What `scheduler: kubernetes` assumes of a cluster it could not read at preview (1.37's versions).
DEFAULT_WORKLOAD_APIS: Final = WorkloadApis("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1beta1",
                                            "scheduling.k8s.io/v1alpha3")
#: Kinds whose pods run to completion (restartPolicy Never/OnFailure); the others keep running (Always).
BATCH_KINDS: Final = ("Job", "JobSet")
JOBSET_API: Final = "jobset.x-k8s.io/v1alpha2"
LWS_API: Final = "leaderworkerset.x-k8s.io/v1"
JOBSET_REPLICATED_JOB: Final = "workers"
#: The kinds whose controllers are not part of Kubernetes: their API, resource, project and the
#: simulator's addon that runs them (`nvlfabric-sim up --addons ...`).
CONTROLLED_KINDS: Final[dict[str, tuple[str, str, str, str]]] = {
    "JobSet": (JOBSET_API, "jobsets", "JobSet (https://jobset.sigs.k8s.io)", "jobset"),
    "LeaderWorkerSet": (LWS_API, "leaderworkersets", "LeaderWorkerSet (https://lws.sigs.k8s.io)", "lws"),
}
MAX_JOBSET_RESTARTS: Final = 1000
#: Where each kind keeps a pod's index, read into the rank through the downward API. A JobSet's
#: one replicated Job has one replica, so its pods' completion indexes are already global ranks.
RANK_FIELD: Final[dict[str, str]] = {
    "Job": f"metadata.annotations['{JOB_COMPLETION_INDEX}']",
    "JobSet": f"metadata.annotations['{JOB_COMPLETION_INDEX}']",
    "StatefulSet": f"metadata.labels['{STATEFULSET_POD_INDEX}']",
    "LeaderWorkerSet": f"metadata.labels['{LWS_WORKER_INDEX}']",
}


class BoundJobArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_LABEL, max_length=52,
                      description="a DNS label of at most 52 characters (pod names add a suffix)")
    kind: WorkloadKind = Field("Job", description="the workload's shape: Job (default), StatefulSet, JobSet or "
                                                  "LeaderWorkerSet (the last two need their controllers)")
    pod_template: dict[str, Any] = Field(
        description="a PodTemplateSpec as a dict: {'metadata': {...}, 'spec': {'containers': [{'name', 'image'}]}}")
    parallelism: int = Field(1, ge=1, le=MAX_PODS_PER_CLAIM * MAX_CLIQUES_PER_DOMAIN,
                             description=f"pods running at once, 1..{MAX_PODS_PER_CLAIM} per clique group "
                                         "(a claim's reservedFor limit; a MultiClique domain has a claim per group)")
    completions: int | None = Field(None, ge=1, description="pods that must succeed (default: parallelism; "
                                                            "Job and JobSet only)")
    gpus_per_pod: int = Field(GPUS_PER_NODE, ge=0, le=GPUS_PER_NODE,
                              description=f"GPUs per pod, 0..{GPUS_PER_NODE} "
                                          f"(a GB200 compute tray has {GPUS_PER_NODE})")
    gpu_resource: str | None = Field("nvidia.com/gpu",
                                     description="the extended resource GPUs are requested as; None requests none "
                                                 "(GPUs allocated by another DRA driver). Without GPU requests "
                                                 "nothing spreads the pods over nodes: a domain's numNodes may "
                                                 "then never be reached")
    max_restarts: int = Field(0, ge=0, le=MAX_JOBSET_RESTARTS,
                              description="JobSet only: how often JobSet recreates all its Jobs after one fails "
                                          "(its failurePolicy, each old pod gone before the new ones start); the "
                                          "ComputeDomain, its claims and channels stay, and the new pods join the "
                                          "same IMEX domain (default 0: the first failure fails the JobSet)")
    queue_name: str | None = Field(None, pattern=DNS_LABEL, max_length=63,
                                   description="Kueue: the LocalQueue of the workload's namespace that queues it "
                                               f"(the label {KUEUE_QUEUE_LABEL}); Kueue admits the whole job at "
                                               "once, by quota and, where its ClusterQueue lists an AdmissionCheck "
                                               f"of controllerName {PLACEMENT_CHECK_CONTROLLER}, once nvlfabric "
                                               "can place every group. Job and JobSet; over a MultiClique domain "
                                               "JobSet only (one Kueue workload for all the groups)")
    wait: bool = Field(False, description="during `pulumi up`, wait for a Job to complete, for the other kinds "
                                          "until every pod is ready")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels of the Job")
    reservation_gate: bool | None = Field(None, description=f"hold each pod with the scheduling gate "
                                                            f"{RESERVATION_GATE} until nvlfabric's controller has "
                                                            "reserved the domain's channel claim for it, so the pods "
                                                            "do not race on the shared claim; False leaves scheduling "
                                                            "to kube-scheduler alone (default: True, and False on "
                                                            "backend nvidia, which has no such controller)")
    gpu_container: str | None = Field(None, description="the container that gets the pod's GPU limit (default: the "
                                                         "first; sidecars and the others get the channel only)")
    master_port: int = Field(DEFAULT_MASTER_PORT, ge=1, le=65535,
                             description=f"the port rank 0 listens on for the launcher's rendezvous, 1..65535 "
                                         f"({MASTER_PORT_ENV} in the pods; {DEFAULT_MASTER_PORT} is torch's default)")
    scheduler: Scheduler = Field("auto", description="who places the pods all at once in a clique: 'kubernetes' "
                                                     "(the cluster's Workload and PodGroup gang scheduling, "
                                                     "Kubernetes 1.37 with its gates on), 'nvlfabric' (nvlfabric's "
                                                     "controller) or 'auto' (kubernetes where the cluster offers it "
                                                     "at preview, else nvlfabric)")
    clique_groups: int = Field(1, ge=1, json_schema_extra={"internal": True},
                               description="how many clique groups the ComputeDomain has (from its "
                                           "placement.cliques; not an argument)")
    backend: Backend = Field(Backend.NVLFABRIC, json_schema_extra={"internal": True},
                             description="the ComputeDomain's backend (from the domain; not an argument)")

    @property
    def gated(self) -> bool:
        """Whether the pods carry the reservation gate (reservation_gate, else the backend's default)."""
        return self.reservation_gate if self.reservation_gate is not None else self.backend is Backend.NVLFABRIC

    @property
    def one_clique(self) -> bool:
        """On backend nvidia: whether the job's GPUs fit one clique (then pod affinity keeps it there)."""
        return not (self.gpu_resource and self.parallelism * self.gpus_per_pod > GPUS_PER_CLIQUE)

    @property
    def group_size(self) -> int:
        """Pods per clique group (all of them over a single-clique domain)."""
        return self.parallelism // self.clique_groups

    @field_validator("pod_template")
    @classmethod
    def _template(cls, tpl: dict[str, Any]) -> dict[str, Any]:
        spec = tpl.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
            raise ValueError("needs spec.containers: a non-empty list of containers")
        for i, c in enumerate(spec["containers"]):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                raise ValueError(f"spec.containers[{i}] needs a name and an image")
        problems = template_shape_problems(tpl)
        if problems:
            raise ValueError("; ".join(problems))
        if spec.get("nodeName"):
            raise ValueError("spec.nodeName is set: a pod with scheduling gates (and one whose clique nvlfabric or "
                             "Kubernetes chooses) cannot name its node; leave it unset, or use nodeSelector")
        if spec.get("schedulingGroup"):
            raise ValueError("spec.schedulingGroup is set by BoundJob (the job's PodGroup when Kubernetes schedules "
                             "it): leave it unset")
        if any(rc.get("name") == CLAIM_REF for rc in spec.get("resourceClaims") or []):
            raise ValueError(f"spec.resourceClaims already has an entry named {CLAIM_REF!r}, which BoundJob adds")
        # Rank 0's address is a pod DNS name under the workload's headless Service: another
        # hostname or subdomain would leave it resolving to nothing.
        for key in ("hostname", "subdomain"):
            if spec.get(key):
                raise ValueError(f"spec.{key} is set by BoundJob (stable pod names under the workload's headless "
                                 f"Service, which {MASTER_ADDR_ENV} names): leave it unset")
        return tpl

    @model_validator(mode="after")
    def _sizes(self) -> BoundJobArgs:
        names_ = [c["name"] for c in self.pod_template["spec"]["containers"]]
        if self.gpu_container is not None and self.gpu_container not in names_:
            raise ValueError(f"gpu_container {self.gpu_container!r} is not a container of pod_template "
                             f"(its containers: {', '.join(names_)})")
        restart = self.pod_template["spec"].get("restartPolicy")
        if self.kind in BATCH_KINDS and restart not in (None, "Never", "OnFailure"):
            raise ValueError(f"pod_template.spec.restartPolicy of a {self.kind}'s pods must be Never or OnFailure")
        if self.kind not in BATCH_KINDS and restart not in (None, "Always"):
            raise ValueError(f"pod_template.spec.restartPolicy of a {self.kind}'s pods must be Always (or unset)")
        if self.queue_name is not None and self.kind not in BATCH_KINDS:
            raise ValueError(f"queue_name: Kueue queues a {self.kind} only through its pod integration, which "
                             "BoundJob does not set up: use kind Job or JobSet, or leave queue_name unset")
        if self.queue_name is not None and self.clique_groups > 1 and self.kind != "JobSet":
            raise ValueError(f"queue_name over a MultiClique domain ({self.clique_groups} clique groups) needs kind "
                             f"JobSet: a {self.kind} per group would be a Kueue workload each, admitted apart (half a "
                             "job running); a JobSet is one workload with a pod set per group")
        if self.kind != "JobSet" and self.max_restarts:
            raise ValueError(f"max_restarts applies to JobSet (its failurePolicy), not {self.kind}: leave it unset"
                             + (" (a Job's pods are not retried: its backoffLimit is 0)" if self.kind == "Job" else ""))
        if self.kind not in BATCH_KINDS and self.completions is not None:
            raise ValueError(f"completions applies to Job and JobSet, not {self.kind}: leave it unset")
        if self.completions is not None and self.completions < self.parallelism:
            raise ValueError(f"completions ({self.completions}) must be >= parallelism ({self.parallelism})")
        k = self.clique_groups
        if k > 1 and self.parallelism % k:
            raise ValueError(f"parallelism {self.parallelism} does not split evenly over the ComputeDomain's {k} "
                             f"clique groups (placement.cliques): use a multiple of {k}")
        if k > 1 and self.kind == "LeaderWorkerSet":
            raise ValueError("a LeaderWorkerSet's groups share one pod template, so they cannot each use their own "
                             "clique's channel claim: use kind Job, StatefulSet or JobSet over a MultiClique domain")
        if self.backend is Backend.NVIDIA:
            return self._on_nvidia()
        if k > 1 and not self.gated:
            raise ValueError("reservation_gate=False over a MultiClique domain: the controller places its groups "
                             "and writes each pod's rank while the pods are gated; leave reservation_gate on")
        if self.group_size > MAX_PODS_PER_CLAIM:
            per = "parallelism" if k == 1 else f"parallelism / {k} clique groups"
            raise ValueError(
                f"{per} = {self.group_size} pods share one channel claim, more than its reservedFor holds "
                f"({MAX_PODS_PER_CLAIM}): use at most {MAX_PODS_PER_CLAIM * k} pods, or a MultiClique ComputeDomain "
                "with more cliques")
        if self.gpu_resource and self.group_size * self.gpus_per_pod > GPUS_PER_CLIQUE:
            group = "parallelism x gpus_per_pod" if k == 1 else f"parallelism / {k} clique groups x gpus_per_pod"
            raise ValueError(
                f"{group} = {self.group_size * self.gpus_per_pod} GPUs, more than one NVL72 clique has "
                f"({GPUS_PER_CLIQUE}); a ComputeDomain's group lives in one clique: use fewer pods or GPUs per pod, "
                "or a MultiClique ComputeDomain (placement: {scope: MultiClique, cliques: N}) with more cliques")
        return self

    def _on_nvidia(self) -> BoundJobArgs:
        if self.reservation_gate:
            raise ValueError(f"reservation_gate=True over a ComputeDomain of backend nvidia: the gate "
                             f"{RESERVATION_GATE} is lifted by nvlfabric's controller, not running with NVIDIA's "
                             "driver, so the pods would stay gated: leave reservation_gate unset")
        if self.scheduler == "kubernetes":
            raise ValueError("scheduler='kubernetes' over a ComputeDomain of backend nvidia: the job's pod groups "
                             "would share one channel claim, and NVIDIA's domain gives each pod a claim of its own "
                             "from its template: leave scheduler unset (kube-scheduler places the pods, kept in one "
                             f"clique by pod affinity on {NVIDIA_CLIQUE_LABEL})")
        return self


#: The parts of a pod template BoundJob reads or extends, with the JSON type each must have.
_TEMPLATE_SHAPE: Final[dict[str, type]] = {"metadata": dict, "metadata.labels": dict, "metadata.annotations": dict,
                                           "spec.resourceClaims": list, "spec.schedulingGates": list,
                                           "spec.initContainers": list, "spec.tolerations": list,
                                           "spec.nodeSelector": dict}
_CONTAINER_SHAPE: Final[dict[str, type]] = {"resources": dict, "resources.limits": dict, "resources.requests": dict,
                                            "resources.claims": list, "env": list}
_TYPE_NAMES: Final[dict[type, str]] = {dict: "a mapping", list: "a list"}


def _shape_problems(obj: dict[str, Any], shape: dict[str, type], where: str) -> list[str]:
    out = []
    for path, want in shape.items():
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, want):  # null is as good as absent
            out.append(f"{where}{path} must be {_TYPE_NAMES[want]} (got {value!r})")
    return out


def template_shape_problems(tpl: dict[str, Any]) -> list[str]:
    """Parts of a pod template of the wrong JSON type, each as one line naming its path (pure):
    BoundJob extends these (labels, claims, gates, limits), so a string where a list belongs is
    refused here rather than failing inside the component."""
    out = _shape_problems(tpl, _TEMPLATE_SHAPE, "")
    spec = tpl.get("spec") or {}
    out += _item_problems(spec, ("resourceClaims", "schedulingGates"), "spec.", named=True)
    out += _item_problems(spec, ("tolerations",), "spec.", named=False)
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        for i, c in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(c, dict):
                where = f"spec.{kind}[{i}]."
                out += _shape_problems(c, _CONTAINER_SHAPE, where)
                out += _item_problems(c, ("env",), where, named=True)
                if isinstance(c.get("resources"), dict):
                    out += _item_problems(c["resources"], ("claims",), f"{where}resources.", named=True)
            else:
                out.append(f"spec.{kind}[{i}] must be a mapping (got {c!r})")
    return out


def _item_problems(obj: dict[str, Any], keys: tuple[str, ...], where: str, *, named: bool) -> list[str]:
    """The items of the lists `obj[key]` that are not mappings (`named`: with a string name)."""
    out = []
    for key in keys:
        items = obj.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict) or (named and not isinstance(item.get("name"), str)):
                out.append(f"{where}{key}[{i}] must be a mapping{' with a name' if named else ''} (got {item!r})")
    return out


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
    meta["annotations"] = {**(meta.get("annotations") or {}), GROUP_SIZE_ANNOTATION: str(args.group_size),
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


def master_address(args: BoundJobArgs, *, namespace: str) -> str:
    """Rank 0's pod as a DNS name, `<hostname>.<headless Service>.<namespace>.svc` (a pod's DNS
    search path adds the cluster domain, which the component cannot know)."""
    if args.kind == "LeaderWorkerSet":
        # The leader's name as LWS itself computes it: LWS puts LWS_LEADER_ADDRESS first in every
        # container's env, so Kubernetes expands this reference in our value.
        return f"$({LWS_LEADER_ADDRESS_ENV})"
    multi = args.clique_groups > 1  # group 0's workload is <name>-0 (JobSet: replicated Job workers-0)
    if args.kind == "JobSet":  # JobSet names a pod <jobset>-<replicated job>-<job index>-<pod index>
        return f"{args.name}-{JOBSET_REPLICATED_JOB}{'-0' if multi else ''}-0-0.{args.name}.{namespace}.svc"
    # An Indexed Job's pod is host <job>-<index>, a StatefulSet's <name>-<n>.
    return f"{args.name}{'-0' if multi else ''}-0.{args.name}.{namespace}.svc"


def launcher_env(args: BoundJobArgs, *, namespace: str) -> list[dict[str, Any]]:
    """What a distributed launcher reads (nvlfabric/api/names.py): the pod's rank from the kind's
    own pod index (downward API), the world size, rank 0's address and port."""
    world, port, master = str(args.parallelism), str(args.master_port), master_address(args, namespace=namespace)

    # Over clique groups the rank is the controller's (group x group size + index): env cannot add.
    field = f"metadata.annotations['{RANK_ANNOTATION}']" if args.clique_groups > 1 else RANK_FIELD[args.kind]

    def rank(name: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}

    return [rank(RANK_ENV), {"name": WORLD_SIZE_ENV, "value": world},
            {"name": MASTER_ADDR_ENV, "value": master}, {"name": MASTER_PORT_ENV, "value": port},
            *(rank(name) for name in TORCH_RANK_ENVS), {"name": TORCH_WORLD_SIZE_ENV, "value": world},
            {"name": TORCH_MASTER_ADDR_ENV, "value": master}, {"name": TORCH_MASTER_PORT_ENV, "value": port}]


def _add_launcher_env(tpl: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Put `env` ahead of each container's own, so the user's entries can refer to ours (`$(VAR)`
    expands only earlier entries); a name the user set is theirs and stays out of ours. Init
    containers too: a sidecar or a wait for rank 0 reads the same."""
    spec = tpl["spec"]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        own = {e.get("name") for e in c.get("env") or []}
        c["env"] = [*(copy.deepcopy(e) for e in env if e["name"] not in own), *(c.get("env") or [])]


def _headless_service(args: BoundJobArgs, *, namespace: str, labels: dict[str, str],
                      selector: dict[str, str]) -> dict[str, Any]:
    """The Service that gives each pod its DNS name; not-ready pods are published too, since
    rank 0 must be found while the others are still starting."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": args.name, "namespace": namespace,
                                                                 "labels": labels},
            "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True}}


def _job_spec(args: BoundJobArgs, tpl: dict[str, Any]) -> dict[str, Any]:
    n, k = args.group_size, args.clique_groups
    return {"parallelism": n, "completions": (args.completions or args.parallelism) // k,
            "completionMode": "Indexed", "backoffLimit": 0, "template": tpl}


def _jobset_spec(args: BoundJobArgs) -> dict[str, Any]:
    """A JobSet's spec but its replicated Jobs: its network and, with max_restarts, its failure policy."""
    # JobSet makes the headless Service itself; spelled out, so that master_address() does not
    # depend on JobSet's defaults (subdomain = the JobSet's name, DNS hostnames on).
    spec: dict[str, Any] = {"network": {"enableDNSHostnames": True, "subdomain": args.name,
                                        "publishNotReadyAddresses": True}}
    if args.max_restarts:
        # BlockingRecreate: the new Jobs wait until every old pod is gone. Under Recreate the new
        # pods would be created while the old ones still hold their nodes' GPUs and their places
        # on the channel claim, and wait behind them unschedulable.
        spec["failurePolicy"] = {"maxRestarts": args.max_restarts, "restartStrategy": "BlockingRecreate"}
    return spec


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


def workload_manifests(args: BoundJobArgs, *, namespace: str, claim_name: Any, domain: str,
                       claims: list[str] | None = None, apis: WorkloadApis | None = None) -> list[dict[str, Any]]:
    """The objects of the workload (dicts in the API's shape), the workloads themselves last (pure).
    `claims`: a MultiClique domain's claims, one per clique group (then one workload per group,
    or one JobSet with a replicated Job per group). `apis`: Kubernetes schedules the job (its
    Workload and pod groups come first), else None: nvlfabric's controller does."""
    labels = nvl_labels("workload", {**args.labels, COMPUTE_DOMAIN_LABEL: domain})
    groups: list[dict[str, Any]] = []
    if apis is not None:
        groups = pod_group_manifests(args, namespace=namespace, claims=claims or [claim_name], apis=apis,
                                     labels=labels)
    if args.clique_groups > 1:
        objs = _group_manifests(args, namespace=namespace, claims=claims or [], domain=domain,
                                kubernetes=apis is not None)
    else:
        objs = _single_manifests(args, namespace=namespace, claim_name=claim_name, domain=domain,
                                 kubernetes=apis is not None)
    if args.queue_name is not None:  # Kueue reads the label on the workload object itself
        for obj in objs:
            if obj["kind"] in BATCH_KINDS:
                obj["metadata"]["labels"] = {**obj["metadata"]["labels"], KUEUE_QUEUE_LABEL: args.queue_name}
    return [*groups, *objs]


def _single_manifests(args: BoundJobArgs, *, namespace: str, claim_name: Any, domain: str,
                      kubernetes: bool) -> list[dict[str, Any]]:
    tpl = bound_pod_template(args, claim_name=claim_name, domain=domain,
                             pod_group=pod_group_name(args, 0) if kubernetes else None)
    labels = nvl_labels("workload", {**args.labels, COMPUTE_DOMAIN_LABEL: domain})
    # Deleting waits (foreground) until the workload's pods are gone, so the ComputeDomain, deleted
    # after its workloads, finds its channel no longer in use; a Job or StatefulSet not waited for
    # is not awaited at all (`not_awaited`).
    annotations = {"pulumi.com/deletionPropagationPolicy": "foreground"}
    meta = {"name": args.name, "namespace": namespace, "annotations": annotations, "labels": labels}
    n = args.parallelism
    selector = {COMPUTE_DOMAIN_LABEL: domain, WORKLOAD_LABEL: args.name}
    tpl["metadata"]["labels"].update(selector)
    _add_launcher_env(tpl, launcher_env(args, namespace=namespace))
    if args.kind == "Job":
        # (No batch.kubernetes.io/job-name label of ours: the API server adds it to the pods. Given,
        # it broke the preview of every replacement of the Job, a pod template change: pulumi-
        # kubernetes dry-runs the replacement under a generated name, which the label then contradicts.)
        # An Indexed Job's pods are named <job>-<index> as hosts; under the subdomain of a headless
        # Service of that name, rank 0 is <job>-0.<job>.<namespace>.svc.
        tpl["spec"]["subdomain"] = args.name
        # Waiting is pulumi-kubernetes' own Job await: until it completes.
        if not args.wait:
            annotations.update(NOT_AWAITED)
        return [_headless_service(args, namespace=namespace, labels=labels, selector=selector),
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": _job_spec(args, tpl)}]
    if args.kind == "StatefulSet":
        if not args.wait:  # waiting is pulumi-kubernetes' StatefulSet await: every replica ready
            annotations.update(NOT_AWAITED)
        service = _headless_service(args, namespace=namespace, labels=labels, selector=selector)
        return [service, {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": {
            "replicas": n, "serviceName": args.name, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector}, "template": tpl}}]
    if args.kind == "JobSet":
        annotations["pulumi.com/waitFor"] = \
            "jsonpath={.status.replicatedJobsStatus[0].ready}=1" if args.wait else "jsonpath={.metadata.uid}"
        return [{"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": meta, "spec": {
            **_jobset_spec(args), "replicatedJobs": [{"name": JOBSET_REPLICATED_JOB, "replicas": 1,
                                                      "template": {"spec": _job_spec(args, tpl)}}]}}]
    annotations["pulumi.com/waitFor"] = "condition=Available" if args.wait else "jsonpath={.metadata.uid}"
    return [{"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta, "spec": {
        "replicas": 1, "startupPolicy": "LeaderCreated",
        "leaderWorkerTemplate": {"size": n, "workerTemplate": tpl}}}]


def _group_manifests(args: BoundJobArgs, *, namespace: str, claims: list[str], domain: str,
                     kubernetes: bool) -> list[dict[str, Any]]:
    """A MultiClique domain's job: the headless Service over every group, then per group its
    workload (a JobSet: one, with a replicated Job per group)."""
    if len(claims) != args.clique_groups:
        raise ValueError(f"{args.clique_groups} clique groups need as many claims, got {claims}")
    labels = nvl_labels("workload", {**args.labels, COMPUTE_DOMAIN_LABEL: domain})
    selector = {COMPUTE_DOMAIN_LABEL: domain, WORKLOAD_LABEL: args.name}
    env = launcher_env(args, namespace=namespace)
    templates = []
    for g, claim in enumerate(claims):
        tpl = bound_pod_template(args, claim_name=claim, domain=domain, group=g,
                                 pod_group=pod_group_name(args, g) if kubernetes else None)
        tpl["metadata"]["labels"].update(selector)
        tpl["spec"]["subdomain"] = args.name  # hosts <name>-<g>-<i> under the one Service
        _add_launcher_env(tpl, env)
        templates.append(tpl)

    def meta(name: str, wait: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": labels, "annotations": {
            "pulumi.com/deletionPropagationPolicy": "foreground", "pulumi.com/waitFor": wait}}

    def built_in(name: str) -> dict[str, Any]:  # a Job or a StatefulSet: awaited by pulumi-kubernetes itself
        m = meta(name, "")
        m["annotations"].update({} if args.wait else NOT_AWAITED)
        return m

    if args.kind == "JobSet":
        wait = "jsonpath={.metadata.uid}"
        if args.wait:
            wait = f"jsonpath={{.status.replicatedJobsStatus[{len(claims) - 1}].ready}}=1"
        return [{"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": meta(args.name, wait), "spec": {
            **_jobset_spec(args), "replicatedJobs": [
                {"name": f"{JOBSET_REPLICATED_JOB}-{g}", "replicas": 1, "template": {"spec": _job_spec(args, tpl)}}
                for g, tpl in enumerate(templates)]}}]
    out = [_headless_service(args, namespace=namespace, labels=labels, selector=selector)]
    for g, tpl in enumerate(templates):
        name = f"{args.name}-{g}"
        if args.kind == "Job":
            out.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": built_in(name),
                        "spec": _job_spec(args, tpl)})
        else:
            tpl["metadata"]["labels"]["nvlfabric.io/clique-group"] = str(g)
            out.append({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": built_in(name), "spec": {
                            "replicas": args.group_size, "serviceName": args.name, "podManagementPolicy": "Parallel",
                            "selector": {"matchLabels": {**selector, "nvlfabric.io/clique-group": str(g)}},
                            "template": tpl}})
    for m in out[1:]:
        if not m["metadata"]["annotations"]["pulumi.com/waitFor"]:
            del m["metadata"]["annotations"]["pulumi.com/waitFor"]
    return out


def job_manifest(args: BoundJobArgs, *, namespace: str, claim_name: Any, domain: str) -> dict[str, Any]:
    """The workload object itself (for `kind: Job`, the Job)."""
    return workload_manifests(args, namespace=namespace, claim_name=claim_name, domain=domain)[-1]


class BoundJob(pulumi.ComponentResource):
    """A workload (a Job by default; see `kind`) whose pods all use `compute_domain`'s IMEX channel."""

    job_name: pulumi.Output[str]
    kind: pulumi.Output[str]
    namespace: pulumi.Output[str]
    pods: pulumi.Output[int]
    claim_name: pulumi.Output[str]
    scheduler: pulumi.Output[str]
    """Who places the pods: 'kubernetes' (its Workload and PodGroups) or 'nvlfabric' (the controller)."""

    def __init__(self, resource_name: str, *, compute_domain: ComputeDomain, pod_template: dict[str, Any],
                 name: str | None = None, kind: WorkloadKind = "Job", parallelism: int = 1,
                 completions: int | None = None,
                 gpus_per_pod: int = GPUS_PER_NODE, gpu_resource: str | None = "nvidia.com/gpu",
                 max_restarts: int = 0, queue_name: str | None = None, wait: bool = False,
                 labels: dict[str, str] | None = None,
                 reservation_gate: bool | None = None,
                 master_port: int = DEFAULT_MASTER_PORT, scheduler: Scheduler = "auto",
                 gpu_container: str | None = None, opts: pulumi.ResourceOptions | None = None,
                 **unknown: Any) -> None:
        groups = len(compute_domain.claims) if isinstance(compute_domain, ComputeDomain) else 1
        self.args = validate(BoundJobArgs, "BoundJob", resource_name, {
            "name": name if name is not None else resource_name, "kind": kind, "pod_template": pod_template,
            "parallelism": parallelism, "completions": completions, "gpus_per_pod": gpus_per_pod,
            "gpu_resource": gpu_resource, "max_restarts": max_restarts, "queue_name": queue_name, "wait": wait,
            "labels": labels or {},
            "reservation_gate": reservation_gate,
            "master_port": master_port, "scheduler": scheduler, "gpu_container": gpu_container,
            "clique_groups": groups,  # an unknown keyword is named with the valid ones
            "backend": compute_domain.backend if isinstance(compute_domain, ComputeDomain) else Backend.NVLFABRIC},
            unknown)
        if not isinstance(compute_domain, ComputeDomain):
            raise ComponentArgsError(
                f"BoundJob {resource_name!r}: invalid arguments\n  compute_domain: expected a "
                f"nvlfabric.ComputeDomain (got {type(compute_domain).__name__})")
        if taints := program.declared_taints():
            self.args = self.args.model_copy(update={"pod_template": tolerating(self.args.pod_template, taints)})
        compute_domain.bind(self.args.name, self.args.group_size,
                            self.args.gpus_per_pod if self.args.gpu_resource else 0)
        program.take("workload", compute_domain.namespace, self.args.name, component="BoundJob",
                     resource_name=resource_name)
        program.workload_tolerations(resource_name, list(self.args.pod_template["spec"].get("tolerations") or []))
        unserved = self._unserved(compute_domain.namespace, opts)
        if unserved and not pulumi.runtime.is_dry_run():
            raise ComponentArgsError(f"BoundJob {resource_name!r}: invalid arguments\n  {unserved}")
        super().__init__("nvlfabric:index:BoundJob", resource_name, None, opts)
        if unserved:
            pulumi.log.warn(f"{unserved}; `pulumi up` stops here until it is", resource=self)
        # (An NVIDIA domain's job bigger than one clique spreads as kube-scheduler finds room.)
        short = None if not self.args.one_clique else capacity.shortfall(
            self.args.name, groups=self.args.clique_groups, pods_per_group=self.args.group_size,
            gpus_per_pod=self.args.gpus_per_pod if self.args.gpu_resource else 0, racks=capacity.declared(),
            namespace=compute_domain.namespace)
        if short:
            pulumi.log.warn(short, resource=self)
        apis = self._workload_apis(resource_name, compute_domain.namespace)
        objs = workload_manifests(self.args, namespace=compute_domain.namespace,
                                  claim_name=compute_domain.claim, domain=compute_domain.name,
                                  claims=compute_domain.claims, apis=apis)
        # The workload waits for its domain, and for what the component was told to wait for (a
        # JobSet's CRD, say): a component's own depends_on does not hold back its children.
        extra: Any = opts.depends_on if opts is not None else None
        waits: list[Any] = [compute_domain, *([extra] if isinstance(extra, pulumi.Resource) else (extra or []))]
        child = pulumi.ResourceOptions(parent=self, depends_on=waits)
        # Kubernetes' scheduling objects come before the workloads, which wait for them (and are
        # deleted before them: a PodGroup stays while pods of it exist).
        self.pod_groups = [k8s.apiextensions.CustomResource(
            f"{resource_name}-{m['kind'].lower()}-{m['metadata']['name']}", api_version=m["apiVersion"],
            kind=m["kind"], metadata=m["metadata"], spec=m["spec"], opts=child)
            for m in objs if m["kind"] in SCHEDULING_KINDS]
        if self.pod_groups:
            child = pulumi.ResourceOptions(parent=self, depends_on=[*waits, *self.pod_groups])
        objs = [m for m in objs if m["kind"] not in SCHEDULING_KINDS]
        services = [m for m in objs if m["kind"] == "Service"]
        for m in services:  # the Job's or the StatefulSet's headless Service
            # It names no claim, so it waits only for what the component was told to: made beside
            # its domain, not after it, it is out of the workloads' way (a 64-rack program's 57
            # Services and 64 Jobs shared the engine's 8 steps in flight after the domains, ~1 s each).
            k8s.core.v1.Service(f"{resource_name}-svc", metadata=m["metadata"], spec=m["spec"],
                                opts=pulumi.ResourceOptions(parent=self, depends_on=waits[1:]))
        workloads = [m for m in objs if m["kind"] != "Service"]
        self.jobs: list[pulumi.CustomResource] = []
        for i, m in enumerate(workloads):
            # One workload keeps the component's own name (and state); a MultiClique domain's
            # further groups are <resource>-<g>.
            rname = resource_name if i == 0 else f"{resource_name}-{i}"
            if m["kind"] == "Job":
                self.jobs.append(k8s.batch.v1.Job(rname, metadata=m["metadata"], spec=m["spec"], opts=child))
            elif m["kind"] == "StatefulSet":
                self.jobs.append(k8s.apps.v1.StatefulSet(rname, metadata=m["metadata"], spec=m["spec"], opts=child))
            else:
                self.jobs.append(k8s.apiextensions.CustomResource(
                    rname, api_version=m["apiVersion"], kind=m["kind"], metadata=m["metadata"], spec=m["spec"],
                    opts=child))
        self.job = self.jobs[0]
        given = self.args.name
        self.job_name = self.job.id.apply(lambda _: given)  # known once the workload exists
        self.kind = pulumi.Output.from_input(self.args.kind)
        self.scheduler = pulumi.Output.from_input("kubernetes" if apis else "kube-scheduler"
                                                  if self.args.backend is Backend.NVIDIA else "nvlfabric")
        self.namespace = pulumi.Output.from_input(compute_domain.namespace)
        self.pods = pulumi.Output.from_input(self.args.parallelism)
        self.claim_name = compute_domain.claim_name
        self.register_outputs({"job_name": self.job_name, "kind": self.kind, "namespace": self.namespace,
                               "pods": self.pods, "scheduler": self.scheduler,
                               "claim_name": self.claim_name})

    def _unserved(self, namespace: str, opts: pulumi.ResourceOptions | None) -> str:
        """Why this kind cannot be created on the program's cluster (its CRD is not installed), or
        "". Not asked when the component was told what to wait for: that may be what installs it."""
        kind = self.args.kind
        if opts is not None and opts.depends_on:
            return ""
        if self.args.queue_name is not None and _api_served(KUEUE_API_VERSION, "LocalQueue", "localqueues",
                                                            namespace) is False:
            return (f"queue_name: {self.args.queue_name!r}, but the cluster serves no {KUEUE_API_VERSION} "
                    "LocalQueue: install Kueue (https://kueue.sigs.k8s.io) first; on nvlfabric's simulator: "
                    "`nvlfabric-sim up --addons kueue`; or leave queue_name unset")
        if kind not in CONTROLLED_KINDS or cluster_serves(kind, namespace) is not False:
            return ""
        api, _, project, addon = CONTROLLED_KINDS[kind]
        return (f"kind: {kind!r}, but the cluster serves no {api} {kind}: install {project} and its controller "
                f"first; on nvlfabric's simulator: `nvlfabric-sim up --addons {addon}`, or pass "
                "opts=ResourceOptions(depends_on=[...]) with what installs it in this program")

    def _workload_apis(self, resource_name: str, namespace: str) -> WorkloadApis | None:
        """Whether Kubernetes schedules this job (its apiVersions) or nvlfabric's controller does
        (None), from `scheduler` and, unless told, what the cluster offers at preview."""
        a = self.args
        if a.scheduler == "nvlfabric" or a.backend is Backend.NVIDIA:
            return None
        try:
            source = kube.kubeconfig_source(pulumi.Config("kubernetes").get("kubeconfig"))
            found: WorkloadApis | None = _probed(source, namespace)
            unread = ""
        except Exception as exc:  # an unreadable cluster: the user's word, or nvlfabric's controller
            found, unread = None, f"{type(exc).__name__}: {exc}"
        needs_composite = a.clique_groups > 1
        why = ("the cluster does not serve scheduling.k8s.io Workload and PodGroup" if found is None and not unread
               else found.why_not if found is not None and not found.usable
               else "it serves no CompositePodGroup (gate CompositePodGroup), which a job over several cliques needs"
               if found is not None and needs_composite and found.composite is None else "")
        if a.scheduler == "auto":
            if unread or why:
                pulumi.log.info(f"BoundJob {a.name}: nvlfabric's controller places it ({unread or why})", resource=self)
                return None
            return found
        if unread:  # scheduler=kubernetes and the cluster cannot be read yet: as the user says
            pulumi.log.warn(f"BoundJob {a.name}: could not read the cluster ({unread}); assuming Kubernetes 1.37's "
                            "workload scheduling is on", resource=self)
            return DEFAULT_WORKLOAD_APIS
        if why:
            raise ComponentArgsError(
                f"BoundJob {resource_name!r}: invalid arguments\n  scheduler: 'kubernetes', but {why}; turn the "
                "gates on (GenericWorkload, TopologyAwareWorkloadScheduling, DRAWorkloadResourceClaims, "
                "CompositePodGroup) and serve scheduling.k8s.io/v1beta1 and v1alpha3, or use scheduler='auto'")
        return found


def cluster_serves(kind: WorkloadKind, namespace: str = "default") -> bool | None:
    """Whether the program's cluster (`kubernetes:kubeconfig`, else $KUBECONFIG) serves `kind`:
    Job and StatefulSet always; JobSet and LeaderWorkerSet once their CRDs are installed. None:
    the cluster could not be read. A stack can declare a JobSet-bound job only where JobSet runs."""
    if kind not in CONTROLLED_KINDS:
        return True
    api, plural, _, _ = CONTROLLED_KINDS[kind]
    return _api_served(api, kind, plural, namespace)


def _api_served(api: str, kind: str, plural: str, namespace: str) -> bool | None:
    """`discovery.served` on the program's cluster, once per program (None: it cannot be read)."""
    source = kube.kubeconfig_source(pulumi.Config("kubernetes").get("kubeconfig"))
    if (source, namespace, api, kind) not in _served:
        try:
            client = kube.client(source)
        except Exception:  # no kubeconfig to read: nothing to say
            return None
        _served[source, namespace, api, kind] = discovery.served(client, api, kind, plural, namespace)
    return _served[source, namespace, api, kind]


_served: dict[tuple[str, str, str, str], bool | None] = {}
SCHEDULING_KINDS: Final = ("Workload", "CompositePodGroup", "PodGroup")
_probes: dict[tuple[str, str], WorkloadApis | None] = {}


def _probed(source: str, namespace: str) -> WorkloadApis | None:
    """`scheduling.probe`, once per cluster and namespace in a program."""
    if (source, namespace) not in _probes:
        _probes[source, namespace] = scheduling.probe(kube.client(source), namespace)
    return _probes[source, namespace]
