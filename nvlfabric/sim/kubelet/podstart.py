"""Starting a pod bound to the node, up to its containers: its claims (each allocated and reserved
for it), NodePrepareResources per driver, the CDI IDs resolved against the node's CDI dirs (an
unresolvable ID fails the container start, as a runtime would), each container's record in
`containers/` (its edits and resolved env, command and args), and its init containers in order.
The containers' processes are the kubelet's (kubelet.py): this module is handed how to start one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from lightkube import AsyncClient
from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api import errors, names
from nvlfabric.api.kubelet.cdi import ContainerEdits
from nvlfabric.api.kubelet.types import ClaimRef
from nvlfabric.kube.errors import api_call
from nvlfabric.sim.kubelet import cdi, podstatus
from nvlfabric.sim.kubelet.processes import PodProcess, container_config
from nvlfabric.sim.kubelet.state import NodeState, PodFailed, PodNotReady, record_path, rfc3339

__all__ = ["CDIByClaim", "container_edits", "pod_claims", "prepare_claims", "reserved_for", "run_init_containers",
           "write_placeholder_logs"]

CDIByClaim = dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]]
"""Pod-level claim name (as containers reference it) → (request names, CDI IDs) of each prepared device."""
EXTENDED = ""
"""The key of the claim the scheduler made for the pod's extended resources served by DRA
(`status.extendedResourceClaimStatus`; no container names it: its request mappings do)."""


def reserved_for(claim: ResourceClaim, pod: Pod) -> bool:
    """Whether `claim` is reserved for `pod`: the pod itself is a consumer, or its PodGroup is,
    named as the pod's `spec.schedulingGroup` names it (pods do not know their group's uid), as a
    kubelet with DRAWorkloadResourceClaims on checks; only a scheduler with that gate on
    reserves a claim for a PodGroup."""
    assert pod.metadata is not None and pod.spec is not None
    group = pod.spec.schedulingGroup.podGroupName if pod.spec.schedulingGroup else None
    for r in (claim.status.reservedFor or []) if claim.status else []:
        if r.uid == pod.metadata.uid:
            return True
        if group and r.apiGroup == names.SCHEDULING_API_GROUP and r.resource == "podgroups" and r.name == group:
            return True
    return False


async def pod_claims(client: AsyncClient, pod: Pod) -> list[ResourceClaim]:
    """The pod's ResourceClaims, each allocated and reserved for it; PodNotReady while one is not."""
    assert pod.spec is not None and pod.metadata is not None
    claim_names: dict[str, str | None] = {}
    statuses = {s.name: s.resourceClaimName for s in (pod.status.resourceClaimStatuses or [])} \
        if pod.status else {}
    for rc in pod.spec.resourceClaims or []:
        claim_names[rc.name] = rc.resourceClaimName or statuses.get(rc.name)
    extended = pod.status.extendedResourceClaimStatus if pod.status else None
    if extended is not None:  # e.g. nvidia.com/gpu on a node where a DeviceClass, not a device plugin, serves it
        claim_names[EXTENDED] = extended.resourceClaimName
    claims = []
    for ref, claim_name in claim_names.items():
        if not claim_name:
            raise PodNotReady("FailedPrepareDynamicResources",
                              f"waiting for ResourceClaim of pod claim {ref!r} to be created")
        try:
            with api_call(f"read ResourceClaim {claim_name}"):
                claim = await client.get(ResourceClaim, claim_name, namespace=pod.metadata.namespace)
        except errors.ApiStatusError as exc:
            raise PodNotReady("FailedPrepareDynamicResources",
                              f"ResourceClaim {claim_name}: {exc.message}") from exc
        if not (claim.status and claim.status.allocation) or not reserved_for(claim, pod):
            raise PodNotReady("FailedPrepareDynamicResources",
                              f"ResourceClaim {claim_name} is not allocated and reserved for this pod yet")
        claims.append(claim)
    return claims


