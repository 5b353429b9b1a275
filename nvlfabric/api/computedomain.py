"""The nvlfabric ComputeDomain API, `nvlfabric.io/v1alpha1`: the one source of its schema.

A ComputeDomain (CD) is the unit of "these pods may talk over multi-node NVLink". The pydantic
models below are the schema: `nvlfabric.codegen.crdgen` turns their JSON schema into the CRD that
`nvlfabric/manifests/crds/nvlfabric.io_computedomains.yaml` holds (a test fails when that file is stale), and
the providers, the node agent and the tests validate and build objects with the same models. So a
field, a default, a limit, a description or a CEL rule is written once, here.

How the models carry what plain JSON schema cannot say (read by `crdgen`):

- `x-kubernetes-validations` (CEL) and `x-kubernetes-list-type` / `x-kubernetes-list-map-keys`
  ride in `json_schema_extra`;
- a `default` for an object-valued field (`spec`, `spec.placement`) is declared as `{}` in
  `json_schema_extra`, so the API server applies the nested defaults too;
- the root `metadata` keeps only its `name` restrictions (the API server validates the rest of
  ObjectMeta itself and forbids a schema for it).

Decisions (recorded in docs/architecture.md by the lead):

- **Names.** A CD name is a DNS label (<= 63 characters): it is used in derived object names and
  in label values (`nvlfabric.io/compute-domain=<name>`), both limited to 63. Checked by the model
  and by the CRD (`metadata.name` pattern and maxLength, which the API server enforces).
- **Immutability.** `channelAllocationMode`, `imexMode`, `placement` and `channelClaim` are fixed
  once created (CEL `self == oldSelf`): changing any of them would need a new channel, IMEX domain
  or claim, i.e. a new CD. `numNodes` may change (it only feeds readiness).
- **`All` channels need a dedicated IMEX domain.** In the default clique-scoped IMEX domain the
  channels are the only isolation between CDs of one clique; a CD holding all of them could import
  any other CD's memory. So `channelAllocationMode: All` requires `imexMode: Dedicated`.
- **Status is written by many hands.** `status.nodes` is a map-list keyed by `name`, so each node
  agent owns exactly its own entry through server-side apply with its own field manager (no 409
  storms, no read-modify-write); `conditions` is a map-list keyed by `type`. Status models ignore
  unknown fields (a newer agent may report more); spec models forbid them (typos are errors).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from nvlfabric.api.names import (
    CLIQUE,
    CLIQUE_MAX,
    DNS_LABEL,
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_MAX,
    GROUP,
    IMEX_CMD_PORT,
    IMEX_PORT_STRIDE,
    IMEX_SERVER_PORT,
    MAX_CHANNEL,
    MAX_CLIQUES_PER_DOMAIN,
    MAX_IMEX_PORT_SLOT,
    NODES_PER_CLIQUE,
)

VERSION: Final = "v1alpha1"
API_VERSION: Final = "nvlfabric.io/v1alpha1"
KIND: Final = "ComputeDomain"
LIST_KIND = "ComputeDomainList"
PLURAL = "computedomains"
SINGULAR = "computedomain"
SHORT_NAMES = ("cd",)
CATEGORIES = ("nvlfabric",)
CRD_NAME = f"{PLURAL}.{GROUP}"

#: The shared channel ResourceClaim is named `<cd name><CHANNEL_CLAIM_SUFFIX>` unless
#: `spec.channelClaim.name` says otherwise.
CHANNEL_CLAIM_SUFFIX = "-channel"

# metav1.Condition's own limits (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class ChannelAllocationMode(StrEnum):
    """How many IMEX channels each pod of the ComputeDomain gets."""

    SINGLE = "Single"
    ALL = "All"


class IMEXMode(StrEnum):
    """Which IMEX domain the ComputeDomain's members join."""

    CLIQUE_SCOPED = "CliqueScoped"
    DEDICATED = "Dedicated"


class IMEXAuthentication(StrEnum):
    """Whether the daemons of a ComputeDomain's own IMEX domain authenticate each other."""

    DISABLED = "Disabled"
    TLS = "TLS"


