"""Whether a cluster offers Kubernetes' own workload scheduling, for a BoundJob to use it.

Kubernetes 1.37 has, behind gates that are off by default, what nvlfabric's controller otherwise
provides: gang pod groups (all of a group's pods are placed at once or none), a topology
constraint (all of a group's pods in one instance of a node label, the clique label here), and
claims reserved for a whole pod group instead of each pod (../shared/reference, "workload-aware
scheduling"). A cluster that serves the objects may still have a gate off, and an API server drops
the fields of a gate that is off: so beyond discovery, a PodGroup with a topology constraint and a
claim is created with `dryRun=All`, and only when both come back is the cluster's scheduling used.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta

from nvlfabric.api.names import CLIQUE_LABEL, SCHEDULING_API_GROUP, WORKLOAD_API_VERSIONS
from nvlfabric.clusterview.discovery import served
from nvlfabric.kube.errors import api_call

KINDS = {"workloads": "Workload", "podgroups": "PodGroup", "compositepodgroups": "CompositePodGroup"}
PROBE_NAME = "nvlfabric-probe"


@dataclass(frozen=True)
class WorkloadApis:
    """The apiVersion each kind is served in; `composite` None: no CompositePodGroup (then a job
    of several clique groups cannot be one gang)."""

    workload: str
    pod_group: str
    composite: str | None
    why_not: str = ""  # non-empty: served, but not usable (the reason)

    @property
    def usable(self) -> bool:
        return not self.why_not


def _served_version(client: Client, plural: str, namespace: str) -> str | None:
    for version in WORKLOAD_API_VERSIONS:
        if served(client, f"{SCHEDULING_API_GROUP}/{version}", KINDS[plural], plural, namespace):
            return f"{SCHEDULING_API_GROUP}/{version}"
    return None


def probe(client: Client, namespace: str) -> WorkloadApis | None:
    """What the cluster serves (None: no Workload or PodGroup at all), checked with a dry-run
    PodGroup in `namespace` (else `default`, for a namespace this stack has yet to create)."""
    workload = _served_version(client, "workloads", namespace)
    pod_group = _served_version(client, "podgroups", namespace)
    if workload is None or pod_group is None:
        return None
    composite = _served_version(client, "compositepodgroups", namespace)
    group, version = pod_group.split("/")
    res = create_namespaced_resource(group, version, "PodGroup", "podgroups")
    last = ""
    for ns in dict.fromkeys((namespace, "default")):
        obj = res(metadata=ObjectMeta(name=PROBE_NAME, namespace=ns), spec={
            "schedulingPolicy": {"gang": {"minCount": 1}},
            "schedulingConstraints": {"topology": [{"key": CLIQUE_LABEL}]},
            "resourceClaims": [{"name": "channel", "resourceClaimName": PROBE_NAME}]})
        try:
            with api_call(f"create PodGroup {ns}/{PROBE_NAME} (dry run)"):
                out = dict(client.create(obj, dry_run=True))
        except Exception as exc:
            last = str(exc)
            continue
        spec = out.get("spec") or {}
        missing = [what for what, present in (
            ("a topology constraint (gate TopologyAwareWorkloadScheduling)",
             (spec.get("schedulingConstraints") or {}).get("topology")),
            ("pod-group claims (gate DRAWorkloadResourceClaims)", spec.get("resourceClaims"))) if not present]
        why = "the API server drops " + " and ".join(missing) if missing else ""
        return WorkloadApis(workload, pod_group, composite, why_not=why)
    return WorkloadApis(workload, pod_group, composite, why_not=f"a dry-run PodGroup failed: {last}")
