"""Simulated kubelets: one asyncio process hosting many GB200 nodes against the real API server.

Per node it does what a kubelet does that matters to DRA and to nvlfabric:
- registers the Node (GB200 capacity, 4 `nvidia.com/gpu` as the device plugin advertises them,
  labels, its own loopback address) and renews its Lease every 10 s (leaseDuration/4, the kubelet's
  rule); wipes the node's ResourceSlices at start and 30 s after a driver's last plugin instance
  went away (the kubelet's defaultWipingDelay);
- discovers DRA plugins in its `plugins_registry` and registers them (see plugins.py), and
  watches the health stream of those that serve one, showing it in the pods'
  `allocatedResourcesStatus` (see health.py);
- for each pod bound to it: waits until every claim is allocated and reserved for the pod, calls
  NodePrepareResources per driver, resolves the returned CDI IDs against the node's CDI dirs (an
  unresolvable ID fails the container start, as a runtime would), records each container's edits
  and its resolved env, command and args in `containers/`, runs pods whose image maps to a local
  command (the node agent) as processes, and reports the pod Running; Job pods annotated with a
  run time become Succeeded after it;
- for each pod being deleted: stops its process, calls NodeUnprepareResources, then deletes the
  pod with grace period 0 (pods stay Terminating until unprepare succeeds, as with a real kubelet);
- serves the kubelet API's container logs on the node's address (logs.py), so `kubectl logs` works:
  a local process's output, or for a container that runs nothing one line saying so and where
  its record is;
- runs the startup, readiness and liveness probes of the containers it runs as processes
  (probes.py): a container with a readiness probe is ready, and its pod Ready, only once it
  passes; a failed liveness (or startup) probe kills the container, which is restarted.

Pods are watched cluster-wide through one watch and dispatched to their node locally, so a
process hosting 144 nodes holds one watch, not 144.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from lightkube import ApiError, AsyncClient
from lightkube.core.generic_client import ALL_NS
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import Container, EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from nvlfabric.api import errors, names
from nvlfabric.api.kubelet.cdi import ContainerEdits
from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.kube.errors import api_call
from nvlfabric.sim import hardware, pki
from nvlfabric.sim.images import ImageProgram, program_for
from nvlfabric.sim.kubelet import cdi, logs, probes, rootfs, volumes
from nvlfabric.sim.kubelet.health import STREAM_RETRY_S, DeviceKey, HealthCache, allocated_resources_status, uses
from nvlfabric.sim.kubelet.hollow import HollowAgent, is_agent
from nvlfabric.sim.kubelet.plugins import Plugin, PluginCallError, RegistrationError, register, registry_sockets
from nvlfabric.sim.kubelet.processes import PodProcess, container_config, start_pod_process, stop_all
from nvlfabric.sim.nodes import GPUS_PER_NODE, SimNode, node_labels

log = logging.getLogger("nvlfabric.sim.kubelet")

LEASE_DURATION_S = 40
LEASE_RENEW_S = LEASE_DURATION_S / 4
LEASE_RETRY_S = (0.2, 0.4, 0.8, 1.6, 3.2, 7.0)
"""A failed renewal is tried again this soon (the kubelet's lease controller backs off from 200 ms
to 7 s), not a whole renew interval later: at 144 nodes on 2 cores, renewals lost to a busy API
server one interval after another let the node-lifecycle controller mark 21 nodes NotReady."""
STATUS_REPORT_S = 300.0
"""The kubelet reports an unchanged node status every 5 minutes (nodeStatusReportFrequency); the
Lease is the heartbeat."""
PLUGIN_SCAN_S = 0.5
WIPING_DELAY_S = 30.0
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # pod sync back-off, capped like the kubelet's (shorter here)
RUN_SECONDS_ANNOTATION = "sim.nvlfabric.io/run-seconds"
KUBELET_VERSION = "v1.37.2-nvlfabric-sim"
GPU_RESOURCE = names.GPU_RESOURCE
SYNC_SLOTS = 32
PROCESS_STOP_TIMEOUT_S = 10.0  # at stop, for all local processes together (testbed/controlplane.py waits longer)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def rfc3339(t: datetime.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeState:
    node: SimNode
    uid: str = ""
    plugins: dict[Path, Plugin | HollowAgent] = field(default_factory=dict)  # registry socket → plugin
    driver_gone_since: dict[str, float] = field(default_factory=dict)
    prepared: dict[str, dict[str, list[ClaimRef]]] = field(default_factory=dict)  # pod uid → driver → claims
    processes: dict[tuple[str, str], PodProcess] = field(default_factory=dict)
    """(pod uid, container) → its local process: every container of a pod whose image maps to one."""
    terminated: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(pod uid, container) → the `lastState.terminated` of its previous instance."""
    started: set[str] = field(default_factory=set)  # pod uids reported Running
    init_done: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(pod uid, init container) → the `state.terminated` of its run that succeeded."""
    init_failures: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(pod uid, init container) → its last failed run (`lastState.terminated`), its restarts counted."""
    init_running: dict[str, PodProcess] = field(default_factory=dict)  # pod uid → its running init container
    health: HealthCache = field(default_factory=HealthCache)
    health_watches: dict[Path, asyncio.Task[None]] = field(default_factory=dict)  # registry socket → stream
    devices: dict[str, dict[str, dict[str, list[PreparedDevice]]]] = field(default_factory=dict)
    """pod uid → ResourceClaim name → driver → its prepared devices (the kubelet's claim info cache)."""
    pod_names: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod uid → (namespace, name)
    ready: dict[tuple[str, str], bool] = field(default_factory=dict)
    """(pod uid, container) → its readiness, for the containers whose probes say it (others: ready)."""
    probers: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)  # (uid, container) → probes
    machine: subprocess.Popen[bytes] | None = None
    """The first process of the node's PID namespace (the node is a machine: its /proc is its own)."""
    pidns: str | None = None
    """/proc/<that process>/ns/pid, which the node's containers enter."""
    hollow_agent_pod: str | None = None
    """On a hollow node: the uid of the agent pod its HollowAgent stands in for (hollow.py)."""

    def plugin_for(self, driver: str) -> Plugin | HollowAgent | None:
        return next((p for p in self.plugins.values() if p.driver == driver), None)


