"""BoundJob's arguments: the workload kinds, the pydantic model `BoundJobArgs` and its checks
across fields (the pod template's own are templatechecks.py's).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvlfabric.api.names import (
    DEFAULT_MASTER_PORT,
    DNS_LABEL,
    DNS_LABEL_MAX,
    GPU_RESOURCE,
    GPUS_PER_CLIQUE,
    GPUS_PER_NODE,
    KUEUE_QUEUE_LABEL,
    MASTER_PORT_ENV,
    MAX_CLIQUES_PER_DOMAIN,
    MAX_PODS_PER_CLAIM,
    PLACEMENT_CHECK_CONTROLLER,
    RESERVATION_GATE,
)
from nvlfabric.api.nvidia import CLIQUE_LABEL as NVIDIA_CLIQUE_LABEL
from nvlfabric.api.nvidia import Backend
from nvlfabric.components.templatechecks import check_pod_template

WorkloadKind = Literal["Job", "StatefulSet", "JobSet", "LeaderWorkerSet"]
Scheduler = Literal["auto", "nvlfabric", "kubernetes"]
#: Kinds whose pods run to completion (restartPolicy Never/OnFailure); the others keep running (Always).
BATCH_KINDS: Final = ("Job", "JobSet")
JOBSET_API: Final = "jobset.x-k8s.io/v1alpha2"
LWS_API: Final = "leaderworkerset.x-k8s.io/v1"
JOBSET_REPLICATED_JOB: Final = "workers"
MAX_JOBSET_RESTARTS: Final = 1000


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
    max_parallelism: int | None = Field(
        None, ge=1, le=MAX_PODS_PER_CLAIM,
        description="makes the job elastic: the most pods it may grow to. `pulumi up` with another parallelism "
                    "(min_parallelism..max_parallelism) then grows or shrinks the running job in place: new pods "
                    "join its ComputeDomain, the highest indexes leave, the others keep running. The pods' "
                    "template does not depend on the size (no world size in their env: "
                    "NVLFABRIC_NNODES=<min>:<max> for the launcher's rendezvous). Job or StatefulSet over a "
                    "single-clique domain; setting it on an existing job replaces it once")
    min_parallelism: int | None = Field(None, ge=1, le=MAX_PODS_PER_CLAIM,
                                        description="an elastic job's fewest pods (default 1): nvlfabric places "
                                                    "that many at once, and the others as they come")
    completions: int | None = Field(None, ge=1, description="pods that must succeed (default: parallelism; "
                                                            "Job and JobSet only)")
    lws_size: int | None = Field(None, ge=1, le=MAX_PODS_PER_CLAIM,
                                 description="LeaderWorkerSet only: pods per group (leader and workers, its "
                                             "leaderWorkerTemplate.size); parallelism is then the pods of all "
                                             "groups, a multiple of it, each group a launch of its own (ranks "
                                             "0..lws_size-1, its leader as rank 0), and an elastic "
                                             "LeaderWorkerSet grows and shrinks by whole groups (default: one "
                                             "group of parallelism pods)")
    gpus_per_pod: int = Field(GPUS_PER_NODE, ge=0, le=GPUS_PER_NODE,
                              description=f"GPUs per pod, 0..{GPUS_PER_NODE} "
                                          f"(a GB200 compute tray has {GPUS_PER_NODE})")
    gpu_resource: str | None = Field(GPU_RESOURCE,
                                     description="the extended resource GPUs are requested as; None requests none "
                                                 "(GPUs allocated by another DRA driver). Without GPU requests "
                                                 "nothing spreads the pods over nodes: a domain's numNodes may "
                                                 "then never be reached")
    max_restarts: int = Field(0, ge=0, le=MAX_JOBSET_RESTARTS,
                              description="JobSet only: how often JobSet recreates all its Jobs after one fails "
                                          "(its failurePolicy, each old pod gone before the new ones start); the "
                                          "ComputeDomain, its claims and channels stay, and the new pods join the "
                                          "same IMEX domain (default 0: the first failure fails the JobSet)")
    queue_name: str | None = Field(None, pattern=DNS_LABEL, max_length=DNS_LABEL_MAX,
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
                                                     "at preview, else nvlfabric); over a ComputeDomain of backend "
                                                     "nvidia, kube-scheduler alone (the output scheduler then says "
                                                     "'kube-scheduler')")
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
        return not (self.gpu_resource and self.most_pods * self.gpus_per_pod > GPUS_PER_CLIQUE)

    @property
    def group_size(self) -> int:
        """Pods per clique group (all of them over a single-clique domain)."""
        return self.parallelism // self.clique_groups

    @property
    def elastic(self) -> bool:
        """Whether `pulumi up` may change the running job's size in place (max_parallelism is set)."""
        return self.max_parallelism is not None

    @property
    def most_pods(self) -> int:
        """The pods the domain must have room for: max_parallelism when elastic, else parallelism."""
        return self.max_parallelism if self.max_parallelism is not None else self.parallelism

    @property
    def gang_size(self) -> int:
        """The pods placed at once in a clique group (the pods' group-size annotation): the group
        size, or an elastic job's min_parallelism (a constant, so the pod template stays the same
        at every size; the pods past it join one by one)."""
        if self.elastic:
            # A LeaderWorkerSet's groups come whole: each is placed at once (its leader waits for them).
            return self.lws_size or self.min_parallelism or 1
        return self.group_size

    @field_validator("pod_template")
    @classmethod
    def _template(cls, tpl: dict[str, Any]) -> dict[str, Any]:
        check_pod_template(tpl)
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
        if self.lws_size is not None:
            self._lws_groups()
        if self.kind not in BATCH_KINDS and self.completions is not None:
            raise ValueError(f"completions applies to Job and JobSet, not {self.kind}: leave it unset")
        if self.completions is not None and self.completions < self.parallelism:
            raise ValueError(f"completions ({self.completions}) must be >= parallelism ({self.parallelism})")
        self._elastic()
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
        most = self.most_pods // k
        size = "max_parallelism" if self.elastic else "parallelism"
        if most > MAX_PODS_PER_CLAIM:
            per = size if k == 1 else f"parallelism / {k} clique groups"
            raise ValueError(
                f"{per} = {most} pods share one channel claim, more than its reservedFor holds "
                f"({MAX_PODS_PER_CLAIM}): use at most {MAX_PODS_PER_CLAIM * k} pods, or a MultiClique ComputeDomain "
                "with more cliques")
        if self.gpu_resource and most * self.gpus_per_pod > GPUS_PER_CLIQUE:
            group = f"{size} x gpus_per_pod" if k == 1 else f"parallelism / {k} clique groups x gpus_per_pod"
            raise ValueError(
                f"{group} = {most * self.gpus_per_pod} GPUs, more than one NVL72 clique has "
                f"({GPUS_PER_CLIQUE}); a ComputeDomain's group lives in one clique: use fewer pods or GPUs per pod, "
                "or a MultiClique ComputeDomain (placement: {scope: MultiClique, cliques: N}) with more cliques")
        return self

    def _elastic(self) -> None:
        """An elastic job's checks: a size range around parallelism, and a shape whose size can
        change in place (why the others cannot is said)."""
        if not self.elastic:
            if self.min_parallelism is not None:
                raise ValueError("min_parallelism without max_parallelism: set max_parallelism too to make the job "
                                 "elastic, or leave min_parallelism unset")
            return
        assert self.max_parallelism is not None
        low = self.min_parallelism or 1
        if not low <= self.parallelism <= self.max_parallelism:
            raise ValueError(f"parallelism {self.parallelism} is outside the elastic range "
                             f"min_parallelism..max_parallelism ({low}..{self.max_parallelism}): widen the range "
                             "or pick a parallelism in it")
        if self.kind == "JobSet":
            raise ValueError("max_parallelism on a JobSet: a JobSet's replicated Jobs are immutable, so its size "
                             "cannot change in place: use kind Job (an elastic Indexed Job) or StatefulSet")
        if self.kind == "LeaderWorkerSet" and self.lws_size is None:
            raise ValueError("max_parallelism on a LeaderWorkerSet without lws_size: its one group's size is part of "
                             "its template, whose change restarts every group; set lws_size (pods per group) to grow "
                             "and shrink it by whole groups, or use kind Job or StatefulSet")
        if self.clique_groups > 1:
            raise ValueError(f"max_parallelism over a MultiClique domain ({self.clique_groups} clique groups): a pod's "
                             "rank there is its group x the group size, which a new size would change under "
                             "the running pods; use a single-clique ComputeDomain")
        if self.completions is not None:
            raise ValueError("completions on an elastic job: an elastic Indexed Job completes when all its "
                             "parallelism pods have (Kubernetes scales completions with parallelism): leave it unset")
        if self.scheduler == "kubernetes":
            raise ValueError("scheduler='kubernetes' on an elastic job: a PodGroup's gang is a fixed size; leave "
                             "scheduler unset (nvlfabric's controller places an elastic job's pods as they come)")
        if self.queue_name is not None:
            raise ValueError("queue_name on an elastic job: Kueue admits a job at the size it was queued with; "
                             "leave queue_name unset or max_parallelism unset")

    def _lws_groups(self) -> None:
        """A LeaderWorkerSet of several groups: every size a whole number of them."""
        size = self.lws_size
        assert size is not None
        if self.kind != "LeaderWorkerSet":
            raise ValueError(f"lws_size applies to a LeaderWorkerSet (pods per group), not {self.kind}: leave it unset")
        sizes = {"parallelism": self.parallelism, "max_parallelism": self.max_parallelism,
                 "min_parallelism": self.min_parallelism}
        for field_name, value in sizes.items():
            if value is not None and value % size:
                raise ValueError(f"{field_name} {value} is not a whole number of LeaderWorkerSet groups of lws_size "
                                 f"{size}: use a multiple of {size}")

    @property
    def lws_groups(self) -> int:
        """A LeaderWorkerSet's replicas: its groups."""
        return self.parallelism // (self.lws_size or self.parallelism)

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
