"""What a ResourceClaim must be for this node to prepare it: the checks, with the messages the kubelet
(and the user) sees.

The reference the kubelet sends must be well-formed (namespace, name and UID as the API server makes
them); the live claim must still have the requested UID, be allocated, hold a result of our driver
from a clique pool of this node's clique, and carry our opaque config, which is decoded strictly
(nvlfabric/api/channelconfig.py). Then the claim must be its ComputeDomain's own (`get_domain`,
`check_owner`): the domain its config names exists in the claim's namespace with the config's UID,
owns the claim (owner reference of our API version and kind, the domain's name and UID), and names
it among its channel claims; a tenant's hand-written claim, or one carrying another namespace's
domain UID, gets no channel. `allocation_of` turns a validated claim into what the checkpoint
records for it (its own channel, in allocation mode All too; IMEX domain; pool device).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import ValidationError

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.api.channelconfig import ChannelConfig
from nvlfabric.api.kubelet.types import ClaimRef
from nvlfabric.api.names import DRIVER
from nvlfabric.nodeagent import checkpoint, imexconfig, kubeapi
from nvlfabric.nodeagent.kubeapi import Client

__all__ = [
    "RESOURCE_API",
    "NodeIdentity",
    "PrepareError",
    "ValidClaim",
    "allocation_of",
    "check_imex_mode",
    "check_owner",
    "check_ref",
    "claim_name",
    "get_claim",
    "get_domain",
    "is_uid",
    "show",
    "validate",
]

RESOURCE_API = "resource.k8s.io/v1"
_UID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.\-]{0,126}[A-Za-z0-9])?$")


class PrepareError(Exception):
    """This claim cannot be prepared now; the message is what the kubelet (and the user) sees."""


@dataclass(frozen=True)
class NodeIdentity:
    name: str
    address: str
    clique: str | None


class ValidClaim(NamedTuple):
    """A claim `validate` accepted: its device of our driver and its config."""

    pool: str
    device: str
    request: str
    """The request the device was allocated for (its subrequest, if any, cut off)."""
    config: ChannelConfig


def is_uid(value: str) -> bool:
    """`value` looks like an object UID the API server gives (and so may name a file)."""
    return bool(_UID.match(value))


def show(value: str, limit: int = 80) -> str:
    """`value` for an error message: quoted when odd, cut when long (a request may carry anything)."""
    text = value if _UID.match(value) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(value)} characters)"


def claim_name(c: ClaimRef) -> str:
    return f"{show(c.namespace)}/{show(c.name)}"


def check_ref(c: ClaimRef) -> None:
    """The kubelet sends what the API server stored; anything else is refused before it is used in a
    URL or a file name."""
    if not names.is_dns_label(c.namespace):
        raise PrepareError(f"claim {claim_name(c)}: namespace {show(c.namespace)} is not a valid namespace name")
    if not names.is_dns_subdomain(c.name):
        raise PrepareError(f"claim {claim_name(c)}: name {show(c.name)} is not a valid ResourceClaim name")
    if not _UID.match(c.uid):
        raise PrepareError(f"claim {claim_name(c)}: UID {show(c.uid)} is not a valid object UID")


def get_claim(client: Client, c: ClaimRef) -> dict[str, Any]:
    """The live claim, which must still have the requested UID."""
    try:
        claim = client.get(kubeapi.path(RESOURCE_API, "resourceclaims", c.name, namespace=c.namespace))
    except errors.NotFound as exc:
        raise PrepareError(f"claim {claim_name(c)} does not exist (any more)") from exc
    live_uid = (claim.get("metadata") or {}).get("uid")
    if live_uid != c.uid:
        raise PrepareError(f"claim {claim_name(c)} got replaced: its UID is {live_uid}, "
                           f"not the requested {c.uid}")
    return claim


def validate(c: ClaimRef, claim: dict[str, Any], node: NodeIdentity) -> ValidClaim:
    """The claim is allocated a channel of our driver in `node`'s clique, with a valid config."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    devices = alloc.get("devices")
    if not devices:
        raise PrepareError(f"claim {claim_name(c)} is not allocated")
    ours = [r for r in devices.get("results") or [] if r.get("driver") == DRIVER]
    if not ours:
        raise PrepareError(f"claim {claim_name(c)} has no device of driver {DRIVER}")
    pool, device, request = (str(ours[0].get(k) or "") for k in ("pool", "device", "request"))
    clique = names.clique_of_pool(pool)
    if clique is None or names.channel_of_device(device) is None:
        raise PrepareError(f"claim {claim_name(c)}: device {pool}/{device} is not a channel")
    if clique != node.clique:
        raise PrepareError(f"claim {claim_name(c)} was allocated in clique {clique}, but node "
                           f"{node.name} is in clique {node.clique or '(none: fabric not ready)'}")
    raw = [(cfg.get("opaque") or {}).get("parameters") for cfg in devices.get("config") or []
           if (cfg.get("opaque") or {}).get("driver") == DRIVER]
    if not raw:
        raise PrepareError(f"claim {claim_name(c)} carries no {DRIVER} configuration; create "
                           "ComputeDomains with nvlfabric (its claim names the ComputeDomain)")
    return ValidClaim(pool, device, request.split("/")[0], _config(c, raw[-1]))


