"""The Kubernetes objects of a BoundJob's workload (pure, dicts in the API's shape): per kind the Job,
StatefulSet, JobSet or LeaderWorkerSet with the bound pod template inside, the headless Service a
Job or a StatefulSet needs for stable pod names, one workload per clique group over a MultiClique
domain, and first the pod groups when Kubernetes schedules the job (podgroups.py).
"""

from __future__ import annotations

import copy
from typing import Any, Final

from nvlfabric.api.names import CLIQUE_GROUP_LABEL, COMPUTE_DOMAIN_LABEL, KUEUE_QUEUE_LABEL, WORKLOAD_LABEL
from nvlfabric.clusterview.scheduling import WorkloadApis
from nvlfabric.components.args import labels as nvl_labels
from nvlfabric.components.launcherenv import add_launcher_env, launcher_env
from nvlfabric.components.podgroups import pod_group_manifests, pod_group_name
from nvlfabric.components.podtemplate import bound_pod_template
from nvlfabric.components.workloadargs import BATCH_KINDS, JOBSET_API, JOBSET_REPLICATED_JOB, LWS_API, BoundJobArgs

NOT_AWAITED: Final = {"pulumi.com/skipAwait": "true", "pulumi.com/deletionPropagationPolicy": "background"}
"""A Job or StatefulSet that `pulumi up` does not wait for (wait=False). Not `waitFor` on a field
the created object already has: pulumi-kubernetes' refresh still runs its own readiness check of
these two kinds (a Job: complete; a StatefulSet: every replica ready) and would record a running
Job as "failed to initialize", so that every `preview` after a `refresh` shows it as an update
with an empty diff. skipAwait skips that check too, and the delete await as well (for these two kinds),
so deletion is in the background (the Job object goes at once: a replacement of the same name is
created right after it) and the ComputeDomain, deleted after its workloads, waits for their pods
to stop (nvlfabric/provider/computedomain.py)."""


