"""What the program's cluster (`kubernetes:kubeconfig`, else $KUBECONFIG) serves, as BoundJob asks it
at preview: the CRDs of the kinds whose controllers are not part of Kubernetes, Kueue's LocalQueue,
and Kubernetes' workload scheduling.

Each answer is asked once per program run and kept in the run's registry (program.py): under the
Automation API, where one process runs inline programs again and again, each run asks the cluster
anew, so a CRD installed by one `up` is seen by the next `preview`. Outside a run (a script calling
`cluster_serves`, the component provider) the registry, and so the answer, is the process's.
"""

from __future__ import annotations

from typing import Final

import pulumi

from nvlfabric.clusterview import discovery, scheduling
from nvlfabric.clusterview.scheduling import WorkloadApis
from nvlfabric.components import program
from nvlfabric.components.workloadargs import JOBSET_API, LWS_API, WorkloadKind
from nvlfabric.provider import kube

#: The kinds whose controllers are not part of Kubernetes: their API, resource, project and the
#: simulator's addon that runs them (`nvlfabric-sim up --addons ...`).
CONTROLLED_KINDS: Final[dict[str, tuple[str, str, str, str]]] = {
    "JobSet": (JOBSET_API, "jobsets", "JobSet (https://jobset.sigs.k8s.io)", "jobset"),
    "LeaderWorkerSet": (LWS_API, "leaderworkersets", "LeaderWorkerSet (https://lws.sigs.k8s.io)", "lws"),
}
#: What `scheduler: kubernetes` assumes of a cluster it could not read at preview (1.37's versions).
DEFAULT_WORKLOAD_APIS: Final = WorkloadApis("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1beta1",
                                            "scheduling.k8s.io/v1alpha3")


def kubeconfig_source() -> str:
    """The program's kubeconfig as `kube.client` takes it: `kubernetes:kubeconfig`, else $KUBECONFIG's."""
    return kube.kubeconfig_source(pulumi.Config("kubernetes").get("kubeconfig"))


def cluster_serves(kind: WorkloadKind, namespace: str = "default") -> bool | None:
    """Whether the program's cluster (`kubernetes:kubeconfig`, else $KUBECONFIG) serves `kind`:
    Job and StatefulSet always; JobSet and LeaderWorkerSet once their CRDs are installed. None:
    the cluster could not be read. A stack can declare a JobSet-bound job only where JobSet runs."""
    if kind not in CONTROLLED_KINDS:
        return True
    api, plural, _, _ = CONTROLLED_KINDS[kind]
    return api_served(api, kind, plural, namespace)


def api_served(api: str, kind: str, plural: str, namespace: str) -> bool | None:
    """`discovery.served` on the program's cluster, once per program run (None: it cannot be read)."""
    source = kubeconfig_source()
    served = program.current().served
    if (source, namespace, api, kind) not in served:
        try:
            client = kube.client(source)
        except Exception:  # no kubeconfig to read: nothing to say
            return None
        served[source, namespace, api, kind] = discovery.served(client, api, kind, plural, namespace)
    return served[source, namespace, api, kind]


def scheduling_apis(namespace: str) -> WorkloadApis | None:
    """`scheduling.probe` of the program's cluster in `namespace`, once per program run (None: it
    offers no workload scheduling). Raises when the cluster cannot be read."""
    source = kubeconfig_source()
    probes = program.current().scheduling
    if (source, namespace) not in probes:
        probes[source, namespace] = scheduling.probe(kube.client(source), namespace)
    return probes[source, namespace]
