"""What the on-simulator workload tests share: a ComputeDomain made as the provider makes it, the
workload's Running pods, and what the simulated runtime recorded for a container."""

from __future__ import annotations

import json
from typing import Any

from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from nvlfabric.api.computedomain import ComputeDomainSpec, channel_claim_names
from nvlfabric.api.names import WORKLOAD_LABEL
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.testbed.controlplane import ControlPlane


def single_clique_domain(client: Client, name: str) -> str:
    """A single-clique ComputeDomain in `default` and its channel claim; the claim's name."""
    return domain(client, name, ComputeDomainSpec())[0]


def multi_clique_domain(client: Client, name: str, *, cliques: int, num_nodes: int) -> list[str]:
    """A MultiClique ComputeDomain of `cliques` groups in `default` and its claims; their names."""
    return domain(client, name, ComputeDomainSpec.model_validate(
        {"numNodes": num_nodes, "placement": {"scope": "MultiClique", "cliques": cliques}}))


def domain(client: Client, name: str, spec: ComputeDomainSpec) -> list[str]:
    """A ComputeDomain in `default` and its channel claims, as the provider makes them; the claims' names."""
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"),
                                             spec=spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    for g in range(spec.groups):
        client.create(codecs.from_dict(channel_claim(name, "default", cd.metadata.uid, spec, g)))
    return channel_claim_names(name, spec)


def running(client: Client, workload: str, n: int) -> list[Pod] | None:
    """The workload's `n` pods once exactly that many run (none being deleted), else None."""
    pods = [p for p in client.list(Pod, namespace="default", labels={WORKLOAD_LABEL: workload})
            if p.status and p.status.phase == "Running" and p.metadata.deletionTimestamp is None]
    return pods if len(pods) == n else None


def container_record(cp: ControlPlane, pod: Pod, container: str) -> dict[str, Any]:
    """What the simulated runtime was given for the container: its resolved env, command, devices."""
    path = cp.state_dir / "nodes" / pod.spec.nodeName / "containers" / f"default_{pod.metadata.name}_{container}.json"
    return dict(json.loads(path.read_text()))