def _readiness_conditions(ready: list[bool], before: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def record_path(node: SimNode, namespace: str, pod: str, container: str) -> Path:
    """Where a started container's record is (what it was given: CDI edits, env, command)."""
    return node.containers_dir / f"{namespace}_{pod}_{container}.json"


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


def _daemon_pod(pod: Pod) -> bool:
    """Whether a DaemonSet owns the pod: node-level software, which a hollow node runs hollow."""
    return any(o.kind == "DaemonSet" for o in (pod.metadata.ownerReferences or [] if pod.metadata else []))


class PodFailed(Exception):
    """The pod failed for good (an init container failed under `restartPolicy: Never`)."""


class PodNotReady(Exception):
    """The pod cannot start yet; the message is what it waits for (shown as a pod event)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class KubeletConfig:
    """How the simulated kubelets behave; the defaults are the real kubelet's where it has one."""

    images: dict[str, ImageProgram] = field(default_factory=dict)
    """Container image (without tag) → what it runs; pods with such an image run as processes."""
    api_server: str = ""
    """https://host:port of the API server, for KUBERNETES_SERVICE_HOST/PORT in local processes."""
    hardware_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node name → environment giving a local process that node's hardware identity (NVML)."""
    shim: Path | None = None
    """The containers' shim (nvlfabric/sim/shim; hardware.build_standins builds it); None: built here."""
    pki_dir: Path | None = None
    """The cluster's CA (ca.crt, ca.key): each node's kubelet API is served with a certificate it
    signs, for `kubectl logs`. None: no kubelet API."""


class SimKubelet:
    def __init__(self, client: AsyncClient, nodes: Sequence[SimNode], config: KubeletConfig,
                 *, token_requester: Callable[[str, str, str], Any] | None = None,
                 heartbeat_client: AsyncClient | None = None) -> None:
        self.client = client
        # Heartbeats have a client (a connection pool) of their own, as the kubelet's do: pod
        # syncs that fill the main client's pool while hundreds of pods start must not delay a
        # Lease renewal past the node-lifecycle controller's grace period.
        self.heartbeat_client = heartbeat_client or client
        self.config = config
        self.nodes = {n.name: NodeState(n) for n in nodes}
        self.token_requester = token_requester
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._pod_tasks: dict[str, asyncio.Task[None]] = {}
        # Pods that changed while their sync ran: it may have read the object before the change
        # (a deletion arriving mid-sync must not be lost: the pod would stay Terminating).
        self._changed_during_sync: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._servers: list[asyncio.Server] = []
        self._stopping = asyncio.Event()
        self._sources = volumes.Sources(client)
        self._sync_slots = asyncio.Semaphore(SYNC_SLOTS)
        self._latest: dict[str, Pod] = {}
        """Each pod as the watch last showed it: a sync reads it there, as the kubelet reads its pods
        from its informer, instead of a GET per sync (2,300 GETs for 1,152 pods at 64 racks)."""
        self._terminated: set[str] = set()
        """Pods this kubelet stopped and deleted, until the watch shows them gone."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        # A hollow node becomes a machine (and serves its kubelet API) only when a process is to
        # run on it (hollow.py): a thousand idle PID namespaces and TLS servers would cost more
        # than the nodes themselves.
        for state in self.nodes.values():
            if not state.node.hollow:
                self._start_machine(state)
        await asyncio.gather(*(self._register_node(s) for s in self.nodes.values()))
        if self.config.pki_dir is not None:
            for state in self.nodes.values():
                if not state.node.hollow:
                    await self._serve_api(state, self.config.pki_dir)
        self._tasks = [asyncio.create_task(self._supervise(loop)) for loop in (self._plugin_loop, self._pod_watch)]
        # Each node heartbeats on its own phase, as independent kubelets do, rather than all
        # nodes in one burst every interval.
        self._tasks += [asyncio.create_task(self._supervise(functools.partial(self._heartbeats, s,
                                                                               i / len(self.nodes))))
                        for i, s in enumerate(self.nodes.values())]

    async def _supervise(self, loop: Callable[[], Any]) -> None:
        """Keep a background loop alive: log what broke it and start it again."""
        while not self._stopping.is_set():
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; restarting it in 1 s", loop.__name__)
                await asyncio.sleep(1)

    async def stop(self) -> None:
        self._stopping.set()
        for server in self._servers:
            server.close()
        watches = [t for state in self.nodes.values() for t in [*state.health_watches.values(),
                                                                 *state.probers.values()]]
        for t in [*self._tasks, *self._pod_tasks.values(), *watches]:
            t.cancel()
        for t in [*self._tasks, *self._pod_tasks.values(), *watches]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        stop_all([proc for state in self.nodes.values() for proc in state.processes.values()],
                 timeout=PROCESS_STOP_TIMEOUT_S)
        for state in self.nodes.values():
            for plugin in state.plugins.values():
                await plugin.close()
            self._stop_machine(state)

    # -- the node as a machine ---------------------------------------------------------------------

    def _start_machine(self, state: NodeState) -> None:
        """The node's PID namespace: `unshare --pid --fork` and a first process that only sleeps
        (the namespace lives as long as it does; orphans of the node's containers are re-parented
        to it). Its host pid is the forked child of unshare."""
        unshare = shutil.which("unshare") or "unshare"
        # The machine dies with this process, however it ends (setpriv --pdeathsig): were this
        # kubelet killed, its nodes' namespaces (and whatever runs in them) would live on.
        # (No pipe of ours inherited: a reader of our output must see its end when we exit.)
        state.machine = subprocess.Popen([shutil.which("setpriv") or "setpriv", "--pdeathsig", "KILL", unshare,
                                          "--pid", "--fork", "--kill-child", "sleep", "infinity"],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        init = rootfs.namespace_init(state.machine.pid)
        if init is not None:
            state.pidns = f"/proc/{init}/ns/pid"
            state.node.dir.mkdir(parents=True, exist_ok=True)
            state.node.machine_pid_file.write_text(f"{init}\n")
            return
        raise RuntimeError(f"node {state.node.name}: its PID namespace did not start (unshare --pid): simulated "
                           "nodes need root (CAP_SYS_ADMIN) for their PID and mount namespaces")

    def _stop_machine(self, state: NodeState) -> None:
        """SIGKILL the namespace's first process (the only signal it takes: unshare, waiting for
        it, ignores SIGTERM), which takes whatever still runs in the namespace with it."""
        if state.machine is None:
            return
        if state.pidns is not None:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(state.pidns.split("/")[2]), signal.SIGKILL)
        try:
            state.machine.wait(timeout=5)
        except subprocess.TimeoutExpired:
            state.machine.kill()
            state.machine.wait()

    # -- the kubelet API (kubectl logs) -------------------------------------------------------------

    async def _serve_api(self, state: NodeState, pki_dir: Path) -> None:
        n = state.node
        cert, key = pki.node_serving(pki_dir, n.name, n.address, n.dir / "pki")
        ctx = logs.server_context(cert, key, pki_dir / "ca.crt")
        try:
            self._servers.append(await logs.serve(n.address, ctx, functools.partial(self._locate_log, state)))
        except OSError as exc:  # another simulator on these addresses: the node works, logs do not
            log.warning("node %s: cannot serve the kubelet API on %s:%d (%s): `kubectl logs` will not reach it",
                        n.name, n.address, logs.KUBELET_PORT, exc)

    def _locate_log(self, state: NodeState, namespace: str, pod: str, container: str,
                    previous: bool) -> logs.LogSource:
        uid = next((u for u, ref in state.pod_names.items() if ref == (namespace, pod)), None)
        if uid is None:
            raise logs.LogError(404, f'pod "{pod}" in namespace "{namespace}" is not running on node {state.node.name}')
        if not record_path(state.node, namespace, pod, container).exists():
            raise logs.LogError(400, f'container "{container}" in pod "{pod}" is not valid')
        path = state.node.pod_dir(uid) / f"{container}.log"
        proc = state.processes.get((uid, container))
        if previous:
            if proc is None or proc.log_offset == 0:
                raise logs.LogError(400, f'previous terminated container "{container}" in pod "{pod}" not found')
            return logs.LogSource(path, 0, proc.log_offset)
        return logs.LogSource(path, proc.log_offset if proc is not None else 0, None,
                              alive=lambda: uid in state.pod_names)

    # -- node registration and heartbeats --------------------------------------------------------

    def _node_object(self, n: SimNode) -> Node:
        return Node(metadata=ObjectMeta(name=n.name, labels=node_labels(n)))

    def _node_status(self, n: SimNode) -> dict[str, Any]:
        t = rfc3339()
        # What a GB200 compute tray with NVIDIA's device plugin advertises: its 4 GPUs as the
        # extended resource nvidia.com/gpu, so GPU requests spread pods as on a real cluster.
        capacity = {"cpu": "144", "memory": "884Gi", "pods": "110", "ephemeral-storage": "3576Gi",
                    "hugepages-2Mi": "0", GPU_RESOURCE: str(GPUS_PER_NODE)}
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

    async def _register_node(self, state: NodeState) -> None:
        n = state.node
        n.prepare_dirs()
        try:
            with api_call(f"register Node {n.name}"):
                obj = await self.client.create(self._node_object(n))
        except errors.AlreadyExists:
            obj = await self.client.get(Node, n.name)
        assert obj.metadata is not None
        state.uid = obj.metadata.uid or ""
        await self.client.patch(Node.Status, n.name, self._node_status(n))
        with contextlib.suppress(errors.AlreadyExists), api_call(f"create the Lease of Node {n.name}"):
            await self.client.create(self._lease(state))
        # A starting kubelet deletes every ResourceSlice of its node; drivers must republish.
        await self._wipe_slices(n.name, driver=None)

    async def _heartbeats(self, state: NodeState, phase: float) -> None:
        """One node's Lease renewals every LEASE_RENEW_S (a failed one tried again within LEASE_RETRY_S)
        and its status report every STATUS_REPORT_S, starting `phase` of an interval late. A node
        that is "down" (nvlfabric-sim fault node-down) stops both, as a dead machine does; the
        node-lifecycle controller then marks it NotReady and taints it."""
        await asyncio.sleep(phase * LEASE_RENEW_S)
        next_status = time.monotonic() + STATUS_REPORT_S * (1 + phase)
        while not self._stopping.is_set():
            due = time.monotonic() + LEASE_RENEW_S
            if not state.node.is_down():
                await self._renew(state, due)
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + STATUS_REPORT_S
                    with contextlib.suppress(Exception):
                        await self.heartbeat_client.patch(Node.Status, state.node.name, self._node_status(state.node))
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def _renew(self, state: NodeState, due: float) -> None:
        """Renew the node's Lease (made anew when it is gone, as the kubelet's lease controller
        does), trying again with back-off until the next renewal is due."""
        name = state.node.name
        for delay in (*LEASE_RETRY_S, None):
            stamp = now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            try:
                try:
                    with api_call(f"renew the Lease of Node {name}"):
                        await self.heartbeat_client.patch(Lease, name, {"spec": {"renewTime": stamp}},
                                                          namespace="kube-node-lease", patch_type=PatchType.MERGE)
                except errors.NotFound:
                    with api_call(f"create the Lease of Node {name}"):
                        await self.heartbeat_client.create(self._lease(state))
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

    def _lease(self, state: NodeState) -> Lease:
        n = state.node
        return Lease(
            metadata=ObjectMeta(name=n.name, namespace="kube-node-lease", ownerReferences=[
                OwnerReference(apiVersion="v1", kind="Node", name=n.name, uid=state.uid)]),
            spec=LeaseSpec(holderIdentity=n.name, leaseDurationSeconds=LEASE_DURATION_S, renewTime=now()))

    async def _wipe_slices(self, node: str, *, driver: str | None) -> None:
        fields: dict[str, Any] = {"spec.nodeName": node} | ({"spec.driver": driver} if driver else {})
        async for s in self.client.list(ResourceSlice, fields=fields):
            assert s.metadata is not None and s.metadata.name is not None
            with contextlib.suppress(ApiError):
                await self.client.delete(ResourceSlice, s.metadata.name)

    # -- plugins ---------------------------------------------------------------------------------

    async def _plugin_loop(self) -> None:
        while not self._stopping.is_set():
            for state in self.nodes.values():
                if not state.node.hollow:  # a hollow node's plugin is its HollowAgent, registered in-process
                    await self._scan_plugins(state)
                await self._restart_exited(state)
            await asyncio.sleep(PLUGIN_SCAN_S)

    async def _restart_exited(self, state: NodeState) -> None:
        """Containers of local-process pods that died are restarted (restartPolicy Always), with the
        restart counted in the pod status, as a kubelet does for a crashed DaemonSet container."""
        for key, proc in list(state.processes.items()):
            code = proc.proc.poll()
            if code is None or time.monotonic() < proc.restart_after:
                continue
            log.warning("node %s: container %s of pod %s exited with %s; restarting", state.node.name,
                        proc.container.name, proc.pod_name, code)
            try:
                pod = await self.client.get(Pod, proc.pod_name, namespace=proc.namespace)
            except ApiError:
                state.processes.pop(key, None)
                continue
            if pod.metadata is None or pod.metadata.deletionTimestamp is not None:
                continue
            message = proc.termination_message(code)
            state.terminated[key] = {"exitCode": code if code >= 0 else 128 - code, "reason": "Error",
                                     "finishedAt": rfc3339(), **({"message": message} if message else {})}
            state.processes[key] = proc.restart()
            self._start_prober(state, key)
            await self._report_running(state, pod)

    async def _scan_plugins(self, state: NodeState) -> None:
        present = registry_sockets(state.node.registry_dir)
        # Gone, or replaced by a new socket on the same path (a plugin restarted between two scans):
        # the old registration goes first, so that the new one is not refused as a duplicate.
        for sock in [s for s, p in state.plugins.items() if present.get(s) != p.socket_id]:
            plugin = state.plugins.pop(sock)
            watch = state.health_watches.pop(sock, None)
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await plugin.close()
            if state.plugin_for(plugin.driver) is None:
                state.driver_gone_since[plugin.driver] = time.monotonic()
            log.info("node %s: DRA plugin %s unregistered", state.node.name, plugin.driver)
        for sock in present.keys() - set(state.plugins):
            endpoints = {p.endpoint for p in state.plugins.values()}
            try:
                plugin = await register(sock, registered_endpoints=endpoints,
                                        host_view=lambda p: str(state.node.host_view(p)))
            except RegistrationError as exc:
                log.warning("node %s: plugin registration failed: %s", state.node.name, exc)
                continue
            plugin.socket_id = present[sock]
            state.plugins[sock] = plugin
            state.driver_gone_since.pop(plugin.driver, None)
            log.info("node %s: registered DRA plugin %s (%s) at %s", state.node.name, plugin.driver,
                     plugin.service, plugin.endpoint)
            if plugin.health_service:
                state.health_watches[sock] = asyncio.create_task(self._watch_health(state, plugin))
        for driver, since in list(state.driver_gone_since.items()):
            if time.monotonic() - since >= WIPING_DELAY_S:
                del state.driver_gone_since[driver]
                await self._wipe_slices(state.node.name, driver=driver)

    # -- device health ---------------------------------------------------------------------------

    async def _watch_health(self, state: NodeState, plugin: Plugin) -> None:
        """The plugin's health stream for as long as it is registered, opened again 5 s after it
        ends; when it ends, the driver's devices turn Unknown (as the kubelet's cache is cleared)."""
        while not self._stopping.is_set():
            try:
                async for report in plugin.watch_health():
                    await self._health_changed(state, state.health.update(plugin.driver, report, time.monotonic()))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("node %s: %s serves no health stream", state.node.name, plugin.driver)
                    return
                log.info("node %s: health stream of %s ended: %s", state.node.name, plugin.driver, exc.code().name)
            finally:
                await asyncio.shield(self._health_changed(state, state.health.clear(plugin.driver)))
            await asyncio.sleep(STREAM_RETRY_S)

    async def _health_changed(self, state: NodeState, changed: set[DeviceKey]) -> None:
        if not changed:
            return
        pods = [uid for uid, prepared in state.devices.items() if uses(prepared, changed)]
        await asyncio.gather(*(self._write_health(state, uid) for uid in pods), return_exceptions=True)

    async def _write_health(self, state: NodeState, uid: str) -> None:
        """Re-write one running pod's allocatedResourcesStatus."""
        def edit(pod: Pod, statuses: list[dict[str, Any]]) -> dict[str, Any]:
            health = allocated_resources_status(pod, state.devices.get(uid, {}), state.health, time.monotonic())
            for d in statuses:
                d.pop("allocatedResourcesStatus", None)
                if d["name"] in health:
                    d["allocatedResourcesStatus"] = health[d["name"]]
            return {"containerStatuses": statuses}

        await self._rewrite_status(state, uid, edit)

    async def _resync_status(self, state: NodeState, pod: Pod) -> None:
        """Write a running pod's readiness again when the API server's copy says otherwise, as the
        kubelet's status manager does: the node-lifecycle controller sets `Ready` False on the pods
        of a node it marked NotReady, and once the node is back nothing else would set it True
        again (the pod stayed `ContainersReady` True, `Ready` False for good)."""
        assert pod.metadata is not None and pod.spec is not None
        uid = pod.metadata.uid or ""
        want = all(state.ready.get((uid, c.name), True) for c in pod.spec.containers)
        conditions = {c.type: c.status for c in (pod.status.conditions or [])} if pod.status else {}
        if conditions.get("Ready") != ("True" if want else "False") or \
                conditions.get("ContainersReady") != ("True" if want else "False"):
            log.info("pod %s/%s: its status says Ready=%s, the node says %s; writing it again",
                     pod.metadata.namespace, pod.metadata.name, conditions.get("Ready"), want)
            await self._write_ready(state, uid)

    async def _write_ready(self, state: NodeState, uid: str) -> None:
        """Re-write one running pod's readiness: its containers' `ready`, its Ready condition."""
        def edit(pod: Pod, statuses: list[dict[str, Any]]) -> dict[str, Any]:
            for d in statuses:
                d["ready"] = state.ready.get((uid, d["name"]), True)
            return {"containerStatuses": statuses, "conditions": _readiness_conditions(
                [d["ready"] for d in statuses], [c.to_dict() for c in (pod.status.conditions or [])]
                if pod.status else [])}

        await self._rewrite_status(state, uid, edit)

    async def _rewrite_status(self, state: NodeState, uid: str,
                              edit: Callable[[Pod, list[dict[str, Any]]], dict[str, Any]]) -> None:
        """Re-write part of one running pod's status. The pod's containerStatuses (and conditions)
        are one list each (no merge key): written whole, guarded by the resourceVersion read, read
        again on a conflict, so a concurrent status write (a restart count) is never lost."""
        namespace, name = state.pod_names.get(uid, ("", ""))
        for _ in range(3):
            try:
                with api_call(f"read pod {namespace}/{name}"):
                    pod = await self.client.get(Pod, name, namespace=namespace)
            except errors.NotFound:
                return
            if pod.metadata is None or pod.metadata.uid != uid or pod.status is None or pod.status.phase != "Running":
                return
            status = edit(pod, [cs.to_dict() for cs in pod.status.containerStatuses or []])
            try:
                with api_call(f"write the status of pod {namespace}/{name}"):
                    await self.client.patch(Pod.Status, name, {
                        "metadata": {"resourceVersion": pod.metadata.resourceVersion},
                        "status": status}, namespace=namespace, patch_type=PatchType.MERGE)
                return
            except errors.Conflict:
                continue

    # -- probes ----------------------------------------------------------------------------------

    def _start_prober(self, state: NodeState, key: tuple[str, str]) -> None:
        """Probe one process container, anew for each instance (a restart starts over)."""
        old = state.probers.pop(key, None)
        if old is not None:
            old.cancel()
        proc = state.processes.get(key)
        if proc is None or not (found := probes.probes_of(proc.container)):
            return
        if "readiness" in found or "startup" in found:
            state.ready[key] = False
        state.probers[key] = asyncio.create_task(self._probe(state, key[0], proc, found))

    async def _probe(self, state: NodeState, uid: str, proc: PodProcess, found: dict[str, probes.Probe]) -> None:
        ports = {p.name: p.containerPort for p in proc.container.ports or [] if p.name}

        async def once(probe: probes.Probe) -> bool:
            # Inside the container (its pid from the pid file), not in its shim's (the host's) mount namespace.
            pid = proc.container_pid()
            for _ in range(40):  # a probe's first try can come before the proxy has forked the container
                if pid is not None or probe.spec.exec is None or proc.proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
                pid = proc.container_pid()
            if pid is None and probe.spec.exec is not None:
                ok, seen = False, "the container's process is not running (yet)"
            else:
                ok, seen = await probes.check(probe, host=state.node.address, ports=ports, env=proc.env,
                                              cwd=proc.cwd, enter=pid)
            if not ok:
                await self._pod_event(proc, "Unhealthy", f"{probe.title} probe failed: {seen}", warning=True)
            return ok

        async def kill(probe: probes.Probe) -> None:
            await self._pod_event(proc, "Killing", f"Container {proc.container.name} failed {probe.kind} probe, "
                                                   "will be restarted", warning=False)
            proc.kill()  # _restart_exited restarts it, counting the restart

        async def loop(probe: probes.Probe, counter: probes.Counter, changed: Callable[[bool], Any]) -> None:
            await asyncio.sleep(probe.initial_delay_s)
            while proc.proc.poll() is None:
                verdict = counter.observe(await once(probe), probe)
                if verdict is not None:
                    await changed(verdict)
                await asyncio.sleep(probe.period_s)

        async def readiness_changed(ready: bool) -> None:
            state.ready[(uid, proc.container.name)] = ready
            await self._write_ready(state, uid)

        async def liveness_changed(alive: bool) -> None:
            if not alive:
                await kill(found["liveness"])

        while proc.proc.poll() is None:
            try:
                await self._probe_once(proc, found, once, kill, loop, readiness_changed, liveness_changed)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # A probe must outlive what breaks it (an API write timing out on a loaded node: the
                # container would never be Ready): say it, and probe afresh, from the startup probe.
                log.exception("probing container %s of pod %s failed; probing it again in 1 s",
                              proc.container.name, proc.pod_name)
                await asyncio.sleep(1)

    @staticmethod
    async def _probe_once(proc: PodProcess, found: dict[str, probes.Probe], once: Callable[[probes.Probe], Any],
                          kill: Callable[[probes.Probe], Any], loop: Callable[..., Any],
                          readiness_changed: Callable[[bool], Any], liveness_changed: Callable[[bool], Any]) -> None:
        """The container's probes as the kubelet runs them: startup first, then readiness and liveness."""
        if (startup := found.get("startup")) is not None:
            started = probes.Counter(passing=False)
            counted = probes.Counter(passing=True)  # its failures count towards the kill
            await asyncio.sleep(startup.initial_delay_s)
            while proc.proc.poll() is None:
                ok = await once(startup)
                if started.observe(ok, startup):
                    break
                if counted.observe(ok, startup) is False:
                    await kill(startup)
                    return
                await asyncio.sleep(startup.period_s)
            if "readiness" not in found:
                await readiness_changed(True)
        loops = []
        if (readiness := found.get("readiness")) is not None:
            loops.append(loop(readiness, probes.Counter(passing=False), readiness_changed))
        if (liveness := found.get("liveness")) is not None:
            loops.append(loop(liveness, probes.Counter(passing=True), liveness_changed))
        await asyncio.gather(*loops)

    async def _pod_event(self, proc: PodProcess, reason: str, message: str, *, warning: bool) -> None:
        """Best effort, as the kubelet's event recorder: an event lost to a busy API server must not
        stop what reported it (a prober)."""
        try:
            pod = await self.client.get(Pod, proc.pod_name, namespace=proc.namespace)
            await self._event(pod, reason, message, warning=warning)
        except Exception as exc:  # transport errors (pool, read timeouts) as well as API ones
            log.info("pod %s/%s: event %s not written (%s)", proc.namespace, proc.pod_name, reason, exc)

    # -- pods ------------------------------------------------------------------------------------

    async def _pod_watch(self) -> None:
        async for event, pod in self.client.watch(Pod, namespace=ALL_NS):
            if self._stopping.is_set():
                return
            node = pod.spec.nodeName if pod.spec else None
            if node not in self.nodes or pod.metadata is None or pod.metadata.uid is None:
                continue
            if event == "DELETED":
                self._latest.pop(pod.metadata.uid, None)
                self._terminated.discard(pod.metadata.uid)
                continue
            if pod.metadata.uid in self._terminated:  # its deletion, on its way: nothing left to do
                continue
            self._latest[pod.metadata.uid] = pod
            self._kick(pod)

    def _kick(self, pod: Pod) -> None:
        assert pod.metadata is not None and pod.metadata.uid is not None
        uid = pod.metadata.uid
        task = self._pod_tasks.get(uid)
        if task is not None and not task.done():
            self._changed_during_sync.add(uid)  # the running sync goes round once more
            return
        self._pod_tasks[uid] = asyncio.create_task(self._sync_pod_logged(pod.metadata.namespace or "default",
                                                                         pod.metadata.name or "", uid))

    async def _sync_pod_logged(self, namespace: str, name: str, uid: str) -> None:
        while not self._stopping.is_set():
            self._changed_during_sync.discard(uid)  # the sync below reads the pod after this point
            try:
                await self._sync_pod(namespace, name, uid)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Only what escaped _sync_pod's own retries (a bug): the pod must not be stranded.
                log.exception("syncing pod %s/%s failed; syncing it again in 1 s", namespace, name)
                await asyncio.sleep(1)
                continue
            if uid not in self._changed_during_sync:
                return

    async def _sync_pod(self, namespace: str, name: str, uid: str) -> None:
        attempt = 0
        while not self._stopping.is_set():
            # At most SYNC_SLOTS pods talk to the API server at once: the client's connection pool
            # walks its whole queue for every request it assigns, and a thousand hollow pods
            # starting together made that queue the process's busiest loop.
            async with self._sync_slots:
                outcome = await self._sync_attempt(namespace, name, uid)
            if outcome is None:
                return
            if isinstance(outcome, tuple):  # started or running: a Job pod may finish later
                await self._maybe_complete(*outcome)
                return
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1

    async def _sync_attempt(self, namespace: str, name: str, uid: str) -> tuple[NodeState, Pod] | bool | None:
        """One pass over the pod: None when done with it, (node, pod) when it runs, False to retry."""
        if uid in self._terminated:
            return None
        try:
            pod = self._latest.get(uid)
            if pod is None:  # not seen by the watch (a restart of this kubelet's sync): read it
                with api_call(f"read pod {namespace}/{name}"):
                    pod = await self.client.get(Pod, name, namespace=namespace)
        except errors.NotFound:
            return None
        except errors.NvlfabricError as exc:
            # An API server too busy to answer (seen: the client's connection pool timing out
            # with 144 nodes starting on 2 cores) must not strand the pod: read it again.
            log.warning("pod %s/%s: %s; retrying", namespace, name, exc)
            return False
        if pod.metadata is None or pod.metadata.uid != uid or pod.spec is None:
            return None
        state = self.nodes[pod.spec.nodeName or ""]
        try:
            if pod.metadata.deletionTimestamp is not None:
                await self._terminate(state, pod)
                return None
            phase = pod.status.phase if pod.status else None
            if phase in ("Succeeded", "Failed"):
                return None
            if uid not in state.started:
                await self._start(state, pod)
            elif phase == "Running" and not state.node.is_down():
                await self._resync_status(state, pod)
            return state, pod
        except PodNotReady as exc:
            await self._event(pod, exc.reason, str(exc), warning=True)
        except PodFailed:
            return None
        except (PluginCallError, ApiError, errors.NvlfabricError, OSError) as exc:
            await self._event(pod, "FailedSync", str(exc), warning=True)
        except Exception as exc:  # a bug of ours must not strand the pod: log it and retry
            log.exception("syncing pod %s/%s failed", namespace, name)
            await self._event(pod, "FailedSync", f"simulated kubelet error: {exc!r}", warning=True)
        return False

    async def _claims(self, pod: Pod) -> list[ResourceClaim]:
        assert pod.spec is not None and pod.metadata is not None
        names: dict[str, str | None] = {}
        statuses = {s.name: s.resourceClaimName for s in (pod.status.resourceClaimStatuses or [])} \
            if pod.status else {}
        for rc in pod.spec.resourceClaims or []:
            names[rc.name] = rc.resourceClaimName or statuses.get(rc.name)
        claims = []
        for ref, claim_name in names.items():
            if not claim_name:
                raise PodNotReady("FailedPrepareDynamicResources",
                                  f"waiting for ResourceClaim of pod claim {ref!r} to be created")
            try:
                with api_call(f"read ResourceClaim {claim_name}"):
                    claim = await self.client.get(ResourceClaim, claim_name, namespace=pod.metadata.namespace)
            except errors.ApiStatusError as exc:
                raise PodNotReady("FailedPrepareDynamicResources",
                                  f"ResourceClaim {claim_name}: {exc.message}") from exc
            if not (claim.status and claim.status.allocation) or not reserved_for(claim, pod):
                raise PodNotReady("FailedPrepareDynamicResources",
                                  f"ResourceClaim {claim_name} is not allocated and reserved for this pod yet")
            claims.append(claim)
        return claims

    async def _volume_files(self, pod: Pod) -> dict[str, volumes.Files]:
        """The pod's configMap/secret/downwardAPI/projected volume files, before anything else
        (as the kubelet mounts volumes before it prepares claims). The service-account token is
        requested only for a pod that runs a process: nothing else would read it."""
        assert pod.metadata is not None and pod.spec is not None
        namespace, name, account = pod.metadata.namespace or "default", pod.metadata.name or "", \
            pod.spec.serviceAccountName
        runs = any(self._runs(self.nodes[pod.spec.nodeName or ""], pod, c) for c in pod.spec.containers)
        token: list[str | None] = []

        async def pod_token() -> str | None:
            if not token:
                requester = self.token_requester if runs and account else None
                token.append(await requester(namespace, account or "", name) if requester is not None else None)
            return token[0]

        try:
            return await volumes.contents(self._sources, pod, pod_token)
        except volumes.MountError as exc:
            raise PodNotReady("FailedMount", f"MountVolume.SetUp failed: {exc}") from exc

    async def _start(self, state: NodeState, pod: Pod) -> None:
        assert pod.metadata is not None and pod.spec is not None
        uid = pod.metadata.uid or ""
        files = await self._volume_files(pod)
        claims = await self._claims(pod)
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in claims:
            assert claim.metadata is not None and claim.status and claim.status.allocation
            drivers = {r.driver for r in (claim.status.allocation.devices.results or [])} \
                if claim.status.allocation.devices else set()
            ref = ClaimRef(namespace=claim.metadata.namespace or "", name=claim.metadata.name or "",
                           uid=claim.metadata.uid or "")
            for d in drivers:
                by_driver.setdefault(d, []).append(ref)
        # request name → CDI IDs, per claim name (pod-level claim name as containers reference it)
        cdi_by_claim: dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
        pod_claim_name = {}
        statuses = {s.resourceClaimName: s.name for s in (pod.status.resourceClaimStatuses or [])} \
            if pod.status else {}
        for rc in pod.spec.resourceClaims or []:
            pod_claim_name[rc.resourceClaimName or ""] = rc.name
        for driver, refs in by_driver.items():
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
                local = pod_claim_name.get(ref.name) or statuses.get(ref.name) or ref.name
                cdi_by_claim.setdefault(local, []).extend((d.request_names, d.cdi_device_ids) for d in devices)
        records = {}
        edits_of: dict[str, ContainerEdits] = {}
        for container in [*(pod.spec.initContainers or []), *pod.spec.containers]:
            ids: list[str] = []
            for c in (container.resources.claims or []) if container.resources else []:
                for requests, cdi_ids in cdi_by_claim.get(c.name, []):
                    if not requests or (c.request and c.request in requests) or not c.request:
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
                                       **container_config(pod, state.node, container)}
        state.node.containers_dir.mkdir(parents=True, exist_ok=True)
        for cname, record in records.items():
            path = record_path(state.node, pod.metadata.namespace or "default", pod.metadata.name or "", cname)
            record |= {"pod": pod.metadata.name, "namespace": pod.metadata.namespace, "pod_uid": uid,
                       "container": cname, "node": state.node.name}
            path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        await self._run_init_containers(state, pod, edits_of, files)
        await self._maybe_run_process(state, pod, edits_of, files)
        for container in [*(pod.spec.initContainers or []), *pod.spec.containers]:
            out = state.node.pod_dir(uid) / f"{container.name}.log"
            if not out.exists():  # runs nothing here: its log says so, and where its record is
                out.parent.mkdir(parents=True, exist_ok=True)
                recorded = record_path(state.node, pod.metadata.namespace or "default", pod.metadata.name or "",
                                       container.name)
                out.write_text(f"nvlfabric-sim: container {container.name} (image {container.image}) is simulated on "
                               f"node {state.node.name}: its image maps to no local program (nvlfabric-sim up "
                               f"--images), so nothing runs; what it was given (env, command, CDI devices) is in "
                               f"{recorded}\n")
        state.pod_names[uid] = (pod.metadata.namespace or "default", pod.metadata.name or "")
        await self._report_running(state, pod)
        state.started.add(uid)

    async def _run_init_containers(self, state: NodeState, pod: Pod, edits: dict[str, ContainerEdits],
                                   files: dict[str, volumes.Files]) -> None:
        """The pod's init containers, in order, before its containers: each runs to completion (one
        whose image maps to no program completes at once); a failed one is retried with back-off
        (the earlier ones stay done), or fails the pod under `restartPolicy: Never`. A sidecar
        (`restartPolicy: Always`) starts and runs on beside the containers from its turn on."""
        assert pod.metadata is not None and pod.spec is not None
        uid = pod.metadata.uid or ""
        for c in pod.spec.initContainers or []:
            key = (uid, c.name)
            if c.restartPolicy == "Always":
                if self._runs(state, pod, c) and key not in state.processes:
                    state.processes[key] = self._container_process(state, pod, c, edits, files)
                    self._start_prober(state, key)
                continue
            if key in state.init_done:
                continue
            started = rfc3339()
            if not self._runs(state, pod, c):
                state.init_done[key] = {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                        "finishedAt": started}
                continue
            proc = state.init_running[uid] = self._container_process(state, pod, c, edits, files)
            await self._write_initializing(state, pod, running=c.name, since=started)
            try:
                code = await asyncio.to_thread(proc.proc.wait)
            finally:
                state.init_running.pop(uid, None)
            ended = {"exitCode": code if code >= 0 else 128 - code, "startedAt": started, "finishedAt": rfc3339()}
            if code == 0:
                state.init_done[key] = {**ended, "reason": "Completed"}
                continue
            message = proc.termination_message(code)
            failure = {**ended, "reason": "Error", **({"message": message} if message else {}),
                       "restarts": state.init_failures.get(key, {}).get("restarts", -1) + 1}
            state.init_failures[key] = failure
            if pod.spec.restartPolicy == "Never":
                await self._write_initializing(state, pod, running=None, since=started, failed=True)
                raise PodFailed(c.name)
            await self._write_initializing(state, pod, running=None, since=started)
            raise PodNotReady("BackOff", f"Back-off restarting failed init container {c.name} in pod "
                                         f"{pod.metadata.name} (exit code {ended['exitCode']})")

    def _init_statuses(self, state: NodeState, pod: Pod, running: str | None, since: str,
                       failed: bool = False) -> list[dict[str, Any]]:
        """`initContainerStatuses`: done ones terminated, the running one running, a failed one
        waiting in back-off with its failure as lastState (terminated, once the pod failed)."""
        assert pod.metadata is not None and pod.spec is not None
        uid = pod.metadata.uid or ""
        out = []
        for c in pod.spec.initContainers or []:
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
            out.append(status)
        return out

    async def _write_initializing(self, state: NodeState, pod: Pod, *, running: str | None, since: str,
                                  failed: bool = False) -> None:
        """The pod while its init containers run (kubectl shows `Init:<done>/<all>`), or Failed."""
        assert pod.metadata is not None and pod.spec is not None
        statuses = self._init_statuses(state, pod, running, since, failed)
        waiting = [{"name": c.name, "image": c.image or "", "imageID": "", "ready": False, "restartCount": 0,
                    "started": False, "state": {"waiting": {"reason": "PodInitializing"}}} for c in pod.spec.containers]
        t = rfc3339()
        condition = {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                     "lastTransitionTime": t}
        await self.client.patch(Pod.Status, pod.metadata.name or "", {"status": {
            "phase": "Failed" if failed else "Pending", "hostIP": state.node.address,
            "hostIPs": [{"ip": state.node.address}], "podIP": state.node.address,
            "podIPs": [{"ip": state.node.address}], "startTime": since, "conditions": [condition],
            "initContainerStatuses": statuses, "containerStatuses": waiting}}, namespace=pod.metadata.namespace)

    def _container_process(self, state: NodeState, pod: Pod, container: Container,
                           edits: dict[str, ContainerEdits], files: dict[str, volumes.Files]) -> PodProcess:
        program = program_for(self.config.images, container.image or "")
        assert program is not None  # (`_runs` said so)
        if state.pidns is None:  # a hollow node's first process: it becomes a machine now
            self._start_machine(state)
            if self.config.pki_dir is not None:
                self._tasks.append(asyncio.get_running_loop().create_task(self._serve_api(state, self.config.pki_dir)))
        if self.config.shim is None:
            self.config.shim = hardware.build_standins()["nvlfabric-shim"]
        return start_pod_process(node=state.node, pod=pod, container=container, program=program,
                                 api_server=self.config.api_server, files=files, shim=self.config.shim,
                                 extra_env=self.config.hardware_env.get(state.node.name, {}),
                                 cdi=edits.get(container.name), pidns=state.pidns)

    async def _maybe_run_process(self, state: NodeState, pod: Pod, edits: dict[str, ContainerEdits],
                                 files: dict[str, volumes.Files]) -> None:
        """Run each container of the pod whose image maps to a local program (sidecars too), with
        its volumes' files and the CDI edits of its claims' devices applied (as a runtime applies them)."""
        assert pod.metadata is not None and pod.spec is not None
        uid = pod.metadata.uid or ""
        for container in pod.spec.containers:
            if state.node.hollow and _daemon_pod(pod) and is_agent(container.image or "", [
                    *(container.command or []), *(container.args or [])]):
                await self._start_hollow_agent(state, uid)
            if not self._runs(state, pod, container) or (uid, container.name) in state.processes:
                continue
            state.processes[(uid, container.name)] = self._container_process(state, pod, container, edits, files)
            self._start_prober(state, (uid, container.name))

    def _runs(self, state: NodeState, pod: Pod, container: Container) -> bool:
        """Whether the container runs as a local process here: its image maps to a program, and it
        is not a DaemonSet's on a hollow node (which runs nothing: hollow.py)."""
        return (program_for(self.config.images, container.image or "") is not None
                and not (state.node.hollow and _daemon_pod(pod)))

    async def _start_hollow_agent(self, state: NodeState, uid: str) -> None:
        """The agent pod runs on a hollow node: its HollowAgent labels the node and registers, as
        the agent process would."""
        if state.hollow_agent_pod == uid:
            return
        agent = HollowAgent(self.client, state.node, hardware.node_clique(state.node))
        await agent.start()
        state.plugins[agent.registration_socket] = agent
        state.hollow_agent_pod = uid

    async def _report_running(self, state: NodeState, pod: Pod) -> None:
        """Write the pod Running: each container's readiness, restarts and last termination as its
        process (if it runs one) has them."""
        assert pod.metadata is not None and pod.spec is not None
        t = rfc3339()
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
        health = allocated_resources_status(pod, state.devices.get(pod.metadata.uid or "", {}), state.health,
                                            time.monotonic())
        for cs in containers:
            if cs["name"] in health:
                cs["allocatedResourcesStatus"] = health[cs["name"]]
        status = {"status": {
            "phase": "Running", "startTime": t, "hostIP": state.node.address,
            "hostIPs": [{"ip": state.node.address}], "podIP": state.node.address,
            "podIPs": [{"ip": state.node.address}],
            "conditions": _readiness_conditions([cs["ready"] for cs in containers], []),
            "containerStatuses": containers,
            **({"initContainerStatuses": self._init_statuses(state, pod, None, t)} if pod.spec.initContainers else {}),
        }}
        await self.client.patch(Pod.Status, pod.metadata.name or "", status, namespace=pod.metadata.namespace)
        # A probe that changed readiness while this write was in flight found the pod not Running
        # yet and wrote nothing (_rewrite_status): write it now, or the pod keeps the old value
        # until the next change, which for a passing probe never comes.
        if any(state.ready.get((uid, cs["name"]), True) != cs["ready"] for cs in containers):
            await self._write_ready(state, uid)

    async def _maybe_complete(self, state: NodeState, pod: Pod) -> bool:
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
        await self.client.patch(Pod.Status, pod.metadata.name or "", {"status": {
            "phase": "Succeeded", "containerStatuses": containers,
            "conditions": [{"type": c, "status": "False", "reason": "PodCompleted", "lastTransitionTime": t}
                           for c in ("Ready", "ContainersReady")]}}, namespace=pod.metadata.namespace)
        return True

    async def _terminate(self, state: NodeState, pod: Pod) -> None:
        assert pod.metadata is not None
        uid = pod.metadata.uid or ""
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
        stop_all([state.processes.pop(k) for k in keys], timeout=PROCESS_STOP_TIMEOUT_S)
        if state.hollow_agent_pod == uid:  # the agent stops: its plugin is unregistered (its labels stay)
            state.hollow_agent_pod = None
            state.plugins = {k: p for k, p in state.plugins.items() if not isinstance(p, HollowAgent)}
        prepared = state.prepared.get(uid)
        if prepared is None and pod.spec and pod.spec.resourceClaims:
            # Not prepared by this process (e.g. the kubelet restarted): unprepare anyway, as the
            # kubelet does from its checkpoint; plugins must treat unknown claims as done.
            prepared = await self._prepared_from_api(pod)
        for driver, refs in list((prepared or {}).items()):
            plugin = state.plugin_for(driver)
            if plugin is None:
                raise PodNotReady("FailedUnprepareDynamicResources",
                                  f"DRA driver {driver} is not registered on node {state.node.name}")
            errors = {u: e for u, e in (await plugin.unprepare(refs)).items() if e}
            if errors:
                raise PodNotReady("FailedUnprepareDynamicResources",
                                  "; ".join(f"claim {u}: {e}" for u, e in errors.items()))
            state.prepared.get(uid, {}).pop(driver, None)
        state.prepared.pop(uid, None)
        state.devices.pop(uid, None)  # health is not updated after the pod terminates
        state.pod_names.pop(uid, None)
        state.started.discard(uid)
        self._terminated.add(uid)
        self._latest.pop(uid, None)
        with contextlib.suppress(ApiError):
            await self.client.delete(Pod, pod.metadata.name or "", namespace=pod.metadata.namespace,
                                     grace_period=0)

    async def _prepared_from_api(self, pod: Pod) -> dict[str, list[ClaimRef]]:
        out: dict[str, list[ClaimRef]] = {}
        assert pod.metadata is not None
        for s in (pod.status.resourceClaimStatuses or []) if pod.status else []:
            if not s.resourceClaimName:
                continue
            try:
                claim = await self.client.get(ResourceClaim, s.resourceClaimName, namespace=pod.metadata.namespace)
            except ApiError:
                continue
            if claim.status and claim.status.allocation and claim.status.allocation.devices and claim.metadata:
                ref = ClaimRef(namespace=claim.metadata.namespace or "", name=claim.metadata.name or "",
                           uid=claim.metadata.uid or "")
                for d in {r.driver for r in claim.status.allocation.devices.results or []}:
                    out.setdefault(d, []).append(ref)
        return out

    async def _event(self, pod: Pod, reason: str, message: str, *, warning: bool) -> None:
        assert pod.metadata is not None
        log.info("pod %s/%s: %s: %s", pod.metadata.namespace, pod.metadata.name, reason, message)
        node = pod.spec.nodeName if pod.spec else ""
        ev = Event(
            metadata=ObjectMeta(generateName=f"{pod.metadata.name}.", namespace=pod.metadata.namespace),
            involvedObject=ObjectReference(kind="Pod", apiVersion="v1", name=pod.metadata.name,
                                           namespace=pod.metadata.namespace, uid=pod.metadata.uid),
            reason=reason, message=message[:1024], type="Warning" if warning else "Normal",
            source=EventSource(component="kubelet", host=node), firstTimestamp=now(), lastTimestamp=now(), count=1,
        )
        # Best effort, as the kubelet's recorder: an event lost to a busy API server (a pool or
        # connect timeout with 144 nodes on 2 cores) must not fail what it reports on, least of
        # all the pod sync's error path, whose retry would then never come.
        try:
            with api_call(f"create event {reason} of pod {pod.metadata.namespace}/{pod.metadata.name}"):
                await self.client.create(ev)
        except errors.NvlfabricError as exc:
            log.info("pod %s/%s: event %s not written (%s)", pod.metadata.namespace, pod.metadata.name, reason, exc)

