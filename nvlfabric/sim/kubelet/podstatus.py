"""Pod status as the kubelet's status manager writes it: Pending while init containers run,
Running (containers' readiness, restarts, last terminations, device health), Succeeded after a
Job pod's run time, and re-writes of parts of it (readiness, device health) as they change.

Functions of the API client and the node's state: the probers, the plugin watcher and the pod
sync loop all write status, each through these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from nvlfabric.api import errors
from nvlfabric.kube.errors import api_call
from nvlfabric.sim.kubelet.devicehealth import allocated_resources_status
from nvlfabric.sim.kubelet.state import NodeState, rfc3339

log = logging.getLogger("nvlfabric.sim.kubelet")

RUN_SECONDS_ANNOTATION = "sim.nvlfabric.io/run-seconds"

StatusEdit = Callable[[Pod, list[dict[str, Any]]], dict[str, Any]]
"""(the pod as read, its containerStatuses as dicts) → the part of its status to write."""


def readiness_conditions(ready: list[bool], before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A running pod's conditions: started and initialized; ContainersReady and Ready as its
    containers are (keeping each condition's transition time while its status stays)."""
    t = rfc3339()
    old = {c.get("type"): c for c in before}
    out = []
    for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"):
        status = "True" if kind in ("PodReadyToStartContainers", "Initialized") or all(ready) else "False"
        prev = old.get(kind) or {}
        cond: dict[str, Any] = {"type": kind, "status": status,
                                "lastTransitionTime": prev.get("lastTransitionTime") if prev.get("status") == status
                                else t}
        if status == "False":
            cond["reason"] = "ContainersNotReady"
        out.append(cond)
    return out


def _pod_ips(state: NodeState, pod: Pod) -> dict[str, Any]:
    """The pod's host IP (its node's) and pod IP (its own on a pod network, else its node's)."""
    a, p = state.node.address, state.pod_ip(pod.metadata.uid or "" if pod.metadata else "")
    return {"hostIP": a, "hostIPs": [{"ip": a}], "podIP": p, "podIPs": [{"ip": p}]}