class PlacementScope(StrEnum):
    """How far the ComputeDomain's members may spread."""

    SINGLE_CLIQUE = "SingleClique"
    MULTI_CLIQUE = "MultiClique"


class NodeLossPolicy(StrEnum):
    """What the controller does with the domain's pods on a member node it lost."""

    REPLACE = "Replace"
    KEEP = "Keep"


class Phase(StrEnum):
    """The ComputeDomain's lifecycle phase, as the controller reports it.

    - `Pending`: accepted; no IMEX channel allocated yet (no member pod scheduled, or every
      channel of the cliques it may use is allocated: reason `ChannelPoolExhausted`). An absent
      phase means the same.
    - `Allocating`: a channel (and clique) is allocated; members are joining and not all are ready.
    - `Ready`: at least one member, every placed member is ready, and at least `numNodes` members
      are ready when `numNodes` is set.
    - `Degraded`: was Ready, and a member has since become not ready or left (fewer than
      `numNodes`), or a member node's NVLink fabric is unhealthy (`unhealthyNodes`, the
      `FabricHealthy` condition), or a member node was lost and is not replaced yet (`lostNodes`,
      reason `NodeLost`); workloads already running may continue.
    - `Failed`: the spec cannot be satisfied by the cluster and driver as they are, and no pod is
      let through: the driver does not allow its `imexMode`, the pinned clique does not exist, the
      cluster has fewer cliques or nodes than it asks for (judged once the domain is 30 s old), or
      no IMEX port slot is left; the `Ready` condition's reason and message say which and the way
      out. Recomputed every pass: a rack added later lifts it.
    """

    PENDING = "Pending"
    ALLOCATING = "Allocating"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class ConditionStatus(StrEnum):
    """metav1.ConditionStatus."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types the controller sets on a ComputeDomain (not enforced by the schema)."""

    READY = "Ready"
    CHANNEL_ALLOCATED = "ChannelAllocated"
    FABRIC_HEALTHY = "FabricHealthy"
    """False while a member node's agent reports its NVLink fabric unhealthy (naming the nodes)."""
    NODES_AVAILABLE = "NodesAvailable"
    """False while the domain has lost member nodes (status.lostNodes): which, why, and what the
    controller does about it (replacing their pods, or waiting for a free node)."""


class LostReason(StrEnum):
    """Why a member node counts as lost (status.lostNodes[].reason)."""

    NODE_NOT_READY = "NodeNotReady"
    """The Node's Ready condition is False or Unknown (its kubelet stopped posting status)."""
    NODE_DELETED = "NodeDeleted"
    """The Node object is gone."""
    FABRIC_UNHEALTHY = "FabricUnhealthy"
    """Its agent reports the NVLink fabric unhealthy, the domain's nodeLossPolicy is Replace, and a
    node of the clique is free to take its pods (else they keep running there, told)."""


def _immutable(field: str, why: str) -> JsonDict:
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": immutable_message(field, why)}]}


def immutable_message(field: str, why: str) -> str:
    """The CEL message for an immutable field: names the field and the fix."""
    return f"spec.{field} is immutable ({why}); delete the ComputeDomain and create it again to change it"


_WHY = {
    "channelAllocationMode": "pods already hold their channels",
    "imexMode": "the members already joined their IMEX domain",
    "placement": "the members are already placed in a clique",
    "channelClaim": "pods reference the claim by name",
    "imexAuthentication": "the members' IMEX daemons started with or without credentials",
}

#: Spec fields (by their API name) that may not change after creation.
IMMUTABLE_FIELDS = tuple(_WHY)

def too_many_nodes_message(num_nodes: int | None = None) -> str:
    got = f" ({num_nodes})" if num_nodes is not None else ""
    return (f"spec.numNodes{got} is more nodes than one NVL72 clique has ({NODES_PER_CLIQUE}); a single-clique "
            "ComputeDomain never gets there: span cliques with placement: {scope: MultiClique, cliques: N}, "
            f"or set numNodes to at most {NODES_PER_CLIQUE}")


MULTI_NEEDS_CLIQUES_MESSAGE = ("spec.placement.cliques is required with scope MultiClique (how many cliques, 2.."
                               f"{MAX_CLIQUES_PER_DOMAIN}) and allowed only with it")