def claims_by_driver(claims: list[ResourceClaim]) -> dict[str, list[ClaimRef]]:
    """Each driver with a device in the claims → the claims it prepares."""
    by_driver: dict[str, list[ClaimRef]] = {}
    for claim in claims:
        if not (claim.metadata and claim.status and claim.status.allocation and claim.status.allocation.devices):
            continue
        ref = ClaimRef(namespace=claim.metadata.namespace or "", name=claim.metadata.name or "",
                       uid=claim.metadata.uid or "")
        for d in {r.driver for r in claim.status.allocation.devices.results or []}:
            by_driver.setdefault(d, []).append(ref)
    return by_driver


async def prepare_claims(state: NodeState, pod: Pod, claims: list[ResourceClaim]) -> CDIByClaim:
    """NodePrepareResources of each driver for its claims; what each returned, by pod-level claim name."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    statuses = {s.resourceClaimName: s.name for s in (pod.status.resourceClaimStatuses or [])} \
        if pod.status else {}
    pod_claim_name = {rc.resourceClaimName or "": rc.name for rc in pod.spec.resourceClaims or []}
    if pod.status and pod.status.extendedResourceClaimStatus:
        pod_claim_name[pod.status.extendedResourceClaimStatus.resourceClaimName] = EXTENDED
    out: CDIByClaim = {}
    for driver, refs in claims_by_driver(claims).items():
        plugin = state.plugin_for(driver)
        if plugin is None:
            raise PodNotReady("FailedPrepareDynamicResources",
                              f"DRA driver {driver} is not registered on node {state.node.name}")
        results = await plugin.prepare(refs)
        state.prepared.setdefault(uid, {})[driver] = refs
        for ref in refs:
            if not isinstance(found := results.get(ref.uid), str) and found is not None:
                state.devices.setdefault(uid, {}).setdefault(ref.name, {})[driver] = list(found)
        failed = {u: r for u, r in results.items() if isinstance(r, str)}
        if failed:
            raise PodNotReady("FailedPrepareDynamicResources",
                              "; ".join(f"claim {u}: {e}" for u, e in failed.items()))
        for ref in refs:
            devices = results[ref.uid]
            assert not isinstance(devices, str)
            local = pod_claim_name[ref.name] if ref.name in pod_claim_name else statuses.get(ref.name) or ref.name
            out.setdefault(local, []).extend((d.request_names, d.cdi_device_ids) for d in devices)
    return out


def container_edits(state: NodeState, pod: Pod, prepared: CDIByClaim) -> dict[str, ContainerEdits]:
    """Each container's CDI edits (of the devices of the claims it references), written with what
    the kubelet itself gives the runtime into the container's record."""
    assert pod.metadata is not None and pod.spec is not None
    records = {}
    edits_of: dict[str, ContainerEdits] = {}
    extended = pod.status.extendedResourceClaimStatus if pod.status else None
    for container in [*(pod.spec.initContainers or []), *pod.spec.containers]:
        ids: list[str] = []
        for c in (container.resources.claims or []) if container.resources else []:
            for requests, cdi_ids in prepared.get(c.name, []):
                if not requests or (c.request and c.request in requests) or not c.request:
                    ids.extend(i for i in cdi_ids if i not in ids)
        # The scheduler's claim for extended resources: each request is one container's resource.
        mine = {m.requestName for m in (extended.requestMappings if extended else [])
                if m.containerName == container.name}
        for requests, cdi_ids in prepared.get(EXTENDED, []) if mine else []:
            if set(requests) & mine:
                ids.extend(i for i in cdi_ids if i not in ids)
        try:
            edits = cdi.resolve(state.node.cdi_dirs, ids)
        except cdi.UnresolvableDevices as exc:
            raise PodNotReady("Failed", f"container {container.name}: CreateContainerError: {exc}") from exc
        edits_of[container.name] = edits
        # The CDI edits (`env` among them, the driver's) and what the kubelet itself gives the
        # runtime: the spec's env resolved (downward API, `$(VAR)`), command and args expanded.
        records[container.name] = {"cdi_device_ids": ids,
                                   **edits.model_dump(mode="json", by_alias=True, exclude_none=True),
                                   **container_config(pod, state.node, state.pod_ip(pod.metadata.uid or ""), container)}
    state.node.containers_dir.mkdir(parents=True, exist_ok=True)
    for cname, record in records.items():
        path = record_path(state.node, pod.metadata.namespace or "default", pod.metadata.name or "", cname)
        record |= {"pod": pod.metadata.name, "namespace": pod.metadata.namespace, "pod_uid": pod.metadata.uid,
                   "container": cname, "node": state.node.name}
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return edits_of