def _running_containers(state: NodeState, pod: Pod, t: str) -> list[dict[str, Any]]:
    """`containerStatuses` of a running pod: each container's readiness, restarts and last
    termination as its process (if it runs one) has them, and its devices' health."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    containers: list[dict[str, Any]] = []
    for c in pod.spec.containers:
        proc = state.processes.get((uid, c.name))
        status: dict[str, Any] = {
            "name": c.name, "image": c.image or "", "imageID": "", "ready": state.ready.get((uid, c.name), True),
            "restartCount": proc.restarts if proc is not None else 0, "started": True,
            "containerID": f"sim://{uid}/{c.name}", "state": {"running": {"startedAt": t}}}
        if (last := state.terminated.get((uid, c.name))) is not None:
            status["lastState"] = {"terminated": dict(last)}
        containers.append(status)
    health = allocated_resources_status(pod, state.devices.get(uid, {}), state.health, time.monotonic())
    for cs in containers:
        if cs["name"] in health:
            cs["allocatedResourcesStatus"] = health[cs["name"]]
    return containers


async def report_running(client: AsyncClient, state: NodeState, pod: Pod) -> None:
    """Write the pod Running: each container's readiness, restarts and last termination as its
    process (if it runs one) has them."""
    assert pod.metadata is not None and pod.spec is not None
    t = rfc3339()
    uid = pod.metadata.uid or ""
    containers = _running_containers(state, pod, t)
    status = {"status": {
        "phase": "Running", "startTime": t, **_pod_ips(state, pod),
        "conditions": readiness_conditions([cs["ready"] for cs in containers], []),
        "containerStatuses": containers,
        **({"initContainerStatuses": init_statuses(state, pod, None, t)} if pod.spec.initContainers else {}),
    }}
    await client.patch(Pod.Status, pod.metadata.name or "", status, namespace=pod.metadata.namespace)
    # A probe that changed readiness while this write was in flight found the pod not Running
    # yet and wrote nothing (rewrite_status): write it now, or the pod keeps the old value
    # until the next change, which for a passing probe never comes.
    if any(state.ready.get((uid, cs["name"]), True) != cs["ready"] for cs in containers):
        await write_ready(client, state, uid)


async def rewrite_status(client: AsyncClient, state: NodeState, uid: str, edit: StatusEdit) -> None:
    """Re-write part of one running pod's status. The pod's containerStatuses (and conditions)
    are one list each (no merge key): written whole, guarded by the resourceVersion read, read
    again on a conflict, so a concurrent status write (a restart count) is never lost."""
    namespace, name = state.pod_names.get(uid, ("", ""))
    for _ in range(3):
        try:
            with api_call(f"read pod {namespace}/{name}"):
                pod = await client.get(Pod, name, namespace=namespace)
        except errors.NotFound:
            return
        if pod.metadata is None or pod.metadata.uid != uid or pod.status is None or pod.status.phase != "Running":
            return
        status = edit(pod, [cs.to_dict() for cs in pod.status.containerStatuses or []])
        try:
            with api_call(f"write the status of pod {namespace}/{name}"):
                await client.patch(Pod.Status, name, {
                    "metadata": {"resourceVersion": pod.metadata.resourceVersion},
                    "status": status}, namespace=namespace, patch_type=PatchType.MERGE)
            return
        except errors.Conflict:
            continue


async def write_ready(client: AsyncClient, state: NodeState, uid: str) -> None:
    """Re-write one running pod's readiness: its containers' `ready`, its Ready condition."""
    def edit(pod: Pod, statuses: list[dict[str, Any]]) -> dict[str, Any]:
        for d in statuses:
            d["ready"] = state.ready.get((uid, d["name"]), True)
        return {"containerStatuses": statuses, "conditions": readiness_conditions(
            [d["ready"] for d in statuses], [c.to_dict() for c in (pod.status.conditions or [])]
            if pod.status else [])}

    await rewrite_status(client, state, uid, edit)


async def write_back_off(client: AsyncClient, state: NodeState, uid: str, container: str, message: str) -> None:
    """One container of a running pod exited and waits out its back-off: `waiting` with reason
    CrashLoopBackOff, not ready or started, its exit as `lastState` (the pod stays Running)."""
    def edit(pod: Pod, statuses: list[dict[str, Any]]) -> dict[str, Any]:
        for d in statuses:
            if d["name"] == container:
                d.update(ready=False, started=False, state={"waiting": {"reason": "CrashLoopBackOff",
                                                                        "message": message}})
                if (last := state.terminated.get((uid, container))) is not None:
                    d["lastState"] = {"terminated": dict(last)}
        return {"containerStatuses": statuses, "conditions": readiness_conditions(
            [d["ready"] for d in statuses], [c.to_dict() for c in (pod.status.conditions or [])]
            if pod.status else [])}

    await rewrite_status(client, state, uid, edit)


async def write_health(client: AsyncClient, state: NodeState, uid: str) -> None:
    """Re-write one running pod's allocatedResourcesStatus."""
    def edit(pod: Pod, statuses: list[dict[str, Any]]) -> dict[str, Any]:
        health = allocated_resources_status(pod, state.devices.get(uid, {}), state.health, time.monotonic())
        for d in statuses:
            d.pop("allocatedResourcesStatus", None)
            if d["name"] in health:
                d["allocatedResourcesStatus"] = health[d["name"]]
        return {"containerStatuses": statuses}

    await rewrite_status(client, state, uid, edit)