def _config(c: ClaimRef, raw: Any) -> ChannelConfig:
    """Our opaque config, strictly decoded; the ComputeDomain it names must be one of the claim's
    namespace and named as the API server could have named it."""
    try:
        config = ChannelConfig.model_validate(raw)
    except ValidationError as exc:
        found_errors = exc.errors()
        found = "; ".join(f"at {'.'.join(str(p) for p in e['loc']) or '(config)'}: {e['msg']}"
                          for e in found_errors[:3])
        more = f" (and {len(found_errors) - 3} more)" if len(found_errors) > 3 else ""
        raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config {found}{more}") from exc
    cd = config.compute_domain
    # The agent writes this ComputeDomain's status with its own credentials: only the claim's own
    # namespace, and only a name the API server could have given an object.
    if cd.namespace != c.namespace:
        raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config at computeDomain.namespace: "
                           f"{show(cd.namespace)} is not the claim's namespace {c.namespace}")
    if not names.is_dns_subdomain(cd.name):
        raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config at computeDomain.name: "
                           f"{show(cd.name)} is not a valid ComputeDomain name")
    if not _UID.match(cd.uid):
        raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config at computeDomain.uid: "
                           f"{show(cd.uid)} is not a valid object UID")
    return config


def get_domain(client: Client, c: ClaimRef, config: ChannelConfig) -> dict[str, Any]:
    """The ComputeDomain the claim's config names, read in the claim's own namespace (`_config`
    allowed no other): the one read of it a cold prepare makes (a Dedicated one's IMEX view comes
    from it too)."""
    cd = config.compute_domain.name
    try:
        return client.get(kubeapi.path(api.API_VERSION, api.PLURAL, cd, namespace=c.namespace))
    except errors.NotFound as exc:
        raise PrepareError(f"claim {claim_name(c)}: its configuration names ComputeDomain "
                           f"{c.namespace}/{cd}, which does not exist; "
                           + _made_by_domain(f"{cd}{api.CHANNEL_CLAIM_SUFFIX}, unless the domain's "
                                             "spec.channelClaim names another")) from exc


def _made_by_domain(claims: str) -> str:
    """The way out of every ownership refusal."""
    return (f"a channel claim is made by its ComputeDomain: declare the domain, and name its claim ({claims}) "
            "in the pods' spec.resourceClaims[].resourceClaimName, never a claim written by hand")


_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./\-]*$")


def _ref_field(ref: dict[str, Any], key: str) -> str:
    """One field of an owner reference for a message (user input: quoted when odd, cut when long)."""
    value = str(ref.get(key, ""))
    text = value if _PLAIN.match(value) else repr(value)
    return text if len(text) <= 63 else f"{text[:63]}...({len(value)} characters)"


def _owner_refs(refs: list[Any]) -> str:
    """The claim's own owner references for a message (at most 3)."""
    shown = [f"{_ref_field(r, 'apiVersion')} {_ref_field(r, 'kind')} {_ref_field(r, 'name')} "
             f"(uid {_ref_field(r, 'uid')})" for r in refs[:3] if isinstance(r, dict)]
    more = f" and {len(refs) - 3} more" if len(refs) > 3 else ""
    return ", ".join(shown) + more if shown else "none"


