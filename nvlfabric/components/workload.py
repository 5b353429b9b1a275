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
- `Job` (default): an Indexed batch/v1 Job of `parallelism` pods; a pod failed as disrupted (its
  node lost) is replaced, any other failure fails the Job (workloadmanifests.DISRUPTION_POLICY, in
  a JobSet's Jobs too; a Job already in a stack's state keeps what it was created with);
- `StatefulSet`: apps/v1, `parallelism` replicas started in parallel (all members must come up
  together), with the headless Service it needs for stable pod names;
- `JobSet` (jobset.x-k8s.io/v1alpha2): one replicated Job of `parallelism` Indexed pods;
- `LeaderWorkerSet` (leaderworkerset.x-k8s.io/v1): one group of `parallelism` pods, the leader
  from the same template; with `lws_size`, parallelism / lws_size groups of that many, each a
  launch of its own (world size lws_size, its leader rank 0), e.g. replicas of a model served
  over several nodes.
JobSet and LeaderWorkerSet need their controllers in the cluster (they are not part of
Kubernetes); the component creates the object with the binding inside, and at preview asks the
cluster whether it serves the kind (`cluster_serves`): where it does not, a warning, and `up`
stops. A JobSet's `max_restarts` is its failure policy: all its Jobs recreated, the new pods on
the same claims (and so the same cliques and channels).

