"""What runs now, for the report: read-only lists of pods and the racks' Nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from nvlfabric.api.names import COMPUTE_DOMAIN_LABEL, GPU_RESOURCE, RACK_LABEL, WORKLOAD_LABEL
from nvlfabric.clusterview import racks
from nvlfabric.kube.errors import api_call
from nvlfabric.review.impact import Facts, spares_of


def read(client: Client, rack_nodes: Mapping[str, Sequence[str]], gpu_resource: str = GPU_RESOURCE) -> Facts:
    """Running pods per domain and per workload (by nvlfabric's labels on them), and per rack its
    Nodes' GPUs and the free ones (as the rack component counts them at preview) and its spares (the
    largest nvlfabric.io/spares on its Nodes, as the controller reads a clique's). The racks are
    the cluster's (Nodes labelled nvlfabric.io/rack: a preview lists only the racks it changes)
    and `rack_nodes`, those the preview declares anew."""
    by_domain: dict[tuple[str, str], int] = {}
    by_workload: dict[tuple[str, str], int] = {}
    with api_call("list the pods of ComputeDomains"):
        pods = list(client.list(Pod, namespace="*", labels={COMPUTE_DOMAIN_LABEL: None}))
    for p in pods:
        if not p.metadata or not p.status or p.status.phase != "Running" or p.metadata.deletionTimestamp:
            continue
        labels, ns = p.metadata.labels or {}, p.metadata.namespace or "default"
        domain, workload = (ns, labels[COMPUTE_DOMAIN_LABEL]), labels.get(WORKLOAD_LABEL)
        by_domain[domain] = by_domain.get(domain, 0) + 1
        if workload:
            by_workload[(ns, workload)] = by_workload.get((ns, workload), 0) + 1
    racked: dict[str, list[str]] = {r: list(n) for r, n in rack_nodes.items()}
    listed: dict[str, Node] = {}
    with api_call("list the racks' Nodes"):
        for node in client.list(Node, labels={RACK_LABEL: None}):
            if node.metadata and node.metadata.name:
                listed[node.metadata.name] = node
                names = racked.setdefault((node.metadata.labels or {})[RACK_LABEL], [])
                if node.metadata.name not in names:
                    names.append(node.metadata.name)
    # Every rack's nodes in one go (the listed Nodes not read again): rack after rack costs a read
    # per rack, which grows with the fleet (docs/architecture.md, What the fleet runs taught us).
    everyone = sorted({n for nodes in racked.values() for n in nodes})
    seen = dict(zip(everyone, racks.observe(client, everyone, gpu_resource=gpu_resource, known=listed), strict=True))
    gpus, spares = {}, {}
    for rack, nodes in sorted(racked.items()):
        view = racks.summarize([seen[n] for n in nodes], None)
        gpus[rack] = (len(nodes), sum(n.gpus_allocatable for n in view.nodes if n.exists), view.free_gpus)
        if most := max((spares_of(meta.labels) for n in nodes if n in listed and (meta := listed[n].metadata)),
                       default=0):
            spares[rack] = most
    return Facts(running_by_domain=by_domain, running_by_workload=by_workload, rack_gpus=gpus, rack_spares=spares)