def check_owner(c: ClaimRef, claim: dict[str, Any], domain: dict[str, Any], config: ChannelConfig, *,
                prepared_here: bool) -> None:
    """The claim is its ComputeDomain's own: the domain its config names has the config's UID, owns
    the claim (an owner reference of exactly our API version and kind, the domain's name and UID)
    and names it among its channel claims. Everything a message names is in the claim's namespace.

    A domain being deleted still answers for a claim `prepared_here` (its entry is completed on this
    node: a repeated prepare after an agent restart); a new prepare of it is refused: the claim goes
    with the domain, and a pod that would start on it now would lose its channel at once."""
    ns, cd = c.namespace, config.compute_domain
    meta = domain.get("metadata") or {}
    live_uid = meta.get("uid")
    claim_names = _channel_claim_names(c, cd.name, domain)
    fix = _made_by_domain(" or ".join(claim_names))
    if live_uid != cd.uid:
        raise PrepareError(f"claim {claim_name(c)}: its configuration names ComputeDomain {ns}/{cd.name} with uid "
                           f"{cd.uid}, but {ns}/{cd.name} has uid {show(str(live_uid))}: the claim is not that "
                           f"domain's (it was made for an earlier domain of that name, or by hand); {fix}")
    refs = (claim.get("metadata") or {}).get("ownerReferences") or []
    if not any(isinstance(r, dict) and (r.get("apiVersion"), r.get("kind"), r.get("name"), r.get("uid"))
               == (api.API_VERSION, api.KIND, cd.name, cd.uid) for r in refs):
        raise PrepareError(f"claim {claim_name(c)} is not owned by ComputeDomain {ns}/{cd.name}: it needs the owner "
                           f"reference apiVersion {api.API_VERSION}, kind {api.KIND}, name {cd.name}, uid {cd.uid}, "
                           f"and has {_owner_refs(refs)}; {fix}")
    if c.name not in claim_names:
        raise PrepareError(f"claim {claim_name(c)} is not a channel claim of ComputeDomain {ns}/{cd.name}, whose "
                           f"claim{'s are' if len(claim_names) > 1 else ' is'} {', '.join(claim_names)}; {fix}")
    if meta.get("deletionTimestamp") and not prepared_here:
        raise PrepareError(f"claim {claim_name(c)}: ComputeDomain {ns}/{cd.name} is being deleted, so its channel "
                           "is not prepared for a new pod (pods that have it keep it); once the domain is gone, "
                           "declare it again for new pods")


def _channel_claim_names(c: ClaimRef, name: str, domain: dict[str, Any]) -> list[str]:
    """The domain's channel claims, from the two spec fields that name them (so a field a newer CRD
    added elsewhere in the spec does not stop the check)."""
    raw = domain.get("spec") or {}
    try:
        spec = api.ComputeDomainSpec.model_validate(
            {k: raw[k] for k in ("channelClaim", "placement") if isinstance(raw, dict) and k in raw})
    except ValidationError as exc:
        found = exc.errors()[0]
        where = ".".join(str(p) for p in found["loc"]) or "(spec)"
        raise PrepareError(f"claim {claim_name(c)}: ComputeDomain {c.namespace}/{name} has a spec this agent cannot "
                           f"read (at spec.{where}: {found['msg']}); is the nvlfabric agent older than its "
                           "ComputeDomain CRD?") from exc
    return api.channel_claim_names(name, spec)


def check_imex_mode(c: ClaimRef, config: ChannelConfig, allowed: frozenset[api.IMEXMode]) -> None:
    if config.imex_mode not in allowed:
        raise PrepareError(
            f"claim {claim_name(c)}: imexMode {config.imex_mode.value} is not enabled in this cluster's nvlfabric "
            f"driver (it allows {', '.join(sorted(m.value for m in allowed))}: NvlfabricDriver "
            "imex_modes); recreate the ComputeDomain with an allowed imexMode")


def allocation_of(c: ClaimRef, pool: str, device: str, config: ChannelConfig) -> checkpoint.Allocation:
    """What the validated claim gives this node: channels, IMEX domain, pool device."""
    dedicated = config.imex_mode is api.IMEXMode.DEDICATED
    every = config.channel_allocation_mode is api.ChannelAllocationMode.ALL
    if every and not dedicated:  # the CRD refuses this too; a hand-made claim is refused here
        raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config: channelAllocationMode All needs "
                           "imexMode Dedicated (in the clique's shared IMEX domain channels isolate domains)")
    channel, clique = names.channel_of_device(device), names.clique_of_pool(pool)
    if channel is None or clique is None:  # validate checked both
        raise PrepareError(f"claim {claim_name(c)}: device {pool}/{device} is not a channel")
    # All is every channel of the claim's own ComputeDomain on this node, never another domain's
    # (NVIDIA's driver gives 0..2047, other teams' channels included): a domain's claim holds one.
    return checkpoint.Allocation(
        compute_domain_uid=config.compute_domain.uid, compute_domain_name=config.compute_domain.name,
        channels=(channel,), all_channels=every,
        imex_domain_id=sys.intern(imexconfig.dedicated_domain_id(config.compute_domain.uid) if dedicated
                                  else imexconfig.clique_domain_id(clique)),
        device=f"{pool}/{device}")
