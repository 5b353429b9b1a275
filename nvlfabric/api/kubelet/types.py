"""Plain values of the DRA contract, as both sides of the wire handle them.

The node agent builds responses from them; the simulated kubelet reads responses into them.
Field names follow the protos (`Claim`, `Device`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device of a claim; `request_names` empty means every request of the claim."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