DISRUPTION_POLICY: Final = {"rules": [{"action": "Ignore",
                                       "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}
"""The podFailurePolicy of every Job BoundJob makes whose pods' restartPolicy is Never (a Job, each
of a MultiClique domain's Jobs, each JobSet replicated Job's template). With `backoffLimit: 0` and
no policy, one failed pod fails the whole Job (and a JobSet's Job restarts or fails the JobSet).
A pod failed as disrupted, with condition DisruptionTarget True, did not fail by itself: its node
was lost (nvlfabric's controller marks a lost member node's pods so, reason DeletionByNvlfabric,
and deletes them, as PodGC does), or the taint manager, PodGC, preemption or the Eviction API took
it. Ignore replaces such a pod without counting it against backoffLimit, and the replacement
(created once the old pod is terminal: podReplacementPolicy defaults to Failed under a policy)
lands in the same clique on a free node; any other failure still fails the Job. A Job whose pods
restart OnFailure (the user's template may say so) cannot carry a podFailurePolicy and has none.
Immutable once the Job exists: CREATED_ONLY keeps it off the Jobs created before.

With it, PER_INDEX: each index has its own pod-recreation back-off. The Job controller waits
10 s x 2^(failures - 1) before it creates a failed pod again, ignored failures counted too, and
without a per-index limit it counts every failure of the Job since its last success: measured
on the simulator, three member nodes lost in a row under one 16-pod Job were replaced after 10,
20 and 40 s. Per index, each index's first loss costs 10 s. `backoffLimitPerIndex: 0` with
`maxFailedIndexes: 0` fails the Job at its first failure that is not ignored, as backoffLimit 0
does (which stays, for readers of the spec)."""

PER_INDEX: Final = {"backoffLimitPerIndex": 0, "maxFailedIndexes": 0}
"""A Job's per-index failure accounting (see DISRUPTION_POLICY): one failure fails the Job, and
each index has a back-off of its own."""

_CREATED_ONLY_FIELDS: Final = ("podFailurePolicy", *PER_INDEX)
CREATED_ONLY: Final[dict[str, tuple[str, ...]]] = {
    "Job": tuple(f"spec.{f}" for f in _CREATED_ONLY_FIELDS),
    "JobSet": tuple(f"spec.replicatedJobs[*].template.spec.{f}" for f in _CREATED_ONLY_FIELDS),
}
"""Per workload kind, the fields (Pulumi property paths) that only objects created since they were
added get: workload.py passes them as the resource's `ignore_changes`. A Job's podFailurePolicy
and backoffLimitPerIndex are immutable, and so are a JobSet's replicatedJobs: on a Job or JobSet
already in a stack's state (created by an earlier release, without them), a diff there would make `pulumi up` replace
the running workload (or fail on the API server's refusal). Ignored, the state's value (none)
stands in for the program's on update, and the program's applies on create."""


ELASTIC_SIZE: Final = ("spec.parallelism", "spec.completions")
"""An elastic Job's fields (Pulumi property paths) its resource ignores: its size, which
pulumi-kubernetes could change only by replacing the Job, is set in place by the Job's
JobParallelism resource (nvlfabric/provider/jobparallelism.py)."""


def _headless_service(args: BoundJobArgs, *, namespace: str, labels: dict[str, str],
                      selector: dict[str, str]) -> dict[str, Any]:
    """The Service that gives each pod its DNS name; not-ready pods are published too, since
    rank 0 must be found while the others are still starting."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": args.name, "namespace": namespace,
                                                                 "labels": labels},
            "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True}}


def _job_spec(args: BoundJobArgs, tpl: dict[str, Any]) -> dict[str, Any]:
    n, k = args.group_size, args.clique_groups
    # An elastic Indexed Job: completions follows parallelism (Kubernetes lets both change together).
    spec = {"parallelism": n, "completions": (args.completions or args.parallelism) // k,
            "completionMode": "Indexed", "backoffLimit": 0, "template": tpl}
    if tpl["spec"].get("restartPolicy") == "Never":  # (OnFailure: Kubernetes refuses a policy)
        spec["podFailurePolicy"] = copy.deepcopy(DISRUPTION_POLICY)
        spec.update(PER_INDEX)
    return spec


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
    # is not awaited at all (NOT_AWAITED).
    annotations = {"pulumi.com/deletionPropagationPolicy": "foreground"}
    meta = {"name": args.name, "namespace": namespace, "annotations": annotations, "labels": labels}
    n = args.parallelism
    selector = {COMPUTE_DOMAIN_LABEL: domain, WORKLOAD_LABEL: args.name}
    tpl["metadata"]["labels"].update(selector)
    add_launcher_env(tpl, launcher_env(args, namespace=namespace))
    if args.kind == "Job":
        # (No batch.kubernetes.io/job-name label of ours: the API server adds it to the pods, and
        # pulumi-kubernetes dry-runs a replacement of the Job (a pod template change) under a
        # generated name, which such a label would contradict, failing the preview.)
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
    # lws_size: several groups of that many pods, replicas the groups (an elastic one's changes in place).
    return [{"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta, "spec": {
        "replicas": args.lws_groups, "startupPolicy": "LeaderCreated",
        "leaderWorkerTemplate": {"size": args.lws_size or n, "workerTemplate": tpl}}}]


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
        add_launcher_env(tpl, env)
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
            tpl["metadata"]["labels"][CLIQUE_GROUP_LABEL] = str(g)
            out.append({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": built_in(name), "spec": {
                            "replicas": args.group_size, "serviceName": args.name, "podManagementPolicy": "Parallel",
                            "selector": {"matchLabels": {**selector, CLIQUE_GROUP_LABEL: str(g)}},
                            "template": tpl}})
    for m in out[1:]:
        if not m["metadata"]["annotations"]["pulumi.com/waitFor"]:
            del m["metadata"]["annotations"]["pulumi.com/waitFor"]
    return out


def job_manifest(args: BoundJobArgs, *, namespace: str, claim_name: Any, domain: str) -> dict[str, Any]:
    """The workload object itself (for `kind: Job`, the Job)."""
    return workload_manifests(args, namespace=namespace, claim_name=claim_name, domain=domain)[-1]
