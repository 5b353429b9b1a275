"""What the kubelet's plugin manager and device-health watch do on one node, every scan.

DRA plugins are found in the node's `plugins_registry` and registered (plugins.py); a plugin
that is gone, or replaced by a new socket on its path, is unregistered first. WIPING_DELAY_S after
a driver's last plugin instance went away its ResourceSlices are wiped (the kubelet's
defaultWipingDelay). A plugin serving `v1alpha1.DRAResourceHealth` is watched, and its reports
reach the pods' `allocatedResourcesStatus` (devicehealth.py). Containers of local-process pods that
died are restarted here too (restartPolicy Always), as a kubelet restarts a crashed container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc
import grpc.aio
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from nvlfabric.sim.kubelet import podstatus
from nvlfabric.sim.kubelet.devicehealth import STREAM_RETRY_S, DeviceKey, uses
from nvlfabric.sim.kubelet.nodelease import wipe_slices
from nvlfabric.sim.kubelet.plugins import Plugin, RegistrationError, register, registry_sockets
from nvlfabric.sim.kubelet.prober import start_prober
from nvlfabric.sim.kubelet.state import NodeState, rfc3339

__all__ = ["PLUGIN_SCAN_S", "WIPING_DELAY_S", "restart_exited", "scan_plugins"]

log = logging.getLogger("nvlfabric.sim.kubelet")

PLUGIN_SCAN_S = 0.5
WIPING_DELAY_S = 30.0


async def scan_plugins(client: AsyncClient, state: NodeState, stopping: Callable[[], bool]) -> None:
    """Register new plugins, unregister gone ones, wipe the slices of drivers gone long enough."""
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
            state.health_watches[sock] = asyncio.create_task(_watch_health(client, state, plugin, stopping))
    for driver, since in list(state.driver_gone_since.items()):
        if time.monotonic() - since >= WIPING_DELAY_S:
            del state.driver_gone_since[driver]
            await wipe_slices(client, state.node.name, driver=driver)


async def _watch_health(client: AsyncClient, state: NodeState, plugin: Plugin, stopping: Callable[[], bool]) -> None:
    """The plugin's health stream for as long as it is registered, opened again STREAM_RETRY_S after
    it ends; when it ends, the driver's devices turn Unknown (as the kubelet's cache is cleared)."""
    while not stopping():
        try:
            async for report in plugin.watch_health():
                await _health_changed(client, state, state.health.update(plugin.driver, report, time.monotonic()))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("node %s: %s serves no health stream", state.node.name, plugin.driver)
                return
            log.info("node %s: health stream of %s ended: %s", state.node.name, plugin.driver, exc.code().name)
        finally:
            await asyncio.shield(_health_changed(client, state, state.health.clear(plugin.driver)))
        await asyncio.sleep(STREAM_RETRY_S)


async def _health_changed(client: AsyncClient, state: NodeState, changed: set[DeviceKey]) -> None:
    if not changed:
        return
    pods = [uid for uid, prepared in state.devices.items() if uses(prepared, changed)]
    await asyncio.gather(*(podstatus.write_health(client, state, uid) for uid in pods), return_exceptions=True)


async def restart_exited(client: AsyncClient, state: NodeState) -> None:
    """Containers of local-process pods that died are restarted (restartPolicy Always), with the
    restart counted in the pod status, as a kubelet does for a crashed DaemonSet container: at
    once after a first exit, else after a back-off during which the container is `waiting`
    (CrashLoopBackOff, not ready) with its exit as `lastState`, as `kubectl get pods` shows it."""
    for key, proc in list(state.processes.items()):
        code = proc.proc.poll()
        if code is None or (proc.restart_at is not None and time.monotonic() < proc.restart_at):
            continue
        try:
            pod = await client.get(Pod, proc.pod_name, namespace=proc.namespace)
        except ApiError:
            state.processes.pop(key, None)
            continue
        if pod.metadata is None or pod.metadata.deletionTimestamp is not None:
            continue
        if proc.restart_at is None:  # its exit, first seen
            message = proc.termination_message(code)
            state.terminated[key] = {"exitCode": code if code >= 0 else 128 - code, "reason": "Error",
                                     "finishedAt": rfc3339(), **({"message": message} if message else {})}
            state.ready[key] = False
            delay = proc.back_off_s()
            proc.restart_at = time.monotonic() + delay
            log.warning("node %s: container %s of pod %s exited with %s; restarting%s", state.node.name,
                        proc.container.name, proc.pod_name, code, f" in {delay:g} s" if delay else "")
            if delay:
                await podstatus.write_back_off(client, state, pod.metadata.uid or "", proc.container.name, (
                    f"back-off {delay:g}s restarting failed container={proc.container.name} "
                    f"pod={proc.pod_name}_{proc.namespace}({pod.metadata.uid})"))
                continue
        state.processes[key] = proc.restart()
        start_prober(client, state, key)
        await podstatus.report_running(client, state, pod)