MULTI_NO_PIN_MESSAGE = ("spec.placement.clique pins a single-clique ComputeDomain; a MultiClique one is placed by the "
                        "controller, one clique per group: drop placement.clique")
MULTI_CLIQUE_SCOPED_MESSAGE = ("spec.imexMode: Dedicated is single-clique only (an IMEX domain cannot span cliques); a "
                               "MultiClique ComputeDomain uses each clique's shared IMEX domain: imexMode CliqueScoped")


def uneven_message(num_nodes: int | None = None, cliques: int | None = None) -> str:
    n = f" ({num_nodes})" if num_nodes is not None else ""
    k = f" ({cliques})" if cliques is not None else ""
    return (f"spec.numNodes{n} must split evenly over spec.placement.cliques{k}, at most {NODES_PER_CLIQUE} nodes "
            "(one NVL72 rack) per clique")


SIZE_RULES: list[JsonDict] = [
    {"rule": "!has(self.numNodes) || (has(self.placement) && has(self.placement.scope) && "
             f"self.placement.scope == 'MultiClique') || self.numNodes <= {NODES_PER_CLIQUE}",
     "message": too_many_nodes_message()},
    {"rule": "!has(self.placement) || (has(self.placement.scope) && self.placement.scope == 'MultiClique') == "
             "has(self.placement.cliques)",
     "message": MULTI_NEEDS_CLIQUES_MESSAGE},
    {"rule": "!has(self.placement) || !has(self.placement.cliques) || !has(self.placement.clique)",
     "message": MULTI_NO_PIN_MESSAGE},
    {"rule": "!has(self.placement) || !has(self.placement.cliques) || !has(self.imexMode) || "
             "self.imexMode == 'CliqueScoped'",
     "message": MULTI_CLIQUE_SCOPED_MESSAGE},
    {"rule": "!has(self.placement) || !has(self.placement.cliques) || !has(self.numNodes) || "
             f"(self.numNodes % self.placement.cliques == 0 && self.numNodes <= {NODES_PER_CLIQUE} * "
             "self.placement.cliques)",
     "message": uneven_message()},
]

CHANNEL_CLAIM_RULE: JsonDict = {
    "rule": "has(self.channelClaim) == has(oldSelf.channelClaim)"
    " && (!has(self.channelClaim) || self.channelClaim == oldSelf.channelClaim)",
    "message": immutable_message("channelClaim", _WHY["channelClaim"]),
}
ALL_NEEDS_DEDICATED_MESSAGE = (
    "spec.channelAllocationMode: All requires spec.imexMode: Dedicated (in a clique-scoped IMEX domain "
    "channels are what isolates ComputeDomains from each other); set imexMode: Dedicated or "
    "channelAllocationMode: Single"
)
TLS_NEEDS_DEDICATED_MESSAGE = (
    "spec.imexAuthentication: TLS requires spec.imexMode: Dedicated (a clique-scoped IMEX domain is shared by every "
    "ComputeDomain of the clique, so it cannot hold credentials of one of them); set imexMode: Dedicated, or drop "
    "imexAuthentication"
)
TLS_NEEDS_DEDICATED_RULE: JsonDict = {
    "rule": "!has(self.imexAuthentication) || self.imexAuthentication != 'TLS'"
    " || (has(self.imexMode) && self.imexMode == 'Dedicated')",
    "message": TLS_NEEDS_DEDICATED_MESSAGE,
}
IMEX_AUTH_RULE: JsonDict = {
    "rule": "has(self.imexAuthentication) == has(oldSelf.imexAuthentication)"
    " && (!has(self.imexAuthentication) || self.imexAuthentication == oldSelf.imexAuthentication)",
    "message": immutable_message("imexAuthentication", _WHY["imexAuthentication"]),
}
ALL_NEEDS_DEDICATED_RULE: JsonDict = {
    "rule": "!has(self.channelAllocationMode) || self.channelAllocationMode != 'All'"
    " || (has(self.imexMode) && self.imexMode == 'Dedicated')",
    "message": ALL_NEEDS_DEDICATED_MESSAGE,
}