async def resync_status(client: AsyncClient, state: NodeState, pod: Pod) -> None:
    """Write a running pod's readiness again when the API server's copy says otherwise, as the
    kubelet's status manager does: the node-lifecycle controller sets `Ready` False on the pods
    of a node it marked NotReady, and once the node is back nothing else would set it True
    again (docs/architecture.md, Simulator)."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    want = all(state.ready.get((uid, c.name), True) for c in pod.spec.containers)
    conditions = {c.type: c.status for c in (pod.status.conditions or [])} if pod.status else {}
    if conditions.get("Ready") != ("True" if want else "False") or \
            conditions.get("ContainersReady") != ("True" if want else "False"):
        log.info("pod %s/%s: its status says Ready=%s, the node says %s; writing it again",
                 pod.metadata.namespace, pod.metadata.name, conditions.get("Ready"), want)
        await write_ready(client, state, uid)


def _init_status(state: NodeState, uid: str, c: Any, running: str | None, since: str,
                 failed: bool) -> dict[str, Any]:
    """One init container's status (see init_statuses)."""
    key = (uid, c.name)
    failure = state.init_failures.get(key)
    status: dict[str, Any] = {"name": c.name, "image": c.image or "", "imageID": "",
                              "restartCount": (failure or {}).get("restarts", -1) + 1,
                              "containerID": f"sim://{uid}/{c.name}", "ready": False, "started": False}
    if c.restartPolicy == "Always":
        proc = state.processes.get(key)
        status |= {"ready": state.ready.get(key, True), "started": True,
                   "restartCount": proc.restarts if proc is not None else 0,
                   "state": {"running": {"startedAt": since}}}
        if (last := state.terminated.get(key)) is not None:
            status["lastState"] = {"terminated": dict(last)}
    elif key in state.init_done:
        status |= {"ready": True, "state": {"terminated": dict(state.init_done[key])}}
    elif c.name == running:
        status |= {"started": True, "state": {"running": {"startedAt": since}}}
    else:
        status["state"] = {"waiting": {"reason": "PodInitializing"}}
    if failure is not None and c.restartPolicy != "Always":
        last = {k: v for k, v in failure.items() if k != "restarts"}
        pending = key not in state.init_done and c.name != running
        if failed and pending:
            status["state"] = {"terminated": last}
        else:
            status["lastState"] = {"terminated": last}
        if pending and not failed:
            status["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": f"back-off restarting failed container {c.name}"}}
    return status


def init_statuses(state: NodeState, pod: Pod, running: str | None, since: str,
                  failed: bool = False) -> list[dict[str, Any]]:
    """`initContainerStatuses`: done ones terminated, the running one running, a failed one
    waiting in back-off with its failure as lastState (terminated, once the pod failed)."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    return [_init_status(state, uid, c, running, since, failed) for c in pod.spec.initContainers or []]


async def write_initializing(client: AsyncClient, state: NodeState, pod: Pod, *, running: str | None, since: str,
                             failed: bool = False) -> None:
    """The pod while its init containers run (kubectl shows `Init:<done>/<all>`), or Failed."""
    assert pod.metadata is not None and pod.spec is not None
    statuses = init_statuses(state, pod, running, since, failed)
    waiting = [{"name": c.name, "image": c.image or "", "imageID": "", "ready": False, "restartCount": 0,
                "started": False, "state": {"waiting": {"reason": "PodInitializing"}}} for c in pod.spec.containers]
    t = rfc3339()
    condition = {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                 "lastTransitionTime": t}
    await client.patch(Pod.Status, pod.metadata.name or "", {"status": {
        "phase": "Failed" if failed else "Pending", **_pod_ips(state, pod), "startTime": since,
        "conditions": [condition],
        "initContainerStatuses": statuses, "containerStatuses": waiting}}, namespace=pod.metadata.namespace)


async def complete_after_run_time(client: AsyncClient, pod: Pod) -> bool:
    """Job pods with a run time annotation finish (Succeeded) once it has passed."""
    assert pod.metadata is not None and pod.spec is not None
    seconds = (pod.metadata.annotations or {}).get(RUN_SECONDS_ANNOTATION)
    if seconds is None:
        return True
    await asyncio.sleep(float(seconds))
    t = rfc3339()
    containers = [{"name": c.name, "image": c.image or "", "imageID": "", "ready": False, "restartCount": 0,
                   "started": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                              "finishedAt": t}}}
                  for c in pod.spec.containers]
    await client.patch(Pod.Status, pod.metadata.name or "", {"status": {
        "phase": "Succeeded", "containerStatuses": containers,
        "conditions": [{"type": c, "status": "False", "reason": "PodCompleted", "lastTransitionTime": t}
                       for c in ("Ready", "ContainersReady")]}}, namespace=pod.metadata.namespace)
    return True
