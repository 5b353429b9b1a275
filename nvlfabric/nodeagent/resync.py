"""The agent's loop once it serves: dedicated IMEX domains' upkeep every DEDICATED_SYNC_S, a resync
(clique labels, housekeeping, the prepared-claims metric) every --resync-seconds, and the deadline
for the kubelet to register the plugin.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from nvlfabric.api import errors
from nvlfabric.nodeagent import checkpoint, discovery, fabrichealth, kubeapi, metrics
from nvlfabric.nodeagent.cliquelabel import label_node
from nvlfabric.nodeagent.driver import DEDICATED_SYNC_S, ChannelDriver
from nvlfabric.nodeagent.server import PluginServer
from nvlfabric.nodeagent.settings import Settings

log = logging.getLogger("nvlfabric.nodeagent")


@dataclass
class Labelled:
    """The NVML reading the node's clique labels were last compared with: the resync replaces it,
    and the health stream reads its clique (for entries that recorded no pool device)."""

    found: discovery.NodeDiscovery


def run(*, cfg: Settings, stop: threading.Event, client: kubeapi.Client, monitor: fabrichealth.Monitor,
        driver: ChannelDriver, server: PluginServer, labelled: Labelled) -> int:
    """Until `stop`: 0; 1 when the kubelet never registered the plugin (so that the pod is restarted)."""
    next_resync = time.monotonic() + cfg.resync_s
    register_by = time.monotonic() + cfg.registration_timeout_s if cfg.registration_timeout_s else None
    # Wake every DEDICATED_SYNC_S: dedicated IMEX domains' membership changes as members join,
    # and a status report that failed is owed (a prepare cannot wait for the next resync to
    # tell its domain; sync_dedicated costs nothing when neither is the case). A failed pass is
    # logged and retried at the next one: the API server being briefly away must not stop the
    # agent.
    while not stop.wait(min(cfg.resync_s, DEDICATED_SYNC_S, max(0.0, next_resync - time.monotonic()))):
        if register_by is not None and not server.registration.registered.is_set():
            if time.monotonic() >= register_by:
                log.error("the kubelet has not registered this plugin %gs after its socket %s appeared: no "
                          "kubelet watches that directory; check --kubelet-root / $KUBELET_ROOT (%s): it must be "
                          "the kubelet's --root-dir (NvlfabricDriver kubelet_root). Exiting, to be restarted",
                          cfg.registration_timeout_s, server.paths.registration, cfg.kubelet_root)
                stop.set()
                return 1
        else:
            register_by = None
        try:
            if time.monotonic() < next_resync:
                driver.sync_dedicated()
                continue
            next_resync = time.monotonic() + cfg.resync_s
            found, fresh = labelled.found, monitor.latest  # NVML's last reading (fabrichealth reads it every second)
            if (fresh.clique, fresh.fabric_ready) != (found.clique, found.fabric_ready):
                label_node(client, cfg.node_name, fresh)
            labelled.found = fresh
            driver.housekeeping(clique=fresh.clique)
            metrics.PREPARED_CLAIMS.set(len(driver.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED)))
        except (errors.ApiStatusError, OSError) as exc:
            log.error("resync failed, retrying at the next one: %s", exc)
    return 0
