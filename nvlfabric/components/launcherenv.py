"""What a distributed launcher reads in each pod of a BoundJob (pure; nvlfabric/api/names.py, "a
distributed launcher's environment"): the pod's rank, the world size, rank 0's address and port,
as NVLFABRIC_* and PyTorch's names, put ahead of each container's own env.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from nvlfabric.api.names import (
    JOB_COMPLETION_INDEX,
    LWS_LEADER_ADDRESS_ENV,
    LWS_WORKER_INDEX,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    NNODES_ENV,
    RANK_ANNOTATION,
    RANK_ENV,
    STATEFULSET_POD_INDEX,
    TORCH_MASTER_ADDR_ENV,
    TORCH_MASTER_PORT_ENV,
    TORCH_RANK_ENVS,
    TORCH_WORLD_SIZE_ENV,
    WORLD_SIZE_ENV,
)
from nvlfabric.components.workloadargs import JOBSET_REPLICATED_JOB, BoundJobArgs

#: Where each kind keeps a pod's index, read into the rank through the downward API. A JobSet's
#: one replicated Job has one replica, so its pods' completion indexes are already global ranks.
RANK_FIELD: Final[dict[str, str]] = {
    "Job": f"metadata.annotations['{JOB_COMPLETION_INDEX}']",
    "JobSet": f"metadata.annotations['{JOB_COMPLETION_INDEX}']",
    "StatefulSet": f"metadata.labels['{STATEFULSET_POD_INDEX}']",
    "LeaderWorkerSet": f"metadata.labels['{LWS_WORKER_INDEX}']",
}


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
    own pod index (downward API), the world size (an elastic job: its size range), rank 0's
    address and port."""
    # A LeaderWorkerSet's group is a launch of its own: its world is the group, its rank 0 the leader.
    world = str(args.lws_size or args.parallelism) if args.kind == "LeaderWorkerSet" else str(args.parallelism)
    port, master = str(args.master_port), master_address(args, namespace=namespace)

    # Over clique groups the rank is the controller's (group x group size + index): env cannot add.
    field = f"metadata.annotations['{RANK_ANNOTATION}']" if args.clique_groups > 1 else RANK_FIELD[args.kind]

    def rank(name: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}

    if args.elastic and args.kind != "LeaderWorkerSet":  # no size: the pods stay as the job grows and shrinks
        nnodes = {"name": NNODES_ENV, "value": f"{args.min_parallelism or 1}:{args.max_parallelism}"}
        return [rank(RANK_ENV), nnodes, {"name": MASTER_ADDR_ENV, "value": master},
                {"name": MASTER_PORT_ENV, "value": port}, *(rank(name) for name in TORCH_RANK_ENVS),
                {"name": TORCH_MASTER_ADDR_ENV, "value": master}, {"name": TORCH_MASTER_PORT_ENV, "value": port}]
    return [rank(RANK_ENV), {"name": WORLD_SIZE_ENV, "value": world},
            {"name": MASTER_ADDR_ENV, "value": master}, {"name": MASTER_PORT_ENV, "value": port},
            *(rank(name) for name in TORCH_RANK_ENVS), {"name": TORCH_WORLD_SIZE_ENV, "value": world},
            {"name": TORCH_MASTER_ADDR_ENV, "value": master}, {"name": TORCH_MASTER_PORT_ENV, "value": port}]


def add_launcher_env(tpl: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Put `env` ahead of each container's own, so the user's entries can refer to ours (`$(VAR)`
    expands only earlier entries); a name the user set is theirs and stays out of ours. Init
    containers too: a sidecar or a wait for rank 0 reads the same."""
    spec = tpl["spec"]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        own = {e.get("name") for e in c.get("env") or []}
        c["env"] = [*(copy.deepcopy(e) for e in env if e["name"] not in own), *(c.get("env") or [])]
