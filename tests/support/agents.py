"""Helpers of the end-to-end tests that run nvlfabric's agents on the simulator: a domain with a
pod per node (as the provider creates them), what the simulated runtime applied to a container,
the IMEX daemon a node's keeper runs."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path

from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSchedulingGate, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from nvlfabric.api import computedomain as api
from nvlfabric.api.names import DRIVER, GPU_RESOURCE, RESERVATION_GATE
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.nodes import SimNode


def domain_with_pods(client: Client, name: str, nodes: list[str], spec: dict[str, object] | None = None, *,
                     gpus: int = 0, image: str = "registry.invalid/train:1", command: list[str] | None = None) -> str:
    """A ComputeDomain, its shared channel claim (as the provider creates them) and a pod per node;
    returns the domain's UID. `gpus`: each pod asks for that many nvidia.com/gpu and waits behind
    the reservation gate for the controller to place it, as BoundJob's pods do. `image` and
    `command`: what the pods run (a simulated node runs nothing for an image it does not map; a
    containerd node needs an image it holds)."""
    spec = spec or {}
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec=spec))
    # The driver's admission policy admits a channel claim only as its domain's own (owned, configured).
    client.create(codecs.from_dict(channel_claim(name, "default", cd.metadata.uid,
                                                 api.ComputeDomainSpec.model_validate(spec))))
    for i, node in enumerate(nodes):
        client.create(Pod(metadata=ObjectMeta(name=f"{name}-{i}", namespace="default"), spec=PodSpec(
            nodeSelector={"kubernetes.io/hostname": node},
            schedulingGates=[PodSchedulingGate(name=RESERVATION_GATE)] if gpus else None,
            resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{name}-channel")],
            containers=[Container(name="worker", image=image, command=command, resources=ResourceRequirements(
                claims=[ContainerClaim(name="channel")], limits={GPU_RESOURCE: str(gpus)} if gpus else None))])))
    return str(cd.metadata.uid)


def edits(state: Path, node: str, pod: str, container: str = "worker", namespace: str = "default") -> dict[str, object]:
    """The CDI edits the simulated runtime applied to a container of pod `namespace`/`pod`."""
    return json.loads((state / "nodes" / node / "containers" / f"{namespace}_{pod}_{container}.json").read_text())


def daemons_using(config_path: str) -> list[int]:
    """Live `nvidia-imex` processes whose command line names `config_path` as their config (`-c <path>`)."""
    wanted = config_path.encode()
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            if (os.path.basename(argv[0]) == b"nvidia-imex" and stat[0] != "Z"
                    and any(a == b"-c" and b == wanted for a, b in itertools.pairwise(argv))):
                found.append(int(entry.name))
    return found


def imex_daemon(node: SimNode, clique: str, domain: str | None = None) -> tuple[list[int], str]:
    """(pids of the clique's nvidia-imex on `node`, its nodes file; "" when it has none); a
    Dedicated domain's with `domain` (its uid). The daemon names its config by the keeper's path
    (every node's is the same), so it is told apart by its node's processes."""
    work = f"plugins/{DRIVER}/imex/" + (f"cd-{domain}" if domain else f"clique-{clique}")
    nodes = node.kubelet_root / work / "nodes.cfg"
    pids = [p for p in daemons_using(f"/var/lib/kubelet/{work}/config.cfg") if node.runs(p)]
    return pids, nodes.read_text() if nodes.exists() else ""


def pod_gone(client: Client, pod: str) -> bool:
    """Whether pod `default`/`pod` is deleted (404)."""
    try:
        client.get(Pod, pod, namespace="default")
    except ApiError as exc:
        return exc.status.code == 404
    return False
