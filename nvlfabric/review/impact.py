"""What a preview does to the cluster, as a reviewer needs it (pure: preview + cluster facts → report).

- **Domains**: each ComputeDomain the preview creates, updates, replaces or deletes, with the
  reason (the replace reasons, else the changed fields), and for a replace or delete the running
  pods of the domain that lose their channel (from the cluster: pods labelled with the domain).
- **Workloads**: each bound workload (the Job, StatefulSet, JobSet or LeaderWorkerSet of a
  BoundJob) with its pods and GPUs, and for a replace or delete its running pods.
- **Capacity**: per declared rack (its Nodes, from the rack's node-labelling step) its GPUs and the
  free ones (from the cluster), against the GPUs of the workloads the preview creates or replaces,
  and its hot spares (`nvlfabric.io/spares`: the preview's declaration, else its Nodes' labels).
- **Warnings** the components logged (capacity shortfalls, racks whose nodes disagree), and errors.

Without the cluster the facts are unknown, and the report says so instead of guessing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvlfabric.api.names import (
    COMPUTE_DOMAIN_TYPES,
    GPU_RESOURCE,
    RACK_LABEL,
    RACK_NODES_TYPES,
    SPARES_LABEL,
    WORKLOAD_LABEL,
)
from nvlfabric.review.preview import REPLACE_OPS, Preview, Step

DOMAIN_TYPES = frozenset(COMPUTE_DOMAIN_TYPES)
WORKLOAD_TYPES = {"kubernetes:batch/v1:Job": "Job", "kubernetes:apps/v1:StatefulSet": "StatefulSet",
                  "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet": "JobSet",
                  "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": "LeaderWorkerSet"}
BOUND_JOB = "nvlfabric:index:BoundJob"
RACK = "nvlfabric:index:Nvl72Rack"
CHANGING = ("create", "update", "replace", "delete")
GPU = GPU_RESOURCE


@dataclass(frozen=True)
class Facts:
    """What runs now, read from the cluster (nvlfabric/review/cluster.py)."""

    running_by_domain: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(namespace, domain) → Running pods labelled nvlfabric.io/compute-domain=<domain>."""
    running_by_workload: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(namespace, workload) → Running pods labelled nvlfabric.io/workload=<workload>."""
    rack_gpus: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    """rack → (its Nodes, GPUs allocatable on them, free of those)."""
    rack_spares: Mapping[str, int] = field(default_factory=dict)
    """rack → the spares its Nodes' nvlfabric.io/spares labels say (the largest), for racks with any."""


@dataclass(frozen=True)
class DomainChange:
    ref: str
    op: str
    reasons: tuple[str, ...]
    running: int | None  # pods that lose their channel (replace, delete); None: unknown or not applicable


@dataclass(frozen=True)
class WorkloadChange:
    kind: str
    ref: str
    op: str
    pods: int
    gpus: int
    running: int | None


@dataclass(frozen=True)
class OtherChange:
    """Any other resource the preview changes (the driver's objects, a rack's node labels)."""

    what: str  # "Deployment nvlfabric-system/nvlfabric-controller"
    op: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class RackRow:
    name: str
    nodes: int
    gpus: int | None
    free_gpus: int | None
    spares: int = 0
    """Nodes kept free for replacements (nvlfabric.io/spares), as the preview leaves it."""
    spares_before: int | None = None
    """What it was, when the preview changes it (None: unchanged, or a new rack)."""


@dataclass(frozen=True)
class Report:
    summary: Mapping[str, int]
    domains: tuple[DomainChange, ...]
    workloads: tuple[WorkloadChange, ...]
    others: tuple[OtherChange, ...]
    racks: tuple[RackRow, ...]
    asked_gpus: int
    """GPUs of the workloads the preview creates or replaces."""
    warnings: tuple[tuple[str, str], ...]
    errors: tuple[tuple[str, str], ...]
    cluster_known: bool