class _Spec(BaseModel):
    """Base of models users write: unknown fields are errors, API (camelCase) names are used."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)


class _Status(BaseModel):
    """Base of models agents and controllers write: unknown fields (from newer writers) are ignored."""

    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)


class Placement(_Spec):
    """Where the ComputeDomain's members may run."""

    scope: PlacementScope = Field(
        PlacementScope.SINGLE_CLIQUE,
        description="How far members may spread. SingleClique (default): every member runs in one NVLink "
                    "clique, enforced by the scheduler through the channel claim's allocation. MultiClique: the "
                    "members form `cliques` groups, each in a clique of its own with a channel of its own (one "
                    "channel claim per group, '<claim>-<group>'), placed all at once or not at all.",
    )
    cliques: int | None = Field(
        None, ge=2, le=MAX_CLIQUES_PER_DOMAIN,
        description=f"MultiClique only, and required there: how many cliques (groups) the ComputeDomain spans, "
                    f"2..{MAX_CLIQUES_PER_DOMAIN}. numNodes, if set, must split evenly over them, at most "
                    f"{NODES_PER_CLIQUE} nodes (one NVL72 rack) per clique.",
        json_schema_extra={"format": "int32"},
    )
    clique: str | None = Field(
        None, pattern=CLIQUE, max_length=CLIQUE_MAX,
        description="Pin the ComputeDomain to this clique, '<clusterUUID>.<cliqueID>' as in the node label "
                    "nvlfabric.io/clique (e.g. 9f410827-489f-46fd-8203-51266ca08eb7.32766): its channel claim "
                    "then only takes a channel of that clique's pool. "
                    "Unset: the scheduler picks a clique with a free channel.",
    )


class ChannelClaim(_Spec):
    """The shared ResourceClaim that carries the ComputeDomain's IMEX channel."""

    name: str = Field(
        pattern=DNS_SUBDOMAIN, max_length=DNS_SUBDOMAIN_MAX,
        description="Name of the ResourceClaim (in the ComputeDomain's namespace) that every pod of the "
                    "ComputeDomain lists in spec.resourceClaims[].resourceClaimName. One shared claim means "
                    "one channel for the whole ComputeDomain and one clique for all its pods.",
    )


