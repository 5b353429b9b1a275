"""The ComputeDomain backends' requests to the API server, over lightkube, as plain dicts.

- `send`: a create or patch with strict field validation (`fieldValidation=Strict`), so an
  unknown or duplicate field is an error rather than silently dropped;
- `get` (None when the object does not exist), `read_crd` (also whether it could be read at
  all), `delete` (in the background; already gone is fine);
- `roll_back`: delete what a failed create made, and say so on its error.

Every request runs under `nvlfabric.kube.errors.api_call`, so lightkube's errors arrive as ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import Client
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import CascadeType

from nvlfabric.api import errors as api_errors
from nvlfabric.kube import errors as kube_errors

Created = list[tuple[str, Any, str]]
"""What a create made so far, oldest first: (kind, lightkube resource, name), for `roll_back`."""


def send(client: Client, method: str, res: Any, obj: Any, *, namespace: str, name: str | None = None,
         headers: dict[str, str] | None = None) -> Any:
    """A create (`post`) or patch with `fieldValidation=Strict`."""
    # lightkube 1.0.1's `create`/`patch` take no `fieldValidation` parameter and its public API has
    # no way to add a query parameter; its request layer (`Client._client.request`, what `create`
    # and `patch` call) takes any. This is the one use of that private attribute (pinned lightkube;
    # a test proves that an unknown field is rejected by the server).
    return client._client.request(method, res=res, obj=obj, name=name, namespace=namespace, headers=headers,
                                  params={"fieldValidation": "Strict"})


def get(client: Client, res: Any, name: str, namespace: str | None) -> dict[str, Any] | None:
    """The object as a plain dict, or None when it does not exist."""
    kind = getattr(res, "__name__", "object")
    where = f"{namespace}/{name}" if namespace else name
    try:
        with kube_errors.api_call(f"read {kind} {where}"):
            obj = client.get(res, name, namespace=namespace) if namespace else client.get(res, name)
    except api_errors.NotFound:
        return None
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def read_crd(client: Client, name: str) -> tuple[dict[str, Any] | None, bool]:
    """(the CRD or None, whether it could be read): without RBAC on CRDs an await does not judge it."""
    try:
        return get(client, CustomResourceDefinition, name, None), True
    except api_errors.Forbidden:
        return None, False


def delete(client: Client, res: Any, name: str, namespace: str, *, action: str) -> None:
    """Delete in the background (dependents by the garbage collector); already gone is fine."""
    try:
        with kube_errors.api_call(action):
            client.delete(res, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
    except api_errors.NotFound:
        pass


def roll_back(client: Client, ns: str, created: Created, exc: Exception) -> None:
    """Delete what a create made (newest first), and say so on `exc`."""
    for kind, res, name in reversed(created):
        try:
            delete(client, res, name, ns, action=f"roll back: delete {kind} {ns}/{name}")
        except api_errors.NvlfabricError as failed:
            exc.add_note(f"could not roll back: {kind} {ns}/{name} is left behind ({failed}); delete it with "
                         f"kubectl delete {kind.lower()} -n {ns} {name}")
        else:
            exc.add_note(f"rolled back: deleted {kind} {ns}/{name}")


def meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """An object's metadata ({} for none)."""
    return (obj or {}).get("metadata") or {}
