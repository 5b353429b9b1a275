"""The Node object, its status and its Lease, as a kubelet keeps them.

A node registers itself (GB200 capacity, 4 `nvidia.com/gpu` as the device plugin advertises them,
labels, its own loopback address), wipes its ResourceSlices at start (drivers republish), renews
its Lease every LEASE_RENEW_S (leaseDuration/4, the kubelet's rule) and reports its status every
STATUS_REPORT_S. A node that is "down" (nvlfabric-sim fault node-down) stops both, as a dead
machine does; the node-lifecycle controller then marks it NotReady and taints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from nvlfabric.api import errors, names
from nvlfabric.kube.errors import api_call
from nvlfabric.sim.kubelet.leaseclient import LeaseClient
from nvlfabric.sim.kubelet.state import NodeState, now, rfc3339
from nvlfabric.sim.nodes import GPUS_PER_NODE, SimNode, node_labels

__all__ = ["KUBELET_VERSION", "LEASE_DURATION_S", "LEASE_RENEW_S", "LEASE_RETRY_S", "STATUS_REPORT_S",
           "heartbeats", "register_node", "wipe_slices"]

log = logging.getLogger("nvlfabric.sim.kubelet")

LEASE_DURATION_S = 40
LEASE_RENEW_S = LEASE_DURATION_S / 4
LEASE_RETRY_S = (0.2, 0.4, 0.8, 1.6, 3.2, 7.0)
"""A failed renewal is tried again this soon (the kubelet's lease controller backs off from 200 ms
to 7 s), not a whole renew interval later: renewals lost to a busy API server one interval after
another would let the node-lifecycle controller mark a live node NotReady."""
STATUS_REPORT_S = 300.0
"""The kubelet reports an unchanged node status every 5 minutes (nodeStatusReportFrequency); the
Lease is the heartbeat."""
KUBELET_VERSION = "v1.37.2-nvlfabric-sim"


def _node_object(n: SimNode) -> Node:
    return Node(metadata=ObjectMeta(name=n.name, labels=node_labels(n)))


def _node_status(n: SimNode, dra_gpus: bool = False) -> dict[str, Any]:
    t = rfc3339()
    # What a GB200 compute tray with NVIDIA's device plugin advertises: its 4 GPUs as the
    # extended resource nvidia.com/gpu, so GPU requests spread pods as on a real cluster. Without
    # a device plugin (`dra_gpus`) the GPUs are DRA devices the agent publishes, and the Node
    # advertises none.
    capacity = {"cpu": "144", "memory": "884Gi", "pods": "110", "ephemeral-storage": "3576Gi",
                "hugepages-2Mi": "0", **({} if dra_gpus else {names.GPU_RESOURCE: str(GPUS_PER_NODE)})}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "lastHeartbeatTime": t}
    return {"status": {
        "capacity": capacity, "allocatable": capacity,
        "conditions": [ready] + [
            {"type": c, "status": "False", "reason": f"KubeletHas{r}", "lastHeartbeatTime": t}
            for c, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                         ("PIDPressure", "SufficientPID"))],
        "addresses": [{"type": "InternalIP", "address": n.address}, {"type": "Hostname", "address": n.name}],
        "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": "arm64", "containerRuntimeVersion": "nvlfabric-sim://1",
                     "kernelVersion": "6.8.0-nvidia-64k", "osImage": "Ubuntu 24.04 LTS (simulated)",
                     "machineID": n.name, "systemUUID": n.name, "bootID": n.name},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    }}


def _lease(state: NodeState) -> Lease:
    n = state.node
    return Lease(
        metadata=ObjectMeta(name=n.name, namespace="kube-node-lease", ownerReferences=[
            OwnerReference(apiVersion="v1", kind="Node", name=n.name, uid=state.uid)]),
        spec=LeaseSpec(holderIdentity=n.name, leaseDurationSeconds=LEASE_DURATION_S, renewTime=now()))


def _stamp() -> str:
    return now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def register_node(client: AsyncClient, state: NodeState) -> None:
    """The Node (kept if it exists), its status and Lease; then its ResourceSlices go, as a starting
    kubelet deletes them (drivers must republish)."""
    n = state.node
    n.prepare_dirs()
    try:
        with api_call(f"register Node {n.name}"):
            obj = await client.create(_node_object(n))
    except errors.AlreadyExists:
        obj = await client.get(Node, n.name)
    assert obj.metadata is not None
    state.uid = obj.metadata.uid or ""
    await client.patch(Node.Status, n.name, _node_status(n, state.dra_gpus))
    with contextlib.suppress(errors.AlreadyExists), api_call(f"create the Lease of Node {n.name}"):
        await client.create(_lease(state))
    await wipe_slices(client, n.name, driver=None)


async def heartbeats(leases: LeaseClient, client: AsyncClient, state: NodeState, phase: float,
                     stopping: Callable[[], bool]) -> None:
    """One node's Lease renewals (over `leases`, leaseclient.py) and status reports (module doc),
    starting `phase` of an interval late, so that nodes do not all renew in one burst."""
    await asyncio.sleep(phase * LEASE_RENEW_S)
    next_status = time.monotonic() + STATUS_REPORT_S * (1 + phase)
    was_down = False
    while not stopping():
        due = time.monotonic() + LEASE_RENEW_S
        down = state.node.is_down()
        if was_down and not down:
            # Back from the dead: the node lifecycle controller set Ready Unknown meanwhile, and the
            # kubelet posts its status as soon as it differs from the API's, not at the next report.
            next_status = time.monotonic()
        was_down = down
        if not down:
            await _renew(leases, state, due)
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + STATUS_REPORT_S
                with contextlib.suppress(Exception):
                    await client.patch(Node.Status, state.node.name, _node_status(state.node, state.dra_gpus))
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def _renew(leases: LeaseClient, state: NodeState, due: float) -> None:
    """Renew the node's Lease (made anew when it is gone, as the kubelet's lease controller
    does), trying again with back-off until the next renewal is due."""
    name = state.node.name
    for delay in (*LEASE_RETRY_S, None):
        try:
            try:
                await leases.renew(name, _stamp())
            except errors.NotFound:
                with contextlib.suppress(errors.AlreadyExists):
                    await leases.create(_lease(state).to_dict())
                log.info("node %s: its Lease was gone; created it again", name)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # API and transport errors alike: a heartbeat must go on
            if delay is None or time.monotonic() + delay >= due:
                log.warning("node %s: renewing its Lease failed (%s); trying at the next interval", name, exc)
                return
            log.info("node %s: renewing its Lease failed (%s); trying again in %.1f s", name, exc, delay)
            await asyncio.sleep(delay)


async def wipe_slices(client: AsyncClient, node: str, *, driver: str | None) -> None:
    """Delete the node's ResourceSlices (of one driver, or all)."""
    fields: dict[str, Any] = {"spec.nodeName": node} | ({"spec.driver": driver} if driver else {})
    async for s in client.list(ResourceSlice, fields=fields):
        assert s.metadata is not None and s.metadata.name is not None
        with contextlib.suppress(ApiError):
            await client.delete(ResourceSlice, s.metadata.name)
