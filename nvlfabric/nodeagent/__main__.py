"""`python -m nvlfabric agent`: the node agent (the DaemonSet's container).

Every setting has a flag and an environment-variable twin (the DaemonSet sets the latter from the
downward API). The agent:
1. discovers the GPUs and the NVLink clique through NVML (from the driver root);
2. labels its own Node `nvlfabric.io/clique=<clique>` (or removes the label while the fabric is
   not ready, and says why), so the controller publishes the clique's channel pool;
3. serves the kubelet plugin sockets and prepares channel claims (driver.py);
4. re-checks the fabric and expires aborted checkpoint entries every --resync-seconds;
5. on SIGTERM stops serving and removes its sockets; the IMEX daemons run on, in the node's IMEX
   keeper (`python -m nvlfabric imex`), so prepared claims keep their NVLink imports.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from typing import cast

from nvlfabric.api import errors, names, process
from nvlfabric.api.names import DRIVER
from nvlfabric.nodeagent import checkpoint, discovery, health, kubeapi, metrics, settings
from nvlfabric.nodeagent.driver import DEDICATED_SYNC_S, ChannelDriver, NodeIdentity, Paths
from nvlfabric.nodeagent.server import DeviceHealth, PluginServer, SocketPaths
from nvlfabric.nodeagent.settings import Settings

log = logging.getLogger("nvlfabric.nodeagent")


def client_from(cfg: Settings, manager: str) -> kubeapi.Client:
    """The agent's own small client (nvlfabric/nodeagent/kubeapi.py: the agent's memory budget)."""
    if cfg.kubeconfig:
        return kubeapi.Client(kubeapi.from_kubeconfig(cfg.kubeconfig), field_manager=manager)
    return kubeapi.Client(kubeapi.from_service_account(cfg.service_account_dir), field_manager=manager)


FABRIC_CONDITION = "NVLinkFabricReady"


def label_node(client: kubeapi.Client, node: str, found: discovery.NodeDiscovery) -> None:
    """Tell the cluster what this node's fabric is: clique label, a Node condition, and an Event
    when it is not ready (so `kubectl describe node` says why no ComputeDomain lands here)."""
    node_labels: dict[str, str | None] = {names.CLIQUE_LABEL: found.clique,
                                          names.FABRIC_READY_LABEL: "true" if found.fabric_ready else "false"}
    client.patch(kubeapi.path("v1", "nodes", node), {"metadata": {"labels": node_labels}})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    reason = "FabricRegistered" if found.fabric_ready else "FabricNotReady"
    message = f"NVLink clique {found.clique}" if found.fabric_ready else found.reason
    # Strategic merge: conditions merge by type, the kubelet's own conditions stay.
    client.patch(kubeapi.path("v1", "nodes", node, subresource="status"), {"status": {"conditions": [{
        "type": FABRIC_CONDITION, "status": "True" if found.fabric_ready else "False", "reason": reason,
        "message": message, "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
        content_type=kubeapi.STRATEGIC_MERGE_PATCH)
    metrics.FABRIC_READY.set(1 if found.fabric_ready else 0)
    if not found.fabric_ready:
        with contextlib.suppress(errors.ApiStatusError):
            client.create(kubeapi.path("v1", "events", namespace="default"), {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{node}.", "namespace": "default"},
                "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
                "reason": "NVLinkFabricNotReady", "message": message[:1024], "type": "Warning",
                "source": {"component": "nvlfabric-agent", "host": node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1})
    if found.fabric_ready:
        log.info("node %s is in clique %s (%d GPUs)", node, found.clique, len(found.gpus))
    else:
        log.warning("node %s: NVLink fabric not ready: %s; no ComputeDomain channel will be prepared here",
                    node, found.reason)


def tune_malloc() -> None:
    """glibc malloc settings for a small, long-lived process with gRPC threads (the agent's 60 MB
    budget): one arena for every thread (the driver serialises calls anyway) instead of eight per
    core, and a fixed mmap threshold, so large temporary buffers (a checkpoint's text) go back to
    the system instead of raising the threshold and staying in the heap. No-op where the C library
    is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    mallopt(m_arena_max, 1)
    mallopt(m_mmap_threshold, 128 * 1024)
    mallopt(m_trim_threshold, 256 * 1024)


def run_agent(args: Settings, stop: threading.Event) -> int:
    tune_malloc()
    client = client_from(args, f"nvlfabric-agent-{args.node_name}")
    try:
        found = discovery.discover(args.driver_root)
    except discovery.NvmlUnavailable as exc:
        log.error("%s; check --driver-root (%s) and that the NVIDIA driver is loaded", exc, args.driver_root)
        found = discovery.NodeDiscovery(reason=str(exc))
    label_node(client, args.node_name, found)
    paths = Paths(plugin_dir=args.kubelet_root / "plugins" / DRIVER, cdi_dir=args.cdi_root,
                  driver_root=args.driver_root, proc_devices=args.proc_devices, boot_id=args.boot_id)
    driver = ChannelDriver(client=client, node=NodeIdentity(args.node_name, args.node_ip, found.clique), paths=paths,
                           imex_modes=args.imex_modes, imex_keeper=args.imex_keeper_socket)
    sockets = SocketPaths(kubelet_root=args.kubelet_root, driver=DRIVER)
    current = {"found": found}

    health_cache: dict[str, object] = {}

    def device_health() -> list[DeviceHealth]:
        """Prepared channels are as healthy as this node's fabric: a channel is useless without it.

        Called every second per open health stream; rebuilt only when the checkpoint or the fabric
        changed (both are replaced, never modified, so identity says whether they changed)."""
        node, state = current["found"], driver.state
        if health_cache.get("node") is node and health_cache.get("state") is state:
            return cast(list[DeviceHealth], health_cache["value"])
        unhealthy = [g for g in node.gpus if g.fabric.health_summary not in (None, "Healthy")]
        message = node.reason if not node.fabric_ready else "; ".join(
            f"GPU {g.index} NVLink health {g.fabric.health_summary}" for g in unhealthy)
        healthy = node.fabric_ready and not unhealthy
        out: list[DeviceHealth] = []
        for e in state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED):
            if e.allocation.device:  # the pool device the claim was allocated
                pool, _, dev = e.allocation.device.partition("/")
                out.append(DeviceHealth(pool, dev, healthy, message))
            else:  # entries from before the device was recorded (allocation mode Single)
                out.extend(DeviceHealth(names.pool_name(node.clique or ""), names.channel_device(ch), healthy, message)
                           for ch in e.allocation.channels)
        health_cache.update(node=node, state=state, value=out)
        return out

    server = PluginServer(paths=sockets, driver=driver, health=device_health)
    server.start()
    # Bring back the IMEX domains that prepared claims need now, not at the first resync.
    driver.housekeeping(clique=found.clique)
    health_server = health.serve(sockets, args.health_port, args.listen_address)
    metrics.serve(args.metrics_port, args.listen_address)
    next_resync = time.monotonic() + args.resync_s
    try:
        # Wake every resync period, and every DEDICATED_SYNC_S while dedicated IMEX domains run here
        # (their membership changes as members join). A failed pass is logged and retried at the
        # next one: the API server being briefly away must not stop the agent.
        while not stop.wait(min(args.resync_s, DEDICATED_SYNC_S) if driver.has_dedicated()
                            else max(0.0, next_resync - time.monotonic())):
            try:
                if time.monotonic() < next_resync:
                    driver.sync_dedicated()
                    continue
                next_resync = time.monotonic() + args.resync_s
                try:
                    fresh = discovery.discover(args.driver_root)
                except discovery.NvmlUnavailable as exc:
                    fresh = discovery.NodeDiscovery(reason=str(exc))
                if (fresh.clique, fresh.fabric_ready) != (found.clique, found.fabric_ready):
                    label_node(client, args.node_name, fresh)
                found = current["found"] = fresh
                driver.housekeeping(clique=found.clique)
                metrics.PREPARED_CLAIMS.set(len(driver.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED)))
            except (errors.ApiStatusError, OSError) as exc:
                log.error("resync failed, retrying at the next one: %s", exc)
    finally:
        if health_server is not None:
            health_server.stop(1)
        server.stop()
        driver.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = settings.parse(sys.argv[1:] if argv is None else argv)
    except process.SettingsError as exc:
        print(f"nvlfabric agent: {exc}", file=sys.stderr)
        return 2
    process.setup_logging(cfg.log_format)
    return run_agent(cfg, process.stop_on_signals())


if __name__ == "__main__":
    sys.exit(main())