class ComputeDomainSpec(_Spec):
    """The desired ComputeDomain."""

    model_config = ConfigDict(json_schema_extra={
        "x-kubernetes-validations": [CHANNEL_CLAIM_RULE, ALL_NEEDS_DEDICATED_RULE, *SIZE_RULES,
                                     TLS_NEEDS_DEDICATED_RULE, IMEX_AUTH_RULE],
    })

    channel_allocation_mode: ChannelAllocationMode = Field(
        ChannelAllocationMode.SINGLE, alias="channelAllocationMode",
        description="Single (default): each pod gets the one IMEX channel allocated to this ComputeDomain. "
                    "All: each pod gets every channel of this ComputeDomain (never another domain's, unlike "
                    "NVIDIA's 0-2047); allowed only with imexMode Dedicated. "
                    "Immutable.",
        json_schema_extra=_immutable("channelAllocationMode", _WHY["channelAllocationMode"]),
    )
    num_nodes: int | None = Field(
        None, alias="numNodes", ge=1,
        description="Optional expected number of member nodes. Unset: the ComputeDomain is Ready when every "
                    "placed member is ready. Set: it is Ready only once at least this many members are "
                    "ready. Never holds back start-up; may be changed at any time.",
    )
    imex_mode: IMEXMode = Field(
        IMEXMode.CLIQUE_SCOPED, alias="imexMode",
        description="CliqueScoped (default): members join the persistent IMEX domain of their clique (warm, "
                    "shared by all ComputeDomains of the clique, which are isolated by channel). Dedicated: "
                    "a per-ComputeDomain IMEX domain is started for its members (cold start, full isolation). "
                    "Immutable.",
        json_schema_extra=_immutable("imexMode", _WHY["imexMode"]),
    )
    placement: Placement = Field(
        default_factory=Placement,
        description="Where members may run. Defaults to one clique chosen by the scheduler. Immutable.",
        json_schema_extra={"default": {}, **_immutable("placement", _WHY["placement"])},
    )
    channel_claim: ChannelClaim | None = Field(
        None, alias="channelClaim",
        description="The shared ResourceClaim pods reference to join this ComputeDomain. Unset: the claim is "
                    f"named '<ComputeDomain name>{CHANNEL_CLAIM_SUFFIX}'. Immutable.",
    )

    node_loss_policy: NodeLossPolicy | None = Field(
        None, alias="nodeLossPolicy",
        description="What happens to the pods on a member node that is lost: NotReady (its kubelet stopped posting "
                    "status), deleted, or with an unhealthy NVLink fabric. Replace (default): each of this "
                    "ComputeDomain's pods there is failed as disrupted (condition DisruptionTarget, reason "
                    "DeletionByNvlfabric) and deleted, so that its workload (a BoundJob's Job or JobSet, a "
                    "StatefulSet) replaces it (on an unhealthy fabric only while a node of the clique is free: a "
                    "degraded fabric is slower, not gone); the replacement joins in the same clique, on the same "
                    "claim and channel, on a free node (a rack's spares), and the other members are not touched. "
                    "Keep: the loss is told (status.lostNodes, the NodesAvailable condition, an Event), the pods are "
                    "left to Kubernetes (a NotReady node's pods are evicted after their tolerationSeconds, 300 s by "
                    "default). Unset means Replace (unset rather than defaulted, so that domains created before the "
                    "field existed keep their spec as written). May be changed at any time.",
    )
    imex_authentication: IMEXAuthentication | None = Field(
        None, alias="imexAuthentication",
        description="imexMode Dedicated only. TLS: the members' IMEX daemons authenticate and encrypt their links "
                    "with certificates of this ComputeDomain's own certificate authority (the nvlfabric controller "
                    "issues them to member nodes only, and renews them under the running domain); a daemon with "
                    "another domain's or no credentials is refused. Disabled: no authentication (as NVIDIA's "
                    "driver runs IMEX). Unset: the driver's default (NvlfabricDriver imex_authentication), "
                    "recorded in status.imexAuthentication. Immutable.",
    )

    @model_validator(mode="after")
    def _all_needs_dedicated(self) -> ComputeDomainSpec:
        if self.channel_allocation_mode is ChannelAllocationMode.ALL and self.imex_mode is not IMEXMode.DEDICATED:
            raise ValueError(ALL_NEEDS_DEDICATED_MESSAGE)
        if self.imex_authentication is IMEXAuthentication.TLS and self.imex_mode is not IMEXMode.DEDICATED:
            raise ValueError(TLS_NEEDS_DEDICATED_MESSAGE)
        return self

    @model_validator(mode="after")
    def _sizes(self) -> ComputeDomainSpec:
        multi, k = self.placement.scope is PlacementScope.MULTI_CLIQUE, self.placement.cliques
        if multi != (k is not None):
            raise ValueError(MULTI_NEEDS_CLIQUES_MESSAGE)
        if k is not None and self.placement.clique is not None:
            raise ValueError(MULTI_NO_PIN_MESSAGE)
        if k is not None and self.imex_mode is not IMEXMode.CLIQUE_SCOPED:
            raise ValueError(MULTI_CLIQUE_SCOPED_MESSAGE)
        n = self.num_nodes
        if n is not None and k is None and n > NODES_PER_CLIQUE:
            raise ValueError(too_many_nodes_message(n))
        if n is not None and k is not None and (n % k or n > NODES_PER_CLIQUE * k):
            raise ValueError(uneven_message(n, k))
        return self

    @property
    def loss_policy(self) -> NodeLossPolicy:
        """nodeLossPolicy, Replace when unset."""
        return self.node_loss_policy or NodeLossPolicy.REPLACE

    @property
    def groups(self) -> int:
        """How many channel claims (cliques) the ComputeDomain has: 1 unless MultiClique."""
        return self.placement.cliques or 1


