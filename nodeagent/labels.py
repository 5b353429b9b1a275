"""Label keys the agent, the controller and the components share (a leaf: imports nothing heavy,
so the node agent can use them without loading the controller's object models)."""

from typing import Final

CLIQUE_LABEL: Final = "nvlfabric.io/clique"
"""On a Node: its NVLink clique `<clusterUuid>.<cliqueId>`, set by the node's agent."""
FABRIC_READY_LABEL: Final = "nvlfabric.io/fabric-ready"
POOL_LABEL: Final = "nvlfabric.io/pool"
"""On a ResourceSlice: the channel pool it belongs to."""
