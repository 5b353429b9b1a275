"""The per-namespace channel quota: a ResourceQuota `nvlfabric-imex-channels` in every namespace
that holds a ComputeDomain, bounding the devices of nvlfabric's DeviceClass its claims may hold.

Why a ResourceQuota, kept by the controller: the API server's quota admission counts a claim's
devices as it is created, before the scheduler can allocate anything, and refuses the claim past
the bound with the namespace and the numbers ("exceeded quota: nvlfabric-imex-channels"); an
admission policy sees one object and cannot count. The bound is the driver's setting
(`NvlfabricDriver(channel_quota_per_namespace=...)`, `CHANNEL_QUOTA_PER_NAMESPACE`), or the
namespace's annotation `nvlfabric.io/channel-quota` (a tenant with `edit` cannot change its
Namespace; a platform raises one team's bound there). 0, in either place, turns the quota off:
the controller's own ResourceQuota is deleted (a platform's own quotas are never touched). The
quota is written once a namespace's first domain is seen, so claims created before it (a burst in
the first second of a new namespace) are counted but not refused; the domains it then blocks fail
visibly (the provider's `up` fails with the API server's message and deletes its half-made domain).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from lightkube import Client
from lightkube.resources.core_v1 import Namespace, ResourceQuota
from lightkube.types import PatchType

from nvlfabric.api import errors, names
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.controller.quota")

RECHECK_S = 10.0
"""How often a namespace's annotation is read again (a platform's raise takes effect within this)."""


def bound_of(default: int, annotation: str | None) -> tuple[int, str]:
    """The namespace's channel quota and where it comes from (pure): its annotation when that is a
    whole number in range, else the driver's default, saying why the annotation was not taken."""
    if annotation is None:
        return default, "the driver's channel_quota_per_namespace"
    try:
        value = int(annotation.strip(), 10)
    except ValueError:
        value = -1
    if 0 <= value <= names.MAX_CHANNEL_QUOTA_PER_NAMESPACE:
        return value, f"the namespace's annotation {names.CHANNEL_QUOTA_ANNOTATION}"
    return default, (f"the driver's channel_quota_per_namespace: the namespace's annotation "
                     f"{names.CHANNEL_QUOTA_ANNOTATION}={annotation!r} is not a whole number "
                     f"0..{names.MAX_CHANNEL_QUOTA_PER_NAMESPACE}")


def manifest(namespace: str, bound: int, source: str) -> dict[str, object]:
    """The ResourceQuota as the controller applies it (pure)."""
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": names.CHANNEL_QUOTA_NAME, "namespace": namespace,
                         "labels": {names.PART_OF_LABEL: names.PART_OF},
                         "annotations": {names.CHANNEL_QUOTA_ANNOTATION + "-source": source}},
            "spec": {"hard": {names.CHANNEL_QUOTA_RESOURCE: str(bound)}}}


class Quotas:
    """Keeps each namespace's quota at its bound; reads a namespace at most every RECHECK_S."""

    def __init__(self, client: Client, default: int) -> None:
        self.client, self.default = client, default
        self._kept: dict[str, tuple[float, int, str]] = {}
        """Namespace → when it was last read, and the bound and source written."""

    def keep(self, namespaces: Iterable[str]) -> None:
        now = time.monotonic()
        wanted = set(namespaces)
        for gone in self._kept.keys() - wanted:
            del self._kept[gone]
        for ns in sorted(wanted):
            last = self._kept.get(ns)
            if last is not None and now - last[0] < RECHECK_S:
                continue
            try:
                self._keep_one(ns, last)
            except errors.NvlfabricError as exc:
                log.warning("channel quota of namespace %s: %s", ns, exc)

    def _keep_one(self, ns: str, last: tuple[float, int, str] | None) -> None:
        with api_call(f"read Namespace {ns}"):
            obj = self.client.get(Namespace, ns)
        annotations = (obj.metadata.annotations if obj.metadata else None) or {}
        bound, source = bound_of(self.default, annotations.get(names.CHANNEL_QUOTA_ANNOTATION))
        if last is not None and (last[1], last[2]) == (bound, source):
            self._kept[ns] = (time.monotonic(), bound, source)
            return
        if bound == 0:  # off: the quota this wrote before goes (a platform's own quotas are not ours)
            try:
                with api_call(f"delete ResourceQuota {ns}/{names.CHANNEL_QUOTA_NAME}"):
                    self.client.delete(ResourceQuota, names.CHANNEL_QUOTA_NAME, namespace=ns)
            except errors.NotFound:
                pass
            self._kept[ns] = (time.monotonic(), bound, source)
            return
        with api_call(f"apply ResourceQuota {ns}/{names.CHANNEL_QUOTA_NAME}"):
            self.client.patch(ResourceQuota, names.CHANNEL_QUOTA_NAME, manifest(ns, bound, source), namespace=ns,
                              patch_type=PatchType.APPLY, field_manager=names.CONTROLLER_FIELD_MANAGER, force=True)
        self._kept[ns] = (time.monotonic(), bound, source)
        log.info("namespace %s: at most %d IMEX channels (ResourceQuota %s, from %s)", ns, bound,
                 names.CHANNEL_QUOTA_NAME, source)