class NodeStatus(_Status):
    """One member node's report, written by that node's agent (its own field manager)."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=DNS_SUBDOMAIN_MAX,
                      description="The Kubernetes Node name (the key of this list).")
    address: str | None = Field(None, max_length=DNS_SUBDOMAIN_MAX,
                                description="IP address or DNS name at which this node's IMEX daemon is "
                                            "reached by its peers.")
    clique: str | None = Field(None, pattern=CLIQUE, max_length=CLIQUE_MAX,
                               description="The node's clique, '<clusterUUID>.<cliqueID>', from NVML.")
    ready: bool = Field(False, description="True when the node's IMEX daemon is ready and the channel is "
                                           "prepared for this ComputeDomain.")
    message: str | None = Field(None, max_length=1024,
                                description="Human-readable detail, e.g. why the node is not ready.")
    imex_trusts: str | None = Field(
        None, alias="imexTrusts", pattern=r"^[0-9a-f]{16}$",
        description="imexAuthentication TLS only: the authority bundle this node's IMEX daemon has loaded, as "
                    "the first 16 hex digits of the SHA-256 of status.imexCABundle; how the controller knows "
                    "every member trusts a new authority before it signs with it.")
    imex_issuer: str | None = Field(
        None, alias="imexIssuer", pattern=r"^[0-9a-f]{2,128}$",
        description="imexAuthentication TLS only: the key identifier (hex) of the authority that signed this "
                    "node's IMEX certificate; how the controller knows no member still uses a retiring one.")


class LostNode(_Status):
    """A member node the ComputeDomain lost, kept until it is replaced and, if it still holds the
    domain's state, until it is back."""

    name: str = Field(max_length=DNS_SUBDOMAIN_MAX, description="The Node name (the key of this list).")
    reason: LostReason = Field(description="NodeNotReady, NodeDeleted or FabricUnhealthy.")
    message: str = Field("", max_length=1024, description="What the Node says (its Ready or NVLinkFabricReady "
                                                          "condition), or that it is gone.")
    lost_at: AwareDatetime = Field(alias="lostAt", description="When the controller saw the loss (RFC 3339).")
    ready_before: int = Field(
        0, alias="readyBefore", ge=0, json_schema_extra={"format": "int32"},
        description="Ready members the domain had when the node was lost, the lost one among them: the domain "
                    "is healed once as many members are ready again (and numNodes, if set).")


class GroupStatus(_Status):
    """One clique group of a MultiClique ComputeDomain: its claim's clique and channel, and its members."""

    index: int = Field(ge=0, le=MAX_CLIQUES_PER_DOMAIN - 1, description="The group's number (the key of this list).",
                       json_schema_extra={"format": "int32"})
    claim: str = Field(pattern=DNS_SUBDOMAIN, max_length=DNS_SUBDOMAIN_MAX,
                       description="The group's channel ResourceClaim, which its pods list.")
    clique: str | None = Field(None, pattern=CLIQUE, max_length=CLIQUE_MAX,
                               description="The clique the group is placed in (unset until its claim is allocated).")
    channel: int | None = Field(None, ge=0, le=MAX_CHANNEL, description="The group's IMEX channel in its clique.",
                                json_schema_extra={"format": "int32"})
    nodes: list[Annotated[str, Field(max_length=DNS_SUBDOMAIN_MAX, description="A Node name.")]] = Field(
        default_factory=list, max_length=NODES_PER_CLIQUE * 4,
        description="The member nodes in the group's clique.")
    ready_nodes: int = Field(0, alias="readyNodes", ge=0, description="How many of those are ready.",
                             json_schema_extra={"format": "int32"})


class Condition(_Status):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(pattern=CONDITION_TYPE, max_length=316,
                      description="Type of condition in CamelCase, e.g. Ready or ChannelAllocated.")
    status: ConditionStatus = Field(description="Status of the condition: True, False or Unknown.")
    observed_generation: int | None = Field(
        None, alias="observedGeneration", ge=0,
        description="The .metadata.generation the condition was set for.",
        json_schema_extra={"format": "int64"},
    )
    last_transition_time: AwareDatetime = Field(
        alias="lastTransitionTime",
        description="Last time the condition changed status (RFC 3339).",
    )
    reason: str = Field(pattern=CONDITION_REASON, min_length=1, max_length=1024,
                        description="Machine-readable CamelCase reason for the last transition.")
    message: str = Field(max_length=32768, description="Human-readable detail of the last transition.")


