"""The clique channel pools: what ResourceSlices a clique needs, and how to get there.

One pool per NVLink clique (see docs/architecture.md, "DRA design"): devices `channel-1..N`
published in slices of at most 128 devices whose node selector picks the clique's Nodes by the
`nvlfabric.io/clique` label. Pool bookkeeping follows the scheduler's rules: every slice of the
pool carries the same `generation` and the pool's `resourceSliceCount`; a pool is only usable
when the number of slices at the newest generation equals that count, so a change bumps the
generation on every slice, then deletes the slices no longer needed.

`plan` is pure (existing slices in, actions out), so it is property-tested; `apply` runs a plan
against the API server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightkube import Client
from lightkube.models.core_v1 import NodeSelector, NodeSelectorRequirement, NodeSelectorTerm
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.models.resource_v1 import Device, DeviceAttribute, ResourcePool, ResourceSliceSpec
from lightkube.resources.resource_v1 import ResourceSlice

from nvlfabric.api import names
from nvlfabric.api.names import (
    CLIQUE_LABEL,
    DRIVER,
    MAX_CHANNELS_PER_CLIQUE,
    MAX_DEVICES_PER_SLICE,
    POOL_LABEL,
    pool_name,
)


def slice_name(clique: str, index: int) -> str:
    # Lexicographic order = slice order: the allocator is first-fit over sorted names.
    return f"{pool_name(clique)}-{index:05x}".lower()


def channel_device(n: int, clique: str) -> Device:
    return Device(name=names.channel_device(n), attributes={
        "channel": DeviceAttribute(int=n), "clique": DeviceAttribute(string=clique)})


@dataclass(frozen=True)
class Owner:
    """The cluster-scoped object the pools belong to (the driver's DeviceClass): when the driver is
    uninstalled and it goes, the garbage collector withdraws every pool with it."""

    api_version: str
    kind: str
    name: str
    uid: str


def desired_slices(clique: str, channels: int, generation: int, owner: Owner | None = None) -> list[ResourceSlice]:
    if not 1 <= channels <= MAX_CHANNELS_PER_CLIQUE:
        raise ValueError(f"channels per clique must be between 1 and {MAX_CHANNELS_PER_CLIQUE}, got {channels}")
    numbers = list(range(1, channels + 1))
    chunks = [numbers[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(numbers), MAX_DEVICES_PER_SLICE)]
    selector = NodeSelector(nodeSelectorTerms=[NodeSelectorTerm(matchExpressions=[
        NodeSelectorRequirement(key=CLIQUE_LABEL, operator="In", values=[clique])])])
    return [
        ResourceSlice(
            metadata=ObjectMeta(name=slice_name(clique, i), labels={POOL_LABEL: pool_name(clique)},
                                ownerReferences=[OwnerReference(apiVersion=owner.api_version, kind=owner.kind,
                                                                name=owner.name, uid=owner.uid)] if owner else None),
            spec=ResourceSliceSpec(
                driver=DRIVER, nodeSelector=selector,
                pool=ResourcePool(name=pool_name(clique), generation=generation, resourceSliceCount=len(chunks)),
                devices=[channel_device(n, clique) for n in chunk]))
        for i, chunk in enumerate(chunks)
    ]


def _content(s: ResourceSlice) -> Any:
    assert s.spec is not None
    return ([d.to_dict() for d in s.spec.devices or []], s.spec.nodeSelector.to_dict() if s.spec.nodeSelector else None,
            s.spec.pool.resourceSliceCount)


def _generation(s: ResourceSlice) -> int:
    return s.spec.pool.generation if s.spec else 0


@dataclass
class Plan:
    create: list[ResourceSlice] = field(default_factory=list)
    update: list[ResourceSlice] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def _owners(s: ResourceSlice) -> Any:
    return [(o.kind, o.name, o.uid) for o in (s.metadata.ownerReferences or [])] if s.metadata else []


def plan(clique: str, channels: int, existing: Sequence[ResourceSlice], owner: Owner | None = None) -> Plan:
    """Actions that turn `existing` (this pool's slices) into the desired pool, with generations
    that keep the pool consistent for the scheduler at every step."""
    by_name = {s.metadata.name: s for s in existing if s.metadata and s.metadata.name}
    current_gen = max((_generation(s) for s in existing), default=0)
    same = desired_slices(clique, channels, current_gen, owner)
    if current_gen > 0 and len(same) == len(by_name) and all(
            d.metadata and d.metadata.name in by_name and _content(d) == _content(by_name[d.metadata.name])
            and _generation(by_name[d.metadata.name]) == current_gen and _owners(d) == _owners(by_name[d.metadata.name])
            for d in same):
        return Plan()
    desired = desired_slices(clique, channels, current_gen + 1, owner)
    out = Plan()
    for d in desired:
        assert d.metadata is not None and d.metadata.name is not None
        live = by_name.get(d.metadata.name)
        if live is None:
            out.create.append(d)
        else:
            assert live.metadata is not None
            d.metadata.resourceVersion = live.metadata.resourceVersion
            out.update.append(d)
    wanted = {d.metadata.name for d in desired if d.metadata}
    out.delete = sorted(n for n in by_name if n not in wanted)
    return out


def existing_slices(client: Client, clique: str) -> list[ResourceSlice]:
    return list(client.list(ResourceSlice, labels={POOL_LABEL: pool_name(clique)}))


def apply(client: Client, clique: str, channels: int, owner: Owner | None = None, *,
          existing: Sequence[ResourceSlice] | None = None) -> Plan:
    """Reconcile one clique's pool against its `existing` slices (listed now when not given);
    returns what was done."""
    p = plan(clique, channels, existing_slices(client, clique) if existing is None else existing, owner)
    for s in p.create:
        client.create(s)
    for s in p.update:
        client.replace(s)
    for name in p.delete:
        client.delete(ResourceSlice, name)
    return p


def withdraw(client: Client, clique: str) -> None:
    """Remove a clique's pool (its last node left, or the driver is uninstalled)."""
    for s in existing_slices(client, clique):
        assert s.metadata is not None and s.metadata.name is not None
        client.delete(ResourceSlice, s.metadata.name)
