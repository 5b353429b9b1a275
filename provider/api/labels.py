"""Label keys the node agent, the controller, the providers and the components share.

A leaf that imports nothing, so the node agent uses them without loading any object models."""

from typing import Final

CLIQUE_LABEL: Final = "nvlfabric.io/clique"
"""On a Node: its NVLink clique `<clusterUuid>.<cliqueId>`, set by the node's agent."""
FABRIC_READY_LABEL: Final = "nvlfabric.io/fabric-ready"
POOL_LABEL: Final = "nvlfabric.io/pool"
"""On a ResourceSlice: the channel pool it belongs to."""
RESERVATION_GATE: Final = "nvlfabric.io/channel-reservation"
"""A pod scheduling gate (BoundJob adds it): the controller lifts it once the pod is in its
channel claim's reservedFor, so the scheduler never races itself on the shared claim."""