Elastic (`max_parallelism`, with `min_parallelism`): `pulumi up` with another `parallelism` in that
range grows or shrinks the running Job, StatefulSet or LeaderWorkerSet (by whole groups of
`lws_size`: its replicas, an update of its resource) in place. Its pod template does not depend
on the size (the group-size annotation is min_parallelism, or a LeaderWorkerSet's lws_size; the
env has `NVLFABRIC_NNODES=min:max` and no world size, or a LeaderWorkerSet group's own), so the
pods that stay are not touched: a StatefulSet's replicas is an update
of its resource; a Job's parallelism and completions, which pulumi-kubernetes would change only by
replacing the Job, are ignored by its resource and set in place by a `JobParallelism` resource
(nvlfabric/provider/jobparallelism.py). New pods join the running domain where its clique has
room (else they wait gated), the highest indexes leave, and their nodes' channels are unprepared.
Limits (256 pods per claim, a clique's GPUs) are checked at max_parallelism.

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
(1.37's Workload, PodGroup and CompositePodGroup with their gates on; nvlfabric/clusterview/scheduling.py
checks at preview), the component declares it and kube-scheduler places each clique group as a
gang constrained to one clique, the whole job as a gang of its groups, with each group's channel
claim reserved for its PodGroup rather than for each pod (no per-pod `reservedFor` entry). The
pods then carry `spec.schedulingGroup` and, over one clique, no gate; over several, the gate
stays, for the controller to write the ranks (it places nothing then). Elsewhere nvlfabric's
controller places, as above. The output `scheduler` says who does: `kubernetes`, `nvlfabric`, or
over a ComputeDomain of NVIDIA's backend `kube-scheduler`.

This module holds the component; its parts are workloadargs.py (the arguments), templatechecks.py
(the pod template's checks), podtemplate.py (the template bound to the domain), launcherenv.py,
podgroups.py, workloadmanifests.py (the objects) and clusterprobes.py (what the cluster serves),
whose names it re-exports.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from nvlfabric.api.names import DEFAULT_MASTER_PORT, GPU_RESOURCE, GPUS_PER_NODE, KUEUE_API_VERSION
from nvlfabric.api.nvidia import Backend
from nvlfabric.clusterview.scheduling import WorkloadApis
from nvlfabric.components import capacity, clusterprobes, program, served
from nvlfabric.components.args import ComponentArgsError, validate
from nvlfabric.components.clusterprobes import CONTROLLED_KINDS, DEFAULT_WORKLOAD_APIS, cluster_serves
from nvlfabric.components.computedomain import ComputeDomain
from nvlfabric.components.launcherenv import RANK_FIELD, launcher_env, master_address
from nvlfabric.components.podgroups import SCHEDULING_KINDS, pod_group_manifests, pod_group_name
from nvlfabric.components.podtemplate import bound_pod_template, tolerating
from nvlfabric.components.templatechecks import CLAIM_REF, template_shape_problems
from nvlfabric.components.workloadargs import (
    BATCH_KINDS,
    JOBSET_API,
    JOBSET_REPLICATED_JOB,
    LWS_API,
    MAX_JOBSET_RESTARTS,
    BoundJobArgs,
    Scheduler,
    WorkloadKind,
)
from nvlfabric.components.workloadmanifests import (
    CREATED_ONLY,
    DISRUPTION_POLICY,
    ELASTIC_SIZE,
    NOT_AWAITED,
    job_manifest,
    workload_manifests,
)
from nvlfabric.provider import jobparallelism

__all__ = [
    "BATCH_KINDS", "CLAIM_REF", "CONTROLLED_KINDS", "CREATED_ONLY", "DEFAULT_WORKLOAD_APIS", "DISRUPTION_POLICY",
    "JOBSET_API", "JOBSET_REPLICATED_JOB", "LWS_API", "MAX_JOBSET_RESTARTS", "NOT_AWAITED", "RANK_FIELD",
    "SCHEDULING_KINDS", "BoundJob", "BoundJobArgs", "Scheduler", "WorkloadKind", "bound_pod_template",
    "cluster_serves", "job_manifest", "launcher_env", "master_address", "pod_group_manifests", "pod_group_name",
    "template_shape_problems", "tolerating", "workload_manifests",
]


class BoundJob(pulumi.ComponentResource):
    """A workload (a Job by default; see `kind`) whose pods all use `compute_domain`'s IMEX channel."""

    job_name: pulumi.Output[str]
    kind: pulumi.Output[str]
    namespace: pulumi.Output[str]
    pods: pulumi.Output[int]
    claim_name: pulumi.Output[str]
    scheduler: pulumi.Output[str]
    """Who places the pods: 'kubernetes' (Kubernetes' workload scheduling: the job's Workload and
    PodGroups), 'nvlfabric' (nvlfabric's controller) or, over a ComputeDomain of NVIDIA's backend,
    'kube-scheduler' (alone: nothing of nvlfabric's controller runs there)."""

    def __init__(self, resource_name: str, *, compute_domain: ComputeDomain, pod_template: dict[str, Any],
                 name: str | None = None, kind: WorkloadKind = "Job", parallelism: int = 1,
                 max_parallelism: int | None = None, min_parallelism: int | None = None,
                 completions: int | None = None, lws_size: int | None = None,
                 gpus_per_pod: int = GPUS_PER_NODE, gpu_resource: str | None = GPU_RESOURCE,
                 max_restarts: int = 0, queue_name: str | None = None, wait: bool = False,
                 labels: dict[str, str] | None = None,
                 reservation_gate: bool | None = None,
                 master_port: int = DEFAULT_MASTER_PORT, scheduler: Scheduler = "auto",
                 gpu_container: str | None = None, opts: pulumi.ResourceOptions | None = None,
                 **unknown: Any) -> None:
        self.args = _validated(resource_name, compute_domain, {
            "name": name if name is not None else resource_name, "kind": kind, "pod_template": pod_template,
            "parallelism": parallelism, "max_parallelism": max_parallelism, "min_parallelism": min_parallelism,
            "completions": completions, "lws_size": lws_size, "gpus_per_pod": gpus_per_pod,
            "gpu_resource": gpu_resource, "max_restarts": max_restarts, "queue_name": queue_name, "wait": wait,
            "labels": labels or {},
            "reservation_gate": reservation_gate,
            "master_port": master_port, "scheduler": scheduler, "gpu_container": gpu_container}, unknown)
        self._declare(resource_name, compute_domain)
        unserved = self._unserved(compute_domain.namespace, opts)
        if unserved and not pulumi.runtime.is_dry_run():
            raise ComponentArgsError(f"BoundJob {resource_name!r}: invalid arguments\n  {unserved}")
        super().__init__("nvlfabric:index:BoundJob", resource_name, None, opts)
        if unserved:
            pulumi.log.warn(f"{unserved}; `pulumi up` stops here until it is", resource=self)
        self._warn_shortfall(compute_domain.namespace)
        self._warn_fixed_size(compute_domain)
        apis = self._workload_apis(resource_name, compute_domain.namespace)
        objs = workload_manifests(self.args, namespace=compute_domain.namespace,
                                  claim_name=compute_domain.claim, domain=compute_domain.name,
                                  claims=compute_domain.claims, apis=apis)
        self._create(resource_name, compute_domain, objs, opts)
        self._register(compute_domain, apis)

    def _declare(self, resource_name: str, compute_domain: ComputeDomain) -> None:
        """Add the tolerations of the racks declared so far, bind the job to its domain and record
        it in the program's registry (its name, its pods' tolerations)."""
        if taints := program.declared_taints():
            self.args = self.args.model_copy(update={"pod_template": tolerating(self.args.pod_template, taints)})
        compute_domain.bind(self.args.name, self.args.most_pods // self.args.clique_groups,
                            self.args.gpus_per_pod if self.args.gpu_resource else 0)
        program.take("workload", compute_domain.namespace, self.args.name, component="BoundJob",
                     resource_name=resource_name)
        program.workload_tolerations(resource_name, list(self.args.pod_template["spec"].get("tolerations") or []))

    def _warn_shortfall(self, namespace: str) -> None:
        """Warn when the job does not fit the program's declared racks (capacity.py)."""
        # (An NVIDIA domain's job bigger than one clique spreads as kube-scheduler finds room.)
        if not self.args.one_clique:
            return
        a = self.args
        short = capacity.shortfall(a.name, groups=a.clique_groups, pods_per_group=a.group_size,
                                   gpus_per_pod=a.gpus_per_pod if a.gpu_resource else 0, racks=capacity.declared(),
                                   namespace=namespace)
        if short:
            pulumi.log.warn(short, resource=self)

    def _warn_fixed_size(self, compute_domain: ComputeDomain) -> None:
        """Warn when an elastic job of a node per pod runs on a domain whose numNodes says another size."""
        a = self.args
        num_nodes = getattr(getattr(compute_domain.args, "spec", None), "num_nodes", None)
        if not a.elastic or num_nodes is None or a.gpus_per_pod != GPUS_PER_NODE or not a.gpu_resource:
            return
        if num_nodes != a.parallelism:
            pulumi.log.warn(
                f"BoundJob {a.name}: elastic, {a.parallelism} pods of a whole node each, on ComputeDomain "
                f"{compute_domain.name} whose numNodes is {num_nodes}: its readiness counts {num_nodes} members, "
                "whatever the job's size; leave its numNodes unset (it then follows its pods) or change it with "
                "parallelism",
                resource=self)

    def _create(self, resource_name: str, compute_domain: ComputeDomain, objs: list[dict[str, Any]],
                opts: pulumi.ResourceOptions | None) -> None:
        """The child resources of `objs`: the scheduling objects, then the Services, then the workloads."""
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
        for m in objs:
            if m["kind"] == "Service":  # the Job's or the StatefulSet's headless Service
                # It names no claim, so it waits only for what the component was told to: made
                # beside its domain rather than after it, it does not hold up the workloads.
                k8s.core.v1.Service(f"{resource_name}-svc", metadata=m["metadata"], spec=m["spec"],
                                    opts=pulumi.ResourceOptions(parent=self, depends_on=waits[1:]))
        self._create_workloads(resource_name, [m for m in objs if m["kind"] != "Service"], child)

    def _create_workloads(self, resource_name: str, workloads: list[dict[str, Any]],
                          child: pulumi.ResourceOptions) -> None:
        """The workload objects as resources of their kinds (a JobSet or LeaderWorkerSet: a CustomResource)."""
        self.jobs: list[pulumi.CustomResource] = []
        for i, m in enumerate(workloads):
            # One workload keeps the component's own name (and state); a MultiClique domain's
            # further groups are <resource>-<g>.
            rname = resource_name if i == 0 else f"{resource_name}-{i}"
            # Fields added since a release created workloads, immutable ones: for new objects only.
            opts = child
            sized = self.args.elastic and m["kind"] == "Job"
            ignored = [*CREATED_ONLY.get(m["kind"], ()), *(ELASTIC_SIZE if sized else ())]
            if ignored:
                opts = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=ignored))
            if m["kind"] == "Job":
                self.jobs.append(k8s.batch.v1.Job(rname, metadata=m["metadata"], spec=m["spec"], opts=opts))
                if self.args.elastic:
                    self._size(rname, m, self.jobs[-1])
            elif m["kind"] == "StatefulSet":
                self.jobs.append(k8s.apps.v1.StatefulSet(rname, metadata=m["metadata"], spec=m["spec"], opts=opts))
            else:
                self.jobs.append(k8s.apiextensions.CustomResource(
                    rname, api_version=m["apiVersion"], kind=m["kind"], metadata=m["metadata"], spec=m["spec"],
                    opts=opts))
        self.job = self.jobs[0]

    def _size(self, resource_name: str, job: dict[str, Any], resource: pulumi.CustomResource) -> None:
        """An elastic Job's size, set in place (ELASTIC_SIZE: the Job's resource ignores it)."""
        args = jobparallelism.JobParallelismArgs(name=job["metadata"]["name"], namespace=job["metadata"]["namespace"],
                                                 parallelism=job["spec"]["parallelism"])
        opts = pulumi.ResourceOptions(parent=self, depends_on=[resource])
        # In the component provider the plugin serves it itself (nvlfabric.components.served).
        resource_class = served.JobParallelism if served.serving() else jobparallelism.JobParallelism
        self.size: pulumi.CustomResource = resource_class(f"{resource_name}-size", args, opts=opts)

    def _register(self, compute_domain: ComputeDomain, apis: WorkloadApis | None) -> None:
        """The component's outputs."""
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
        queue = self.args.queue_name
        if queue is not None and clusterprobes.api_served(KUEUE_API_VERSION, "LocalQueue", "localqueues",
                                                          namespace) is False:
            return (f"queue_name: {queue!r}, but the cluster serves no {KUEUE_API_VERSION} "
                    "LocalQueue: install Kueue (https://kueue.sigs.k8s.io) first; on nvlfabric's simulator: "
                    "`nvlfabric-sim up --addons kueue`; or leave queue_name unset")
        if kind not in CONTROLLED_KINDS or clusterprobes.cluster_serves(kind, namespace) is not False:
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
        if a.elastic:  # a PodGroup's gang has one size (workloadargs refuses scheduler='kubernetes')
            pulumi.log.info(f"BoundJob {a.name}: nvlfabric's controller places it (an elastic job)", resource=self)
            return None
        try:
            found: WorkloadApis | None = clusterprobes.scheduling_apis(namespace)
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


def _validated(resource_name: str, compute_domain: ComputeDomain, values: dict[str, Any],
               unknown: dict[str, Any]) -> BoundJobArgs:
    """BoundJob's arguments, with what its domain decides: the clique groups and the backend. A
    `compute_domain` that is no ComputeDomain is refused after the other arguments are checked."""
    domain = compute_domain if isinstance(compute_domain, ComputeDomain) else None
    args = validate(BoundJobArgs, "BoundJob", resource_name, {
        **values, "clique_groups": len(domain.claims) if domain is not None else 1,
        "backend": domain.backend if domain is not None else Backend.NVLFABRIC},
        unknown)  # an unknown keyword is named with the valid ones
    if domain is None:
        raise ComponentArgsError(
            f"BoundJob {resource_name!r}: invalid arguments\n  compute_domain: expected a "
            f"nvlfabric.ComputeDomain (got {type(compute_domain).__name__})")
    return args
