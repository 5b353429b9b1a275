"""A dynamic provider for DRA DeviceClasses (`resource.k8s.io/v1`).

pulumi-kubernetes 4.25 has no typed `resource.k8s.io/v1` classes, and DeviceClasses are what a
driver install publishes first, so this is the first resource our provider room manages. It is
also the smallest complete example of the provider contract the ComputeDomain provider follows:

- `check` validates with the pydantic model and names the property and the fix;
- `diff` reports only real changes (spec is mutable, so never a replace);
- `create` refuses to take over an existing object unless `adopt` is set;
- `read` returns the live state so `pulumi refresh` shows drift, and "gone" when deleted;
- `delete` tolerates an object that is already gone.
"""

from __future__ import annotations

import contextlib
from typing import Any

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.resource_v1 import DeviceClass as K8sDeviceClass
from pulumi import ResourceOptions
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    UpdateResult,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api import errors as api_errors
from nvlfabric.api.names import DNS_SUBDOMAIN, DNS_SUBDOMAIN_MAX
from nvlfabric.kube.errors import api_call
from nvlfabric.provider import errors, host, kube


class DeviceClassArgs(BaseModel):
    """Inputs of a DeviceClass resource."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=DNS_SUBDOMAIN_MAX,
                      description="object name: a DNS subdomain (lowercase letters, digits, '-', '.')")
    selectors: list[str] = Field(default_factory=list,
                                 description="CEL expressions a device must satisfy, e.g. "
                                             "device.driver == \"channel.nvlfabric.io\"")
    labels: dict[str, str] = Field(default_factory=dict)
    adopt: bool = Field(default=False, description="take over an existing DeviceClass of this name")


MANAGED_KEYS = ("selectors", "labels")


def check_failures(news: dict[str, Any]) -> list[CheckFailure]:
    inputs = {k: v for k, v in news.items() if not k.startswith("__")}
    try:
        DeviceClassArgs.model_validate(inputs)
    except ValidationError as exc:
        return [
            CheckFailure(".".join(str(p) for p in err["loc"]) or "(inputs)", _fix(err))
            for err in exc.errors()
        ]
    return []


def _fix(err: Any) -> str:
    loc = err["loc"][0] if err["loc"] else ""
    if loc == "name":
        return f"{err['msg']}: use a DNS subdomain such as 'channel.nvlfabric.io'"
    if err["type"] == "extra_forbidden":
        return f"unknown property; allowed: {', '.join(DeviceClassArgs.model_fields)}"
    return str(err["msg"])


def _to_k8s(args: DeviceClassArgs) -> K8sDeviceClass:
    return K8sDeviceClass(
        metadata=ObjectMeta(name=args.name, labels=args.labels or None),
        spec=DeviceClassSpec(selectors=[DeviceSelector(cel=CELDeviceSelector(expression=e))
                                        for e in args.selectors] or None),
    )


def _outputs(obj: K8sDeviceClass, *, adopt: bool) -> dict[str, Any]:
    meta, spec = obj.metadata, obj.spec
    return {
        "name": meta.name if meta else "",
        "selectors": [s.cel.expression for s in ((spec.selectors if spec else None) or []) if s.cel],
        "labels": dict(meta.labels or {}) if meta else {},
        "adopt": adopt,
        "uid": meta.uid if meta else "",
    }


host.install()  # in the dynamic provider host: our errors as their message, no traceback


class DeviceClassProvider(kube.KubeProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, check_failures(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        if olds.get("name") != news.get("name"):
            return DiffResult(changes=True, replaces=["name"], delete_before_replace=True)
        changed = any(olds.get(k) != news.get(k, [] if k == "selectors" else {}) for k in MANAGED_KEYS)
        return DiffResult(changes=changed or bool(olds.get("adopt")) != bool(news.get("adopt")))

    def create(self, props: dict[str, Any]) -> CreateResult:
        args = DeviceClassArgs.model_validate({k: v for k, v in props.items() if not k.startswith("__")})
        client = self._client()
        try:
            with api_call(f"create DeviceClass {args.name}"):
                obj = client.create(_to_k8s(args))
        except api_errors.AlreadyExists:
            if not args.adopt:
                raise errors.ObjectExists(
                    f"DeviceClass {args.name} already exists; import it by setting adopt=True, "
                    f"delete it (kubectl delete deviceclass {args.name}), or choose another name"
                ) from None
            with api_call(f"adopt DeviceClass {args.name}"):
                obj = client.replace(_with_version(client, args))
        return CreateResult(args.name, _outputs(obj, adopt=args.adopt))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        try:
            with api_call(f"read DeviceClass {id_}"):
                obj = self._client().get(K8sDeviceClass, id_)
        except api_errors.NotFound:
            return ReadResult(None, {})
        outs = _outputs(obj, adopt=bool(props.get("adopt")))
        inputs = {k: outs[k] for k in ("name", *MANAGED_KEYS)} | {"adopt": outs["adopt"]}
        return ReadResult(id_, outs, inputs)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        args = DeviceClassArgs.model_validate({k: v for k, v in news.items() if not k.startswith("__")})
        client = self._client()
        with api_call(f"update DeviceClass {args.name}"):
            return UpdateResult(_outputs(client.replace(_with_version(client, args)), adopt=args.adopt))

    def delete(self, id_: str, _props: dict[str, Any]) -> None:
        with contextlib.suppress(api_errors.NotFound), api_call(f"delete DeviceClass {id_}"):
            self._client().delete(K8sDeviceClass, id_)


def _with_version(client: Any, args: DeviceClassArgs) -> K8sDeviceClass:
    """The desired object carrying the live resourceVersion, for an optimistic-concurrency replace."""
    live = client.get(K8sDeviceClass, args.name)
    desired = _to_k8s(args)
    assert desired.metadata is not None and live.metadata is not None
    desired.metadata.resourceVersion = live.metadata.resourceVersion
    return desired


class DeviceClass(Resource, module="nvlfabric", name="DeviceClass"):
    """A `resource.k8s.io/v1` DeviceClass managed by nvlfabric's dynamic provider."""

    uid: Any
    selectors: Any

    def __init__(self, resource_name: str, args: DeviceClassArgs, opts: ResourceOptions | None = None) -> None:
        props = args.model_dump() | {"uid": None}
        super().__init__(DeviceClassProvider(), resource_name, props, opts)
