"""Simulated kubelets: one asyncio process hosting many GB200 nodes against the real API server.

Per node it does what a kubelet does that matters to DRA and to nvlfabric, one concern per module:
- the Node, its status and Lease (nodelease.py); the node's PID namespace (machine.py);
- DRA plugins found in `plugins_registry` and registered, their health streams watched, crashed
  containers restarted (pluginwatch.py, plugins.py, devicehealth.py);
- for each pod bound to it: its volumes (volumes.py), its claims prepared and their CDI edits
  resolved and recorded, its init containers run (podstart.py), the containers whose image maps to
  a local command run as processes (processes.py), its status written (podstatus.py), its
  probes run (prober.py, probes.py); Job pods annotated with a run time become Succeeded after it;
- for each pod being deleted: its processes stopped, its claims unprepared, then the pod deleted
  with grace period 0 (podstop.py);
- the kubelet API's container logs on the node's address (logs.py), so `kubectl logs` works.
This module holds what ties them together: the loops, the pod sync and its retries.

Pods are watched cluster-wide through one watch and dispatched to their node locally, so a
process hosting 144 nodes holds one watch, not 144.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.core.generic_client import ALL_NS
from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import Pod

from nvlfabric.api import errors
from nvlfabric.api.kubelet.cdi import ContainerEdits
from nvlfabric.kube.errors import api_call
from nvlfabric.sim import hardware, pki
from nvlfabric.sim.images import program_for
from nvlfabric.sim.kubelet import logs, nodelease, pluginwatch, podstart, podstatus, podstop, sandbox, volumes
from nvlfabric.sim.kubelet.events import pod_event
from nvlfabric.sim.kubelet.hollow import HollowAgent, is_agent
from nvlfabric.sim.kubelet.leaseclient import LeaseClient
from nvlfabric.sim.kubelet.machine import pod_pid_namespace, start_machine, stop_machine, stop_pod_pid_namespace
from nvlfabric.sim.kubelet.plugins import PluginCallError
from nvlfabric.sim.kubelet.podstatus import RUN_SECONDS_ANNOTATION
from nvlfabric.sim.kubelet.prober import start_prober
from nvlfabric.sim.kubelet.processes import PodProcess, start_pod_process, stop_all
from nvlfabric.sim.kubelet.state import (
    PROCESS_STOP_TIMEOUT_S,
    KubeletConfig,
    NodeState,
    PodFailed,
    PodNotReady,
    record_path,
)
from nvlfabric.sim.nodes import SimNode

__all__ = ["RUN_SECONDS_ANNOTATION", "KubeletConfig", "NodeState", "SimKubelet"]

log = logging.getLogger("nvlfabric.sim.kubelet")

RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # pod sync back-off, capped like the kubelet's (shorter here)
SYNC_SLOTS = 32


def _daemon_pod(pod: Pod) -> bool:
    """Whether a DaemonSet owns the pod: node-level software, which a hollow node runs hollow."""
    return any(o.kind == "DaemonSet" for o in (pod.metadata.ownerReferences or [] if pod.metadata else []))


class SimKubelet:
    def __init__(self, client: AsyncClient, nodes: Sequence[SimNode], config: KubeletConfig,
                 *, token_requester: Callable[[str, str, str], Any] | None = None,
                 leases: LeaseClient) -> None:
        self.client = client
        # Heartbeats have a client (connections) of their own, as the kubelet's do: pod syncs that
        # fill the main client's pool while hundreds of pods start must not delay a Lease renewal
        # past the node-lifecycle controller's grace period (and it is a lean one: leaseclient.py).
        self.leases = leases
        self.config = config
        self.nodes = {n.name: NodeState(n, dra_gpus=config.dra_gpus) for n in nodes}
        self.token_requester = token_requester
        self._pod_tasks: dict[str, asyncio.Task[None]] = {}
        # Pods that changed while their sync ran: it may have read the object before the change
        # (a deletion arriving mid-sync must not be lost: the pod would stay Terminating).
        self._changed_during_sync: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._servers: list[asyncio.Server] = []
        self._stopping = asyncio.Event()
        self._sources = volumes.Sources(client)
        # At most SYNC_SLOTS pods talk to the API server at once: the client's connection pool
        # walks its whole queue for every request it assigns (docs/architecture.md, Simulator).
        self._sync_slots = asyncio.Semaphore(SYNC_SLOTS)
        self._latest: dict[str, Pod] = {}
        """Each pod as the watch last showed it: a sync reads it there, as the kubelet reads its pods
        from its informer, instead of a GET per sync."""
        self._terminated: set[str] = set()
        self._released: set[str] = set()  # pods stopped and unprepared whose deletion is still to be made
        """Pods this kubelet stopped and deleted, until the watch shows them gone."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        # A hollow node becomes a machine (and serves its kubelet API) only when a process is to
        # run on it (hollow.py): a thousand idle PID namespaces and TLS servers would cost more
        # than the nodes themselves.
        for state in self.nodes.values():
            if not state.node.hollow:
                start_machine(state, self._shim())
        await asyncio.gather(*(nodelease.register_node(self.client, s) for s in self.nodes.values()))
        if self.config.pki_dir is not None:
            for state in self.nodes.values():
                if not state.node.hollow:
                    await self._serve_api(state, self.config.pki_dir)
        self._tasks = [asyncio.create_task(self._supervise(loop)) for loop in (self._plugin_loop, self._pod_watch)]
        # Each node heartbeats on its own phase, as independent kubelets do, rather than all
        # nodes in one burst every interval.
        self._tasks += [asyncio.create_task(self._supervise(functools.partial(
            nodelease.heartbeats, self.leases, self.client, s, i / len(self.nodes), self._stopping.is_set)))
            for i, s in enumerate(self.nodes.values())]

    async def _supervise(self, loop: Callable[[], Any]) -> None:
        """Keep a background loop alive: log what broke it and start it again."""
        name = getattr(loop, "__name__", None) or getattr(getattr(loop, "func", None), "__name__", "a loop")
        while not self._stopping.is_set():
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; restarting it in 1 s", name)
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
            stop_machine(state)

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


    # -- plugins ---------------------------------------------------------------------------------

    async def _plugin_loop(self) -> None:
        while not self._stopping.is_set():
            for state in self.nodes.values():
                if not state.node.hollow:  # a hollow node's plugin is its HollowAgent, registered in-process
                    await pluginwatch.scan_plugins(self.client, state, self._stopping.is_set)
                await pluginwatch.restart_exited(self.client, state)
            await asyncio.sleep(pluginwatch.PLUGIN_SCAN_S)

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
                self._released.discard(pod.metadata.uid)
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
                await podstatus.complete_after_run_time(self.client, outcome[1])
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
            # An API server too busy to answer (the client's connection pool timing out while
            # many nodes start) must not strand the pod: read it again.
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
                await podstatus.resync_status(self.client, state, pod)
            return state, pod
        except PodNotReady as exc:
            await pod_event(self.client, pod, exc.reason, str(exc), warning=True)
        except PodFailed:
            return None
        except (PluginCallError, ApiError, errors.NvlfabricError, OSError) as exc:
            await pod_event(self.client, pod, "FailedSync", str(exc), warning=True)
        except Exception as exc:  # a bug of ours must not strand the pod: log it and retry
            log.exception("syncing pod %s/%s failed", namespace, name)
            await pod_event(self.client, pod, "FailedSync", f"simulated kubelet error: {exc!r}", warning=True)
        return False


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
        """Volumes, claims prepared, containers' records, init containers, processes; then Running."""
        assert pod.metadata is not None and pod.spec is not None
        uid = pod.metadata.uid or ""
        files = await self._volume_files(pod)
        await sandbox.open_sandbox(self.config.pod_network, state, pod, runs_processes=any(
            self._runs(state, pod, c) for c in [*(pod.spec.initContainers or []), *pod.spec.containers]))
        prepared = await podstart.prepare_claims(state, pod, await podstart.pod_claims(self.client, pod))
        edits = podstart.container_edits(state, pod, prepared)
        await podstart.run_init_containers(
            self.client, state, pod, runs=lambda c: self._runs(state, pod, c),
            launch=lambda c: self._container_process(state, pod, c, edits, files),
            sidecar_started=lambda key: start_prober(self.client, state, key))
        await self._maybe_run_process(state, pod, edits, files)
        podstart.write_placeholder_logs(state, pod)
        state.pod_names[uid] = (pod.metadata.namespace or "default", pod.metadata.name or "")
        await podstatus.report_running(self.client, state, pod)
        state.started.add(uid)

    async def _terminate(self, state: NodeState, pod: Pod) -> None:
        assert pod.metadata is not None
        uid = pod.metadata.uid or ""
        if uid not in self._released:
            await podstop.release(self.client, state, pod)
            await sandbox.close_sandbox(self.config.pod_network, state, uid)
            stop_pod_pid_namespace(state, uid)
            self._released.add(uid)
        # Terminated only once the API server has the deletion: a failed delete is retried (the
        # pod stayed Terminating for good when the first delete's connection was dropped).
        await podstop.delete(self.client, pod)
        self._released.discard(uid)
        self._terminated.add(uid)
        self._latest.pop(uid, None)

    def _shim(self) -> Path:
        """The containers' shim (built, or found up to date, at first use)."""
        if self.config.shim is None:
            self.config.shim = hardware.build_standins()["nvlfabric-shim"]
        return self.config.shim

    def _container_process(self, state: NodeState, pod: Pod, container: Container,
                           edits: dict[str, ContainerEdits], files: dict[str, volumes.Files]) -> PodProcess:
        program = program_for(self.config.images, container.image or "")
        assert program is not None  # (`_runs` said so)
        shim = self._shim()
        if state.pidns is None:  # a hollow node's first process: it becomes a machine now
            start_machine(state, shim)
            if self.config.pki_dir is not None:
                self._tasks.append(asyncio.get_running_loop().create_task(self._serve_api(state, self.config.pki_dir)))
        uid = pod.metadata.uid or "" if pod.metadata else ""
        # Whose PID namespace: the node's (hostPID), the pod's (shared by its containers), or the
        # container's own inside the node's (the default: all of it ends with the container).
        pidns, own = state.pidns, True
        if pod.spec is not None and pod.spec.hostPID:
            own = False
        elif pod.spec is not None and pod.spec.shareProcessNamespace:
            pidns, own = pod_pid_namespace(state, uid, shim), False
        return start_pod_process(node=state.node, pod=pod, container=container, program=program,
                                 api_server=sandbox.api_server_for(self.config.api_server, self.config.pod_network,
                                                                   state, uid),
                                 files=files, shim=shim, own_pidns=own,
                                 extra_env=self.config.hardware_env.get(state.node.name, {}),
                                 cdi=edits.get(container.name), pidns=pidns, pod_ip=state.pod_ip(uid),
                                 netns=state.netns.get(uid), resolv=sandbox.resolv_conf(
                                     pod, self.config.pod_network.gateway if self.config.pod_network else None))

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
            start_prober(self.client, state, (uid, container.name))

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

