"""Channel claims that are no live ComputeDomain's own: found in the claim informer, confirmed
against the API server and deleted, within one pass.

Why: the admission policy `nvlfabric-channel-claims` admits only the shape a domain's claim has,
but it sees the claim alone. A claim owned by, and configured for, a domain name of its own
namespace with a uid no live domain there has (another namespace's domain's, or made up) passes
it; so does a claim under a name that is not its domain's (a second channel for one domain), and
a claim that lost its owner later (its owner reference edited away, an orphaning delete of the
domain). The scheduler would give any of them a channel of the clique's pool. The agent refuses to
prepare them (nodeagent/claims.py), and this deletes them, with a Warning Event saying why, so
they hold no channel past one pass; a pod that already uses one keeps its allocation until that
pod goes, and never runs with it.

A candidate is read again from the API server before it is deleted: the provider creates a domain
and then its claim, and the claim's watch event can come before the domain's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.controller.events import event
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.controller.strayclaims")

MAX_PER_PASS = 20
"""Candidates checked against the API server in one pass (each costs a read; the rest wait a pass)."""


@dataclass(frozen=True)
class ChannelClaim:
    """What the sweep reads of a claim that requests a channel (kept on the claim's record)."""

    uid: str
    owner: tuple[str, str] | None
    """(name, uid) of its owner reference to a ComputeDomain of a served version."""
    configured: tuple[str, str] | None
    """(name, uid) of the ComputeDomain its channel configuration names (None: none, or several)."""
    terminating: bool


def channel_claim(raw: Mapping[str, Any]) -> ChannelClaim | None:
    """The claim as the sweep sees it, or None when it requests no device of nvlfabric's class."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    devices = spec.get("devices") or {}
    wants = any((r.get("exactly") or {}).get("deviceClassName") == names.DEVICE_CLASS or
                any(s.get("deviceClassName") == names.DEVICE_CLASS for s in r.get("firstAvailable") or [])
                for r in devices.get("requests") or [])
    if not wants:
        return None
    # Any owner reference to a ComputeDomain of a served version: the admission policy asks new
    # claims for a controller reference, but a deletion is no place to be stricter than the agent.
    owner = next(((str(o.get("name", "")), str(o.get("uid", ""))) for o in meta.get("ownerReferences") or []
                  if o.get("kind") == api.KIND and o.get("apiVersion") == api.API_VERSION), None)
    named = [((c.get("opaque") or {}).get("parameters") or {}).get("computeDomain") or {}
             for c in devices.get("config") or [] if (c.get("opaque") or {}).get("driver") == names.DRIVER]
    configured = (str(named[0].get("name", "")), str(named[0].get("uid", ""))) if len(named) == 1 else None
    return ChannelClaim(uid=str(meta.get("uid", "")), owner=owner, configured=configured,
                        terminating=bool(meta.get("deletionTimestamp")))


def why_stray(namespace: str, name: str, claim: ChannelClaim, domain: tuple[str, list[str]] | None) -> str | None:
    """Why claim `namespace/name` is not its ComputeDomain's own (pure); None when it is. `domain`:
    the uid and claim names of the live ComputeDomain its owner reference names, None if none
    exists."""
    if claim.owner is None:
        return (f"it has no owner reference to a ComputeDomain ({api.API_VERSION}): a channel claim lives and "
                "dies with its domain")
    owner, uid = claim.owner
    if claim.configured != claim.owner:
        return f"its channel configuration names another ComputeDomain than its owner {namespace}/{owner}"
    if domain is None:
        return f"ComputeDomain {namespace}/{owner}, its owner, does not exist"
    if domain[0] != uid:
        return (f"its owner reference and configuration name ComputeDomain {namespace}/{owner} with uid {uid}, "
                f"but that domain's uid is {domain[0]}")
    if name not in domain[1]:
        return (f"ComputeDomain {namespace}/{owner}'s channel claim{'s are' if len(domain[1]) > 1 else ' is'} "
                f"{', '.join(domain[1])}, not {name}")
    return None


def live_domain(client: Client, resource: Any, namespace: str, name: str) -> tuple[str, list[str]] | None:
    """The uid and channel claim names of ComputeDomain namespace/name (`resource`: its lightkube
    class), read from the API server."""
    try:
        with api_call(f"read ComputeDomain {namespace}/{name}"):
            obj = client.get(resource, name, namespace=namespace)
    except errors.NotFound:
        return None
    if obj.metadata is None or obj.metadata.deletionTimestamp:
        return None  # being deleted: the garbage collector takes its claims
    spec = api.ComputeDomainSpec.model_validate(obj.to_dict().get("spec") or {})
    return str(obj.metadata.uid or ""), api.channel_claim_names(name, spec)


def sweep(client: Client, resource: Any, claims: Mapping[tuple[str, str], ChannelClaim | None],
          domains: Mapping[tuple[str, str], tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """Delete the channel claims that are no live domain's own; returns the claims deleted.
    `domains`: (namespace, name) → uid and claim names, as the informer shows them; `resource`:
    the ComputeDomain lightkube class."""
    suspects = [(key, c) for key, c in sorted(claims.items()) if c is not None and not c.terminating and
                why_stray(*key, c, domains.get((key[0], c.owner[0])) if c.owner else None) is not None]
    deleted = []
    for (namespace, name), claim in suspects[:MAX_PER_PASS]:
        try:
            live = live_domain(client, resource, namespace, claim.owner[0]) if claim.owner else None
            why = why_stray(namespace, name, claim, live)
            if why is None:
                continue  # the informer was behind
            with api_call(f"delete stray channel claim {namespace}/{name}"):
                # lightkube sends no DeleteOptions preconditions: the uid is compared on a fresh read,
                # so a claim of the same name made since (a domain's own, recreated) is left alone.
                current = client.get(ResourceClaim, name, namespace=namespace)
                if current.metadata is None or current.metadata.uid != claim.uid:
                    continue
                client.delete(ResourceClaim, name, namespace=namespace)
        except errors.NotFound:
            continue
        except (errors.NvlfabricError, ValueError) as exc:  # ValueError: a domain's spec that does not parse
            log.warning("channel claim %s/%s: not judged now: %s", namespace, name, exc)
            continue
        deleted.append((namespace, name))
        message = (f"deleted: {why}. A channel claim is made by its ComputeDomain (declare the domain and use its "
                   "claim); no node prepares this one")
        log.warning("channel claim %s/%s %s", namespace, name, message)
        event(client, namespace, "ResourceClaim", "resource.k8s.io/v1", name, claim.uid, "StrayChannelClaim",
              message)
    return deleted
