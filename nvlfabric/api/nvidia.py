"""NVIDIA's ComputeDomain (`resource.nvidia.com/v1beta1`), as nvlfabric drives it on the `nvidia` backend.

Clusters that already run NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) keep it:
nvlfabric's components then declare NVIDIA's ComputeDomain instead of ours, and NVIDIA's controller
does the rest (its IMEX DaemonSet, and the workload ResourceClaimTemplate that the domain's pods
reference). Facts: ../shared/reference/anchor-nvidia-driver.md, sections 2-3. The schema here is
NVIDIA's as of v0.4.0 (`SCHEMA_VERSION`: `numNodes` optional with default 0; 25.x required it, so
nvlfabric always sends it), and it is the one place nvlfabric spells NVIDIA's field names.

What nvlfabric's own API means and NVIDIA's cannot (so `NvidiaDomainSpec` refuses it, naming the
field, rather than dropping it):
- `imexMode`: NVIDIA's controller starts one IMEX daemon set per domain; there is no shared
  clique IMEX domain to choose;
- `placement`: NVIDIA's driver places nothing (a domain forms wherever its pods land); BoundJob
  keeps a domain's pods in one clique with pod affinity on NVIDIA's clique label instead.
And what NVIDIA's driver does differently, said where it matters (`NVIDIA_LIMITS`): every pod gets
IMEX channel 0, and a node belongs to at most one ComputeDomain at a time.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nvlfabric.api.computedomain import CHANNEL_CLAIM_SUFFIX, ChannelAllocationMode, ChannelClaim


class Backend(StrEnum):
    """Whose ComputeDomain a component declares."""

    NVLFABRIC = "nvlfabric"
    """nvlfabric.io/v1alpha1, served by nvlfabric's driver (NvlfabricDriver)."""
    NVIDIA = "nvidia"
    """resource.nvidia.com/v1beta1, served by NVIDIA's DRA driver, already in the cluster."""


#: The Pulumi config key of the stack-wide default backend (`pulumi config set nvlfabric:backend nvidia`).
BACKEND_CONFIG: Final = "backend"

GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ComputeDomain"
PLURAL: Final = "computedomains"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
SCHEMA_VERSION: Final = "v0.4.0"
"""The release of NVIDIA's driver whose ComputeDomain schema this module and the test CRD follow."""

DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
"""NVIDIA's label (value: the domain's uid) on the objects its controller makes for a domain."""
CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"
"""The Node label GPU Feature Discovery (and NVIDIA's driver from v0.5) writes: `<clusterUUID>.<cliqueId>`."""
DRIVER: Final = "compute-domain.nvidia.com"
CHANNEL_DEVICE_CLASS: Final = "compute-domain-default-channel.nvidia.com"
CHANNEL_REQUEST: Final = "channel"
"""The one request of the workload claim template NVIDIA's controller makes."""
READY: Final = "Ready"

IMMUTABLE_MESSAGE: Final = "A computeDomain.spec is immutable"
"""What NVIDIA's CRD answers (CEL `self == oldSelf` on the whole spec) to any spec change."""

NVIDIA_LIMITS: Final = (
    "on NVIDIA's driver every ComputeDomain's pods get IMEX channel 0, and a node belongs to at most one "
    "ComputeDomain at a time: pods of two domains never share a node, and the domains are isolated only by "
    "their IMEX daemons")

_MEANINGLESS: Final[dict[str, str]] = {
    "imexMode": "NVIDIA's controller starts an IMEX daemon set for each domain; there is no IMEX mode to choose",
    "placement": "NVIDIA's driver places nothing: a domain forms where its pods land (BoundJob keeps a "
                 "domain's pods in one clique by pod affinity on the nvidia.com/gpu.clique label)",
}


def meaningless_message(field: str) -> str:
    return (f"spec.{field} means nothing on backend 'nvidia' ({_MEANINGLESS[field]}): drop it, or use "
            "backend 'nvlfabric'")


class NvidiaDomainSpec(BaseModel):
    """A ComputeDomain's spec on the `nvidia` backend, in nvlfabric's spelling (the component's `spec`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    num_nodes: int = Field(0, alias="numNodes", ge=0,
                           description="NVIDIA's numNodes: with 0 (the default) the domain is Ready whenever every "
                                       "daemon it has is; set, Ready once that many are (NVIDIA deprecates it)")
    channel_allocation_mode: ChannelAllocationMode = Field(
        ChannelAllocationMode.SINGLE, alias="channelAllocationMode",
        description="NVIDIA's channel.allocationMode: Single (channel 0) or All (every channel)")
    channel_claim: ChannelClaim | None = Field(
        None, alias="channelClaim",
        description="channelClaim.name: the name of the ResourceClaimTemplate NVIDIA's controller makes "
                    "(default <name>-channel)")
    imex_mode: Any = Field(None, alias="imexMode", exclude=True)
    placement: Any = Field(None, exclude=True)

    @field_validator("imex_mode", "placement")
    @classmethod
    def _meaningless(cls, value: Any, info: Any) -> Any:
        if value is not None:
            raise ValueError(meaningless_message("imexMode" if info.field_name == "imex_mode" else "placement"))
        return value

    def template_name(self, domain: str) -> str:
        """The workload ResourceClaimTemplate NVIDIA's controller makes for the domain."""
        return self.channel_claim.name if self.channel_claim is not None else f"{domain}{CHANNEL_CLAIM_SUFFIX}"

    def dump(self) -> dict[str, Any]:
        """The spec in nvlfabric's spelling, defaults filled (what state and diffs compare)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def domain_object(name: str, namespace: str, labels: dict[str, str], spec: NvidiaDomainSpec) -> dict[str, Any]:
    """NVIDIA's ComputeDomain object for the spec (pure)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, **({"labels": dict(labels)} if labels else {})}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": {
        "numNodes": spec.num_nodes,
        "channel": {"resourceClaimTemplate": {"name": spec.template_name(name)},
                    "allocationMode": spec.channel_allocation_mode.value}}}


def spec_of(name: str, live_spec: dict[str, Any]) -> NvidiaDomainSpec:
    """nvlfabric's spelling of a live NVIDIA ComputeDomain's spec (read, refresh, import)."""
    channel = live_spec.get("channel") or {}
    template = (channel.get("resourceClaimTemplate") or {}).get("name")
    return NvidiaDomainSpec.model_validate({
        "numNodes": int(live_spec.get("numNodes") or 0),
        "channelAllocationMode": channel.get("allocationMode") or ChannelAllocationMode.SINGLE.value,
        **({"channelClaim": {"name": template}} if template and template != f"{name}{CHANNEL_CLAIM_SUFFIX}"
           else {})})


class NvidiaNodeStatus(BaseModel):
    """One entry of NVIDIA's `status.nodes` (a node running the domain's IMEX daemon)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str
    ip_address: str = Field("", alias="ipAddress")
    clique_id: str = Field("", alias="cliqueID")
    index: int | None = None
    status: str = "NotReady"


class DomainStatus(BaseModel):
    """NVIDIA's `status` of a ComputeDomain (written by its controller and daemons, never by us)."""

    model_config = ConfigDict(extra="ignore")

    status: str = "NotReady"
    nodes: list[NvidiaNodeStatus] = Field(default_factory=list)
