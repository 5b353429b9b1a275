"""Stopping a pod being deleted: its processes stopped (SIGTERM, then SIGKILL after the grace),
NodeUnprepareResources per driver, what the node held of it dropped, then the pod ended (phase
Failed, unless it had ended already) and deleted with grace period 0. A pod stays Terminating
until its unprepare succeeds, as with a real kubelet.
"""

from __future__ import annotations

import contextlib

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import errors
from nvlfabric.api.kubelet.types import ClaimRef
from nvlfabric.kube.errors import api_call
from nvlfabric.sim.kubelet.hollow import HollowAgent
from nvlfabric.sim.kubelet.podstart import claims_by_driver
from nvlfabric.sim.kubelet.processes import stop_pod_processes
from nvlfabric.sim.kubelet.state import PROCESS_STOP_TIMEOUT_S, NodeState, PodNotReady

__all__ = ["delete", "release"]


async def _stop_containers(state: NodeState, uid: str) -> None:
    if (init := state.init_running.pop(uid, None)) is not None:
        init.kill()
    for done in [k for k in [*state.init_done, *state.init_failures] if k[0] == uid]:
        state.init_done.pop(done, None)
        state.init_failures.pop(done, None)
    keys = [k for k in state.processes if k[0] == uid]
    for key in keys:
        if (prober := state.probers.pop(key, None)) is not None:
            prober.cancel()
        state.ready.pop(key, None)
        state.terminated.pop(key, None)
    # All its containers at once, SIGTERM then SIGKILL after the grace (as the kubelet stops a pod).
    await stop_pod_processes([state.processes.pop(k) for k in keys], timeout=PROCESS_STOP_TIMEOUT_S)
    if state.hollow_agent_pod == uid:  # the agent stops: its plugin is unregistered (its labels stay)
        state.hollow_agent_pod = None
        state.plugins = {k: p for k, p in state.plugins.items() if not isinstance(p, HollowAgent)}


async def _unprepare(client: AsyncClient, state: NodeState, pod: Pod) -> None:
    assert pod.metadata is not None
    uid = pod.metadata.uid or ""
    prepared = state.prepared.get(uid)
    if prepared is None and pod.spec and pod.spec.resourceClaims:
        # Not prepared by this process (e.g. the kubelet restarted): unprepare anyway, as the
        # kubelet does from its checkpoint; plugins must treat unknown claims as done.
        prepared = await _prepared_from_api(client, pod)
    # A claim another pod on this node still uses stays prepared (the kubelet's claim info keeps
    # the pods of each claim and unprepares with the last): pods of a shared channel claim that
    # share a node must not lose their channel when one of them goes.
    in_use = {r.uid for other, drivers in state.prepared.items() if other != uid
              for refs in drivers.values() for r in refs}
    for driver, all_refs in list((prepared or {}).items()):
        refs = [r for r in all_refs if r.uid not in in_use]
        if not refs:
            state.prepared.get(uid, {}).pop(driver, None)
            continue
        plugin = state.plugin_for(driver)
        if plugin is None:
            raise PodNotReady("FailedUnprepareDynamicResources",
                              f"DRA driver {driver} is not registered on node {state.node.name}")
        failed = {u: e for u, e in (await plugin.unprepare(refs)).items() if e}
        if failed:
            raise PodNotReady("FailedUnprepareDynamicResources",
                              "; ".join(f"claim {u}: {e}" for u, e in failed.items()))
        state.prepared.get(uid, {}).pop(driver, None)


async def _prepared_from_api(client: AsyncClient, pod: Pod) -> dict[str, list[ClaimRef]]:
    assert pod.metadata is not None
    claims = []
    for s in (pod.status.resourceClaimStatuses or []) if pod.status else []:
        if not s.resourceClaimName:
            continue
        try:
            claims.append(await client.get(ResourceClaim, s.resourceClaimName, namespace=pod.metadata.namespace))
        except ApiError:
            continue
    return claims_by_driver(claims)


async def release(client: AsyncClient, state: NodeState, pod: Pod) -> None:
    """Stop the pod and unprepare its claims (module doc); PodNotReady while a driver's unprepare
    fails or it is not registered. Its deletion is the caller's, once it has noted the pod gone."""
    assert pod.metadata is not None
    uid = pod.metadata.uid or ""
    await _stop_containers(state, uid)
    await _unprepare(client, state, pod)
    state.prepared.pop(uid, None)
    state.devices.pop(uid, None)  # health is not updated after the pod terminates
    state.pod_names.pop(uid, None)
    state.started.discard(uid)


async def delete(client: AsyncClient, pod: Pod) -> None:
    """Delete the stopped pod with grace period 0: the kubelet's last word on it. Gone already is
    done; any other failure (a refusal, an API server that dropped the request) is raised for
    the caller to retry, or the pod stays Terminating for good."""
    assert pod.metadata is not None
    name, namespace = pod.metadata.name or "", pod.metadata.namespace or "default"
    if (pod.status.phase if pod.status else None) not in ("Succeeded", "Failed"):
        # A deleted pod ends in a terminal phase before it goes (the kubelet's getPhase: its
        # containers were stopped, so Failed): a Job with a podFailurePolicy counts a pod, and
        # replaces it, only once it is terminal; left Running it stayed Terminating for good.
        with contextlib.suppress(errors.NotFound), api_call(f"end pod {namespace}/{name}"):
            await client.patch(Pod.Status, name, {"status": {"phase": "Failed"}}, namespace=namespace,
                               patch_type=PatchType.MERGE)
    with contextlib.suppress(errors.NotFound), api_call(f"delete pod {namespace}/{name}"):
        await client.delete(Pod, name, namespace=namespace, grace_period=0)