class ComputeDomainStatus(_Status):
    """The observed ComputeDomain, written through the status subresource."""

    phase: Phase | None = Field(
        None,
        description="Lifecycle phase: Pending (no channel yet; also when unset), Allocating (channel "
                    "allocated, members joining), Ready (all placed members ready, and at least numNodes "
                    "if set), Degraded (was Ready, a member is no longer ready or its node's NVLink fabric is "
                    "unhealthy), Failed (the spec cannot "
                    "be satisfied; see the Ready condition).",
    )
    clique: str | None = Field(None, pattern=CLIQUE, max_length=CLIQUE_MAX,
                               description="The clique, '<clusterUUID>.<cliqueID>', the members are placed in.")
    channel: int | None = Field(None, ge=0, le=MAX_CHANNEL,
                                description="The IMEX channel number allocated to this ComputeDomain in its "
                                            "clique (unique among the clique's ComputeDomains).",
                                json_schema_extra={"format": "int32"})
    imex_port_slot: int | None = Field(
        None, alias="imexPortSlot", ge=1, le=MAX_IMEX_PORT_SLOT,
        description="imexMode Dedicated only: the IMEX port slot of this ComputeDomain's own IMEX domain "
                    f"(peer port {IMEX_SERVER_PORT}+{IMEX_PORT_STRIDE}*slot, command port "
                    f"{IMEX_CMD_PORT}+{IMEX_PORT_STRIDE}*slot), assigned by the controller once "
                    "the clique is known, unique among the clique's dedicated ComputeDomains, never changed.",
        json_schema_extra={"format": "int32"})
    imex_authentication: IMEXAuthentication | None = Field(
        None, alias="imexAuthentication",
        description="imexMode Dedicated only: whether the domain's IMEX daemons authenticate (TLS) or not "
                    "(Disabled): spec.imexAuthentication, else the driver's default when the controller first saw "
                    "the domain; never changed, so a later change of the default does not touch running domains.")
    imex_ca_bundle: str | None = Field(
        None, alias="imexCABundle", max_length=16384,
        description="imexAuthentication TLS only: the PEM certificate(s) of the domain's IMEX certificate "
                    "authority, which the members' daemons trust; the first is the one that signs. Two while the "
                    "authority is replaced (annotation nvlfabric.io/rotate-imex-authority). Public; the "
                    "authorities' keys stay in a Secret of the controller's namespace.")
    nodes: list[NodeStatus] = Field(
        default_factory=list,
        description="One entry per member node, keyed by name; each node's agent owns its own entry "
                    "(server-side apply with a per-node field manager).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    ready_nodes: int | None = Field(None, alias="readyNodes", ge=0,
                                    description="Number of entries in nodes that are ready.",
                                    json_schema_extra={"format": "int32"})
    total_nodes: int | None = Field(None, alias="totalNodes", ge=0,
                                    description="Number of entries in nodes.",
                                    json_schema_extra={"format": "int32"})
    groups: list[GroupStatus] = Field(
        default_factory=list, max_length=MAX_CLIQUES_PER_DOMAIN,
        description="MultiClique only: one entry per clique group, keyed by index (written by the controller).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["index"]},
    )
    placed_cliques: int | None = Field(
        None, alias="placedCliques", ge=0, le=MAX_CLIQUES_PER_DOMAIN,
        description="How many cliques the members are placed in (MultiClique: groups whose claim is allocated).",
        json_schema_extra={"format": "int32"})
    unhealthy_nodes: list[Annotated[str, Field(max_length=DNS_SUBDOMAIN_MAX, description="A Node name.")]] = Field(
        default_factory=list, alias="unhealthyNodes", max_length=256,
        description="Member nodes whose NVLink fabric their agent reports unhealthy (the Node condition "
                    "NVLinkFabricReady False: degraded, not registered, a GPU missing, NVML failing); the "
                    "FabricHealthy condition says why.")
    lost_nodes: list[LostNode] = Field(
        default_factory=list, alias="lostNodes", max_length=256,
        description="Member nodes the domain lost (NotReady, deleted, or an unhealthy fabric under nodeLossPolicy "
                    "Replace), kept until the domain is healed (as many members ready as before) and the node no "
                    "longer holds its state; their entries are not in nodes meanwhile. The NodesAvailable "
                    "condition says what is done about them.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard conditions, keyed by type: Ready, FabricHealthy, NodesAvailable.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", ge=0,
        description="The .metadata.generation the controller last acted on.",
        json_schema_extra={"format": "int64"},
    )


