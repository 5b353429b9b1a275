"""This node's clique in its labels: `nvlfabric.io/clique` and `nvlfabric.io/fabric-ready`, from
what NVML last said. The controller publishes the clique's channel pool by the first.

The agent writes them at start-up, whenever the fabric monitor sees the clique or its readiness
change, and at a resync that finds them changed. The NVLinkFabricReady condition, taint, Event and
metrics are fabrichealth's, within seconds.
"""

from __future__ import annotations

import logging

from nvlfabric.api import names
from nvlfabric.nodeagent import discovery, kubeapi

log = logging.getLogger("nvlfabric.nodeagent")


def label_node(client: kubeapi.Client, node: str, found: discovery.NodeDiscovery) -> None:
    """Tell the cluster which clique this node is in, or that its fabric is not ready and why."""
    node_labels: dict[str, str | None] = {names.CLIQUE_LABEL: found.clique,
                                          names.FABRIC_READY_LABEL: "true" if found.fabric_ready else "false"}
    client.patch(kubeapi.path("v1", "nodes", node), {"metadata": {"labels": node_labels}})
    if found.fabric_ready:
        log.info("node %s is in clique %s (%d GPUs)", node, found.clique, len(found.gpus))
    else:
        log.warning("node %s: NVLink fabric not ready: %s; no ComputeDomain channel will be prepared here",
                    node, found.reason)
