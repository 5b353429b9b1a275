"""The contract room: nvlfabric's own Kubernetes API (`nvlfabric.io`): pydantic models that are the one source of the
CRD schemas (`nvlfabric.codegen.crdgen` generates `nvlfabric/manifests/crds/` from them).

A module per concern: `names` (every shared name and limit), `computedomain` (the CRD's models),
`channelconfig` (a channel claim's opaque config), `nodereports` (the agents' reports on their
Nodes), `claimhold` (a domain's hold on its claims), `nvidia` (NVIDIA's ComputeDomain), `errors`,
`release`, and `kubelet` (the kubelet's gRPC contracts).

The ComputeDomain models are imported on first use of a name (`nvlfabric.api.ComputeDomain`),
not with the package: every process of the driver imports `nvlfabric.api.names`, and the IMEX
keeper on every node needs none of the ~100 model classes (13 MB of its memory when they came
with any `nvlfabric.api` import).
"""

from __future__ import annotations

import importlib
from typing import Any

_MODELS = (
    "API_VERSION", "CRD_NAME", "KIND", "PLURAL", "VERSION", "ChannelAllocationMode", "ChannelClaim", "ComputeDomain",
    "ComputeDomainSpec", "ComputeDomainStatus", "Condition", "ConditionStatus", "ConditionType", "IMEXMode",
    "NodeStatus", "ObjectMeta", "Phase", "Placement", "PlacementScope", "channel_claim_name", "immutable_changes",
    "node_status_apply",
)
__all__ = ["GROUP", *_MODELS]


def __getattr__(name: str) -> Any:
    if name == "GROUP":
        return importlib.import_module("nvlfabric.api.names").GROUP
    if name in _MODELS:
        return getattr(importlib.import_module("nvlfabric.api.computedomain"), name)
    raise AttributeError(f"module 'nvlfabric.api' has no attribute {name!r}")