class ObjectMeta(BaseModel):
    """The parts of ObjectMeta nvlfabric reads or sets; the server's other fields are kept as extras."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX,
                      description="The ComputeDomain's name: a DNS label (at most 63 characters), because "
                                  "derived object names and label values use it.")
    namespace: str | None = Field(None, description="The namespace; the channel claim and pods live there too.")
    labels: dict[str, str] | None = Field(None, description="Labels.")
    annotations: dict[str, str] | None = Field(None, description="Annotations.")


class ComputeDomain(BaseModel):
    """A set of pods that may share GPU memory over multi-node NVLink.

    Pods join by referencing the ComputeDomain's shared channel ResourceClaim; the scheduler
    allocates one IMEX channel for it in one clique and keeps every pod of the ComputeDomain there.
    """

    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    api_version: Literal["nvlfabric.io/v1alpha1"] = Field(
        API_VERSION, alias="apiVersion",
        description="APIVersion defines the versioned schema of this representation of an object.",
    )
    kind: Literal["ComputeDomain"] = Field(KIND, description="Kind is the REST resource this object represents.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: ComputeDomainSpec = Field(default_factory=ComputeDomainSpec, description="The desired ComputeDomain.",
                                    json_schema_extra={"default": {}})
    status: ComputeDomainStatus | None = Field(None, description="The observed ComputeDomain.")

    @property
    def channel_claim_name(self) -> str:
        """The shared channel ResourceClaim's name (spec.channelClaim.name, else '<name>-channel')."""
        return channel_claim_name(self.metadata.name, self.spec)

    def to_kube(self) -> dict[str, Any]:
        """The object as the API server takes it (API names, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def channel_claim_name(cd_name: str, spec: ComputeDomainSpec) -> str:
    """The shared channel ResourceClaim's name for a ComputeDomain (a MultiClique one: the base of
    its groups' claim names)."""
    return spec.channel_claim.name if spec.channel_claim else f"{cd_name}{CHANNEL_CLAIM_SUFFIX}"


def channel_claim_names(cd_name: str, spec: ComputeDomainSpec) -> list[str]:
    """Every channel ResourceClaim of a ComputeDomain, by group: `[<claim>]` for a single clique,
    `[<claim>-0, <claim>-1, ...]` for MultiClique (one per clique group)."""
    base = channel_claim_name(cd_name, spec)
    return [base] if spec.placement.cliques is None else [f"{base}-{g}" for g in range(spec.placement.cliques)]


def immutable_changes(old: ComputeDomainSpec, new: ComputeDomainSpec) -> list[str]:
    """API names of the immutable spec fields that differ between `old` and `new` (a diff's replaces)."""
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    return [f for f in IMMUTABLE_FIELDS if before.get(f) != after.get(f)]


def node_status_apply(cd_name: str, namespace: str, node: NodeStatus) -> dict[str, Any]:
    """The server-side-apply body with which a node agent reports its own `status.nodes` entry.

    Apply it to the `status` subresource with a field manager of its own (one per node), so that it
    owns exactly `status.nodes[name=<node>]` and never conflicts with another node's agent.
    """
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": cd_name, "namespace": namespace},
        "status": {"nodes": [node.model_dump(mode="json", by_alias=True, exclude_none=True)]},
    }


def imex_bundle_digest(bundle_pem: str) -> str:
    """How a node reports the authority bundle its daemon trusts (NodeStatus.imex_trusts), and how
    the controller recognises it: the first 16 hex digits of the SHA-256 of status.imexCABundle."""
    return hashlib.sha256(bundle_pem.encode()).hexdigest()[:16]


def condition(type_: str, status: ConditionStatus, reason: str, message: str, *,
              generation: int | None = None, now: datetime | None = None) -> Condition:
    """A Condition stamped with the current time (UTC)."""
    return Condition(type=type_, status=status, reason=reason, message=message, observed_generation=generation,
                     last_transition_time=(now or datetime.now(UTC)).replace(microsecond=0))