def _op(step: Step) -> str:
    return "replace" if step.op in REPLACE_OPS else step.op


def _steps(preview: Preview) -> list[Step]:
    """One step per resource and change: a replace listed as its two halves counts once."""
    out, seen = [], set()
    for s in preview.steps:
        key = (s.urn, _op(s))
        if _op(s) in CHANGING and key not in seen:
            seen.add(key)
            out.append(s)
    return out


def _ref(inputs: Mapping[str, Any]) -> tuple[str, str]:
    meta = inputs.get("metadata") if isinstance(inputs.get("metadata"), Mapping) else inputs
    assert isinstance(meta, Mapping)
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _running(op: str, table: Mapping[tuple[str, str], int], key: tuple[str, str], known: bool) -> int | None:
    return table.get(key, 0) if known and op in ("replace", "delete") else None


def _pods_and_gpus(kind: str, inputs: Mapping[str, Any]) -> tuple[int, int]:
    spec = inputs.get("spec") or {}
    if kind == "Job":
        pods, tpl = spec.get("parallelism") or 1, spec.get("template") or {}
    elif kind == "StatefulSet":
        pods, tpl = spec.get("replicas") or 1, spec.get("template") or {}
    elif kind == "JobSet":
        jobs = spec.get("replicatedJobs") or [{}]
        job = (jobs[0].get("template") or {}).get("spec") or {}
        # Each replicated Job is `replicas` Jobs of `parallelism` pods (BoundJob's: one Job per group).
        pods = sum((j.get("replicas") or 1) * ((j.get("template") or {}).get("spec", {}).get("parallelism") or 1)
                   for j in jobs)
        tpl = job.get("template") or {}
    else:
        lwt = spec.get("leaderWorkerTemplate") or {}
        pods, tpl = lwt.get("size") or 1, lwt.get("workerTemplate") or {}
    per_pod = 0
    for c in (tpl.get("spec") or {}).get("containers") or []:
        with contextlib.suppress(ValueError):
            per_pod += int(str(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)))
    return int(pods), int(pods) * per_pod


def declared_racks(preview: Preview) -> dict[str, list[str]]:
    """Rack → its Nodes, for the racks whose node patches the preview lists (it lists only what
    changes: the cluster knows the others)."""
    racks: dict[str, list[str]] = {}
    for s in preview.steps:
        if RACK not in s.parent_types or s.op == "delete":
            continue
        if s.type in RACK_NODES_TYPES:
            rack = (s.state.inputs.get("labels") or {}).get(RACK_LABEL)
            if rack:
                racks.setdefault(str(rack), []).extend(str(n) for n in s.state.inputs.get("nodes") or [])
        elif s.type == "kubernetes:core/v1:NodePatch":  # racks of releases before 0.2: a patch per node
            meta = s.state.inputs.get("metadata") or {}
            rack = (meta.get("labels") or {}).get(RACK_LABEL)
            if rack:
                racks.setdefault(str(rack), []).append(str(meta.get("name")))
    return racks


def spares_of(labels: Mapping[str, Any] | None) -> int:
    """A rack's spares from its labels (0 without the label, or with one that is not a count)."""
    try:
        return max(0, int(str((labels or {}).get(SPARES_LABEL, 0))))
    except ValueError:
        return 0


def declared_spares(preview: Preview) -> dict[str, tuple[int, int | None]]:
    """Rack → (its spares after the preview, before it when the preview changes them), for the racks
    whose node labelling the preview lists."""
    out: dict[str, tuple[int, int | None]] = {}
    for s in preview.steps:
        if RACK not in s.parent_types or s.op == "delete" or s.type not in RACK_NODES_TYPES:
            continue
        labels = s.state.inputs.get("labels") or {}
        rack = labels.get(RACK_LABEL)
        if not rack:
            continue
        now = spares_of(labels)
        before = spares_of(s.old_state.inputs.get("labels")) if s.old_state is not None else None
        out[str(rack)] = (now, before if before is not None and before != now else None)
    return out