def write_placeholder_logs(state: NodeState, pod: Pod) -> None:
    """A container that runs nothing here gets a log saying so, and where its record is."""
    assert pod.metadata is not None and pod.spec is not None
    for container in [*(pod.spec.initContainers or []), *pod.spec.containers]:
        out = state.node.pod_dir(pod.metadata.uid or "") / f"{container.name}.log"
        if out.exists():
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        recorded = record_path(state.node, pod.metadata.namespace or "default", pod.metadata.name or "",
                               container.name)
        out.write_text(f"nvlfabric-sim: container {container.name} (image {container.image}) is simulated on "
                       f"node {state.node.name}: its image maps to no local program (nvlfabric-sim up "
                       f"--images), so nothing runs; what it was given (env, command, CDI devices) is in "
                       f"{recorded}\n")


async def run_init_containers(client: AsyncClient, state: NodeState, pod: Pod, *,
                              runs: Callable[[Container], bool], launch: Callable[[Container], PodProcess],
                              sidecar_started: Callable[[tuple[str, str]], None]) -> None:
    """The pod's init containers, in order, before its containers: each runs to completion (one
    whose image maps to no program completes at once); a failed one is retried with back-off
    (the earlier ones stay done), or fails the pod under `restartPolicy: Never`. A sidecar
    (`restartPolicy: Always`) starts and runs on beside the containers from its turn on.
    `runs`: whether a container runs as a process here; `launch` starts it."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    for c in pod.spec.initContainers or []:
        key = (uid, c.name)
        if c.restartPolicy == "Always":
            if runs(c) and key not in state.processes:
                state.processes[key] = launch(c)
                sidecar_started(key)
            continue
        if key in state.init_done:
            continue
        started = rfc3339()
        if not runs(c):
            state.init_done[key] = {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started}
            continue
        await _run_to_completion(client, state, pod, c, launch(c), started)


async def _run_to_completion(client: AsyncClient, state: NodeState, pod: Pod, c: Container, proc: PodProcess,
                             started: str) -> None:
    """Wait for one init container's process; record its success, or its failure (PodFailed under
    `restartPolicy: Never`, otherwise PodNotReady: the sync retries it with back-off)."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    key = (uid, c.name)
    state.init_running[uid] = proc
    await podstatus.write_initializing(client, state, pod, running=c.name, since=started)
    try:
        code = await asyncio.to_thread(proc.proc.wait)
    finally:
        state.init_running.pop(uid, None)
    ended = {"exitCode": code if code >= 0 else 128 - code, "startedAt": started, "finishedAt": rfc3339()}
    if code == 0:
        state.init_done[key] = {**ended, "reason": "Completed"}
        return
    message = proc.termination_message(code)
    state.init_failures[key] = {**ended, "reason": "Error", **({"message": message} if message else {}),
                                "restarts": state.init_failures.get(key, {}).get("restarts", -1) + 1}
    if pod.spec.restartPolicy == "Never":
        await podstatus.write_initializing(client, state, pod, running=None, since=started, failed=True)
        raise PodFailed(c.name)
    await podstatus.write_initializing(client, state, pod, running=None, since=started)
    raise PodNotReady("BackOff", f"Back-off restarting failed init container {c.name} in pod "
                                 f"{pod.metadata.name} (exit code {ended['exitCode']})")
