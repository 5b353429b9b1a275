"""`python -m nvlfabric agent`: the node agent (the DaemonSet's container).

Every setting has a flag and an environment-variable twin (the DaemonSet sets the latter from the
downward API). The agent:
1. discovers the GPUs and the NVLink clique through NVML (from the driver root);
2. labels its own Node `nvlfabric.io/clique=<clique>` (or removes the label while the fabric is
   not ready, and says why), so the controller publishes the clique's channel pool;
3. serves the kubelet plugin sockets and prepares channel claims (driver.py);
4. reads NVML every second and tells the cluster within seconds when the fabric's health changes
   (fabrichealth.py: Node condition and taint, Event, metrics, the health stream);
5. runs housekeeping (IMEX domains, aborted checkpoint entries) every --resync-seconds;
6. on SIGTERM stops serving and removes its sockets; the IMEX daemons run on, in the node's IMEX
   keeper (`python -m nvlfabric imex`), so prepared claims keep their NVLink imports.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import cast

from nvlfabric.api import errors, names
from nvlfabric.api.names import DRIVER
from nvlfabric.api.release import __version__
from nvlfabric.daemon import process
from nvlfabric.nodeagent import checkpoint, discovery, fabrichealth, kubeapi, metrics, settings
from nvlfabric.nodeagent.driver import DEDICATED_SYNC_S, ChannelDriver, NodeIdentity, Paths
from nvlfabric.nodeagent.server import DeviceHealth, PluginServer, SocketPaths
from nvlfabric.nodeagent.settings import Settings

log = logging.getLogger("nvlfabric.nodeagent")


def client_from(cfg: Settings, manager: str) -> kubeapi.Client:
    """The agent's own small client (nvlfabric/nodeagent/kubeapi.py: the agent's memory budget)."""
    if cfg.kubeconfig:
        return kubeapi.Client(kubeapi.from_kubeconfig(cfg.kubeconfig), field_manager=manager)
    return kubeapi.Client(kubeapi.from_service_account(cfg.service_account_dir), field_manager=manager)


def label_node(client: kubeapi.Client, node: str, found: discovery.NodeDiscovery) -> None:
    """Tell the cluster which clique this node is in (the controller publishes its pool by it).
    The NVLinkFabricReady condition, taint, Event and metrics are fabrichealth's, within seconds."""
    node_labels: dict[str, str | None] = {names.CLIQUE_LABEL: found.clique,
                                          names.FABRIC_READY_LABEL: "true" if found.fabric_ready else "false"}
    client.patch(kubeapi.path("v1", "nodes", node), {"metadata": {"labels": node_labels}})
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
    log.info("nvlfabric %s: node agent of node %s", __version__, args.node_name)  # which release runs here
    client = client_from(args, f"{names.AGENT_FIELD_MANAGER_PREFIX}{args.node_name}")
    monitor = _fabric_monitor(args, client)
    found = monitor.check()
    if monitor.verdict.reason == fabrichealth.NVML_ERROR:
        log.error("%s; check --driver-root (%s) and that the NVIDIA driver is loaded", found.reason, args.driver_root)
    label_node(client, args.node_name, found)
    paths = Paths(plugin_dir=args.kubelet_root / "plugins" / DRIVER, cdi_dir=args.cdi_root,
                  driver_root=args.driver_root, proc_devices=args.proc_devices, boot_id=args.boot_id)
    driver = ChannelDriver(client=client, node=NodeIdentity(args.node_name, args.node_ip, found.clique), paths=paths,
                           imex_modes=args.imex_modes, imex_keeper=args.imex_keeper_socket)
    current = {"found": found}
    server = PluginServer(paths=SocketPaths(kubelet_root=args.kubelet_root, driver=DRIVER), driver=driver,
                          health=device_health(driver, monitor, lambda: current["found"]),
                          health_port=args.health_port, listen_address=args.listen_address)
    server.start()
    # Bring back the IMEX domains that prepared claims need now, not at the first resync.
    driver.housekeeping(clique=found.clique)
    metrics.serve(args.metrics_port, args.listen_address)
    monitor.start(stop)
    try:
        return _resync_loop(args, stop, client, monitor, driver, server, current)
    finally:
        server.stop()
        driver.stop()


