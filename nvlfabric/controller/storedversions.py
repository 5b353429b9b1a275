"""Move every stored ComputeDomain to the CRD's storage version, then let the API server forget the
older ones (docs/compatibility.md, "API versions", step 2).

A CRD's `status.storedVersions` lists every version an object may still be stored in; a version may
leave `spec.versions` only once it has left that list, and the API server takes it out only when
told. So a release that switches the storage version first rewrites each object (an update that
changes nothing is still written again, encoded in the storage version: the stored bytes differ in
their apiVersion) and then sets `storedVersions` to the storage version alone. An object deleted
meanwhile needs nothing; one changed meanwhile was written by that change, in the storage version.

Idempotent: a CRD that stores one version already costs one GET.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from nvlfabric.api import names
from nvlfabric.api.computedomain import CRD_NAME, KIND, PLURAL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migrated:
    storage: str
    """The storage version every object is now stored in."""
    rewritten: int
    """How many objects were written again (0 when there was nothing to move)."""
    forgotten: tuple[str, ...]
    """The versions taken out of `status.storedVersions`."""


def migrate(client: Client, crd_name: str = CRD_NAME) -> Migrated:
    crd = client.get(CustomResourceDefinition, crd_name)
    assert crd.spec is not None
    storage = next(v.name for v in crd.spec.versions if v.storage)
    stored = list((crd.status.storedVersions if crd.status else None) or [])
    older = tuple(v for v in stored if v != storage)
    if not older:
        return Migrated(storage, 0, ())
    resource = create_namespaced_resource(names.GROUP, storage, KIND, PLURAL)
    rewritten = 0
    for obj in client.list(resource, namespace="*"):
        if _rewrite(client, obj):
            rewritten += 1
    client.patch(CustomResourceDefinition.Status, crd_name, {"status": {"storedVersions": [storage]}},
                 patch_type=PatchType.MERGE)
    log.info("ComputeDomains stored as %s: %d rewritten, %s forgotten", storage, rewritten, ", ".join(older))
    return Migrated(storage, rewritten, older)


def _rewrite(client: Client, obj: Any) -> bool:
    """Write one listed object again as it is; False when it is gone (nothing of it is stored any
    more). A conflict means another writer stored it since the list: in the storage version, so done."""
    try:
        client.replace(obj)
    except ApiError as exc:
        if exc.status.code == 404:
            return False
        if exc.status.code != 409:
            raise
    return True