def _rack_row(name: str, gpus: tuple[int, int | None, int | None], spares: tuple[int, int | None]) -> RackRow:
    return RackRow(name, *gpus, spares=spares[0], spares_before=spares[1])


def build(preview: Preview, facts: Facts | None) -> Report:
    known = facts is not None
    f = facts or Facts()
    domains, workloads, others = [], [], []
    racks = declared_racks(preview)
    asked = 0
    for s in _steps(preview):
        op = _op(s)
        if s.type in DOMAIN_TYPES:
            inputs = s.state.inputs
            key = (str(inputs.get("namespace") or "default"), str(inputs.get("name") or s.name))
            domains.append(DomainChange(f"{key[0]}/{key[1]}", op, tuple(s.changed_fields()) if op != "create" else (),
                                        _running(op, f.running_by_domain, key, known)))
        elif s.type in WORKLOAD_TYPES and BOUND_JOB in s.parent_types:
            kind = WORKLOAD_TYPES[s.type]
            key = _ref(s.state.inputs)
            pods, gpus = _pods_and_gpus(kind, s.state.inputs)
            if op in ("create", "replace"):
                asked += gpus
            workloads.append(WorkloadChange(kind, f"{key[0]}/{key[1]}", op, pods, gpus,
                                            _running(op, f.running_by_workload, (key[0], _workload(key[1], s)),
                                                     known)))
        elif s.type.startswith("kubernetes:") and not s.type.startswith("kubernetes:yaml"):
            ns, name = _ref(s.state.inputs)
            kind = s.type.rsplit(":", 1)[-1]
            scoped = f"{ns}/{name}" if (s.state.inputs.get("metadata") or {}).get("namespace") else name
            others.append(OtherChange(f"{kind} {scoped}", op, tuple(s.changed_fields()) if op != "create" else ()))
    spares = {r: (n, None) for r, n in f.rack_spares.items()} | declared_spares(preview)
    rows = tuple(_rack_row(name, f.rack_gpus.get(name, (len(nodes), None, None)), spares.get(name, (0, None)))
                 for name, nodes in sorted({**{r: [] for r in f.rack_gpus}, **racks}.items()))
    warnings = tuple(dict.fromkeys((_who(d.urn), d.message.strip().removeprefix("warning: "))
                                   for d in preview.diagnostics if d.severity == "warning"))
    errors = tuple(dict.fromkeys((_who(d.urn), d.message.strip().removeprefix("error: "))
                                 for d in preview.diagnostics if d.severity == "error"))
    return Report(summary={k: v for k, v in preview.change_summary.items() if k != "same"},
                  domains=tuple(sorted(domains, key=lambda d: (d.ref, d.op))),
                  workloads=tuple(sorted(workloads, key=lambda w: (w.ref, w.op))),
                  others=tuple(sorted(others, key=lambda o: (o.what, o.op))), racks=rows, asked_gpus=asked,
                  warnings=warnings, errors=errors, cluster_known=known)


def _workload(object_name: str, step: Step) -> str:
    """The BoundJob's name, which its pods carry (a multi-clique Job `<name>-<g>` is one group of it)."""
    labels = ((step.state.inputs.get("metadata") or {}).get("labels") or {})
    return str(labels.get(WORKLOAD_LABEL) or _template_label(step) or object_name)


def _template_label(step: Step) -> str | None:
    spec = step.state.inputs.get("spec") or {}
    tpl = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}
    return ((tpl.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL)


def _who(urn: str) -> str:
    """'Type name' of a diagnostic's resource ('' for the stack's own)."""
    if not urn:
        return ""
    kind = urn.split("::")[-2].split("$")[-1].split(":")[-1]
    return "" if kind == "Stack" else f"{kind} {urn.split('::')[-1]}"