def _fabric_monitor(args: Settings, client: kubeapi.Client) -> fabrichealth.Monitor:
    """The NVLink fabric's watcher, over an NVML session open for the agent's life (see Session)."""
    try:
        boot_id = checkpoint.read_boot_id(args.boot_id)
    except checkpoint.BootIdError:
        boot_id = ""  # the driver reports it; GPUs lost before a restart of the agent go unnoticed
    nvml = discovery.Session(args.driver_root)
    return fabrichealth.Monitor(client, args.node_name, reader=lambda: fabrichealth.read(nvml),
                                known=fabrichealth.KnownGpus(args.kubelet_root / "plugins" / DRIVER / "gpus.json",
                                                             boot_id),
                                relabel=lambda fresh: label_node(client, args.node_name, fresh))


def device_health(driver: ChannelDriver, monitor: fabrichealth.Monitor,
                  found: Callable[[], discovery.NodeDiscovery]) -> Callable[[], list[DeviceHealth]]:
    """The health stream's source: prepared channels are as healthy as this node's fabric (a
    channel is useless without it). Called every second per open stream, so the answer is rebuilt
    only when the checkpoint, the fabric or its verdict changed (all are replaced, never modified,
    so identity says whether they changed)."""
    cache: dict[str, object] = {}

    def health() -> list[DeviceHealth]:
        node, state, verdict = found(), driver.state, monitor.verdict
        if cache.get("node") is node and cache.get("state") is state and cache.get("verdict") is verdict:
            return cast(list[DeviceHealth], cache["value"])
        healthy, message = verdict.healthy, "" if verdict.healthy else verdict.message
        out: list[DeviceHealth] = []
        for e in state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED):
            if e.allocation.device:  # the pool device the claim was allocated
                pool, _, dev = e.allocation.device.partition("/")
                out.append(DeviceHealth(pool, dev, healthy, message))
            else:  # entries from before the device was recorded (allocation mode Single)
                out.extend(DeviceHealth(names.pool_name(node.clique or ""), names.channel_device(ch), healthy, message)
                           for ch in e.allocation.channels)
        cache.update(node=node, state=state, verdict=verdict, value=out)
        return out

    return health


def _resync_loop(args: Settings, stop: threading.Event, client: kubeapi.Client, monitor: fabrichealth.Monitor,
                 driver: ChannelDriver, server: PluginServer, current: dict[str, discovery.NodeDiscovery]) -> int:
    """Until `stop`: dedicated domains' upkeep every DEDICATED_SYNC_S, a resync every --resync-s;
    1 when the kubelet never registered the plugin (so that the pod is restarted)."""
    next_resync = time.monotonic() + args.resync_s
    register_by = time.monotonic() + args.registration_timeout_s if args.registration_timeout_s else None
    # Wake every DEDICATED_SYNC_S: dedicated IMEX domains' membership changes as members join,
    # and a status report that failed is owed (a prepare cannot wait for the next resync to
    # tell its domain; sync_dedicated costs nothing when neither is the case). A failed pass is
    # logged and retried at the next one: the API server being briefly away must not stop the
    # agent.
    while not stop.wait(min(args.resync_s, DEDICATED_SYNC_S, max(0.0, next_resync - time.monotonic()))):
        if register_by is not None and not server.registration.registered.is_set():
            if time.monotonic() >= register_by:
                log.error("the kubelet has not registered this plugin %gs after its socket %s appeared: no "
                          "kubelet watches that directory; check --kubelet-root / $KUBELET_ROOT (%s): it must be "
                          "the kubelet's --root-dir (NvlfabricDriver kubelet_root). Exiting, to be restarted",
                          args.registration_timeout_s, server.paths.registration, args.kubelet_root)
                stop.set()
                return 1
        else:
            register_by = None
        try:
            if time.monotonic() < next_resync:
                driver.sync_dedicated()
                continue
            next_resync = time.monotonic() + args.resync_s
            found, fresh = current["found"], monitor.latest  # NVML's last reading (fabrichealth reads it every second)
            if (fresh.clique, fresh.fabric_ready) != (found.clique, found.fabric_ready):
                label_node(client, args.node_name, fresh)
            current["found"] = fresh
            driver.housekeeping(clique=fresh.clique)
            metrics.PREPARED_CLAIMS.set(len(driver.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED)))
        except (errors.ApiStatusError, OSError) as exc:
            log.error("resync failed, retrying at the next one: %s", exc)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = settings.parse(sys.argv[1:] if argv is None else argv)
    except process.SettingsError as exc:
        print(f"nvlfabric agent: {exc}", file=sys.stderr)
        return 2
    try:
        settings.check_paths(cfg)
    except process.SettingsError as exc:
        print(f"nvlfabric agent: {exc}", file=sys.stderr)
        return 2
    process.setup_logging(cfg.log_format)
    return run_agent(cfg, process.stop_on_signals())


if __name__ == "__main__":
    sys.exit(main())
