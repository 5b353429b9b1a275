"""The node agent's life: its parts built in order, the resync loop run, the parts stopped.

The agent:
1. discovers the GPUs and the NVLink clique through NVML (from the driver root);
2. labels its own Node `nvlfabric.io/clique=<clique>` (or removes the label while the fabric is
   not ready, and says why), so the controller publishes the clique's channel pool (cliquelabel.py);
3. serves the kubelet plugin sockets and prepares channel claims (driver.py), and publishes the
   node's GPUs as devices of a second plugin, tainted while their fabric is sick, when told to
   (--publish-gpus; gpus.py);
4. reads NVML every second and tells the cluster within seconds when the fabric's health changes
   (fabrichealth.py: Node condition and taint, Event, metrics, the health stream);
5. runs housekeeping (IMEX domains, aborted checkpoint entries) every --resync-seconds (resync.py);
6. on SIGTERM stops serving and removes its sockets; the IMEX daemons run on, in the node's IMEX
   keeper (`python -m nvlfabric imex`), so prepared claims keep their NVLink imports.
"""

from __future__ import annotations

import logging
import threading

from nvlfabric.api import names
from nvlfabric.api.names import DRIVER
from nvlfabric.api.release import __version__
from nvlfabric.nodeagent import checkpoint, discovery, fabrichealth, kubeapi, metrics, resync
from nvlfabric.nodeagent.cliquelabel import label_node
from nvlfabric.nodeagent.devicehealth import device_health
from nvlfabric.nodeagent.driver import ChannelDriver, NodeIdentity, Paths
from nvlfabric.nodeagent.gpus import Gpus, withdraw_gpus
from nvlfabric.nodeagent.server import PluginServer, SocketPaths
from nvlfabric.nodeagent.settings import Settings

log = logging.getLogger("nvlfabric.nodeagent")


def run(*, cfg: Settings, stop: threading.Event) -> int:
    """Serve until `stop`; the exit code (resync.run's)."""
    tune_malloc()
    log.info("nvlfabric %s: node agent of node %s", __version__, cfg.node_name)  # which release runs here
    client = client_from(cfg, f"{names.AGENT_FIELD_MANAGER_PREFIX}{cfg.node_name}")
    node_gpus = Gpus(client, cfg.node_name, cfg.cdi_root, cfg.gpu_taint_effect) if cfg.publish_gpus else None
    if node_gpus is None:
        withdraw_gpus(client, cfg.node_name, cfg.cdi_root)
    monitor = _fabric_monitor(cfg, client, node_gpus)
    found = monitor.check()
    if monitor.verdict.reason == fabrichealth.NVML_ERROR:
        log.error("%s; check --driver-root (%s) and that the NVIDIA driver is loaded", found.reason, cfg.driver_root)
    label_node(client, cfg.node_name, found)
    paths = Paths(plugin_dir=cfg.kubelet_root / "plugins" / DRIVER, cdi_dir=cfg.cdi_root,
                  driver_root=cfg.driver_root, proc_devices=cfg.proc_devices, boot_id=cfg.boot_id)
    driver = ChannelDriver(client=client, node=NodeIdentity(cfg.node_name, cfg.node_ip, found.clique), paths=paths,
                           imex_modes=cfg.imex_modes, imex_keeper=cfg.imex_keeper_socket)
    labelled = resync.Labelled(found)
    server = PluginServer(paths=SocketPaths(kubelet_root=cfg.kubelet_root, driver=DRIVER), driver=driver,
                          health=device_health(driver, monitor, lambda: labelled.found),
                          health_port=cfg.health_port, listen_address=cfg.listen_address)
    server.start()
    # The GPUs' plugin: stateless prepare, its own sockets, no probes (the channel plugin's are the agent's).
    gpu_server = None if node_gpus is None else PluginServer(
        paths=SocketPaths(kubelet_root=cfg.kubelet_root, driver=names.GPU_DRIVER), driver=node_gpus,
        health=node_gpus.health, workers=4)
    if gpu_server is not None:
        gpu_server.start()
    # Bring back the IMEX domains that prepared claims need now, not at the first resync.
    driver.housekeeping(clique=found.clique)
    metrics.serve(cfg.metrics_port, cfg.listen_address)
    monitor.start(stop)
    try:
        return resync.run(cfg=cfg, stop=stop, client=client, monitor=monitor, driver=driver, server=server,
                          labelled=labelled)
    finally:
        if gpu_server is not None:
            gpu_server.stop()
        server.stop()
        driver.stop()


def client_from(cfg: Settings, manager: str) -> kubeapi.Client:
    """The agent's own small client (nvlfabric/nodeagent/kubeapi.py: the agent's memory budget)."""
    if cfg.kubeconfig:
        return kubeapi.Client(kubeapi.from_kubeconfig(cfg.kubeconfig), field_manager=manager)
    return kubeapi.Client(kubeapi.from_service_account(cfg.service_account_dir), field_manager=manager)


def _fabric_monitor(cfg: Settings, client: kubeapi.Client, node_gpus: Gpus | None) -> fabrichealth.Monitor:
    """The NVLink fabric's watcher, over an NVML session open for the agent's life (see Session)."""
    try:
        boot_id = checkpoint.read_boot_id(cfg.boot_id)
    except checkpoint.BootIdError:
        boot_id = ""  # the driver reports it; GPUs lost before a restart of the agent go unnoticed
    nvml = discovery.Session(cfg.driver_root)
    return fabrichealth.Monitor(client, cfg.node_name, reader=lambda: fabrichealth.read(nvml),
                                known=fabrichealth.KnownGpus(cfg.kubelet_root / "plugins" / DRIVER / "gpus.json",
                                                             boot_id),
                                relabel=lambda fresh: label_node(client, cfg.node_name, fresh),
                                on_reading=node_gpus.sync if node_gpus is not None else None)


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
