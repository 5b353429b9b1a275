"""The Kubernetes objects nvlfabric's component provider serves itself, for programs in other languages.

In a Python program, a ComputeDomain's object is a dynamic resource (`pulumi-python:dynamic/...`):
the engine runs its CRUD in the program's own Python, which has nvlfabric installed. A YAML or
TypeScript program has no such Python. For its dynamic resources the engine would start `python3`
from PATH (or the project's `runtime.options.virtualenv`), which knows nothing of nvlfabric, and the
preview fails with "No module named 'pulumi'". So when the components run inside the component
provider (`serve_resources()`), a ComputeDomain registers `nvlfabric:kubernetes:ComputeDomain` (and an
Nvl72Rack its node labelling `nvlfabric:kubernetes:RackNodes`, an elastic BoundJob its Job's size
`nvlfabric:kubernetes:JobParallelism`) instead: a custom resource of this
package. The engine sends its check, diff, create, read, update
and delete to the nvlfabric plugin, which runs in its own virtualenv and calls the same
`ComputeDomainProvider` a Python program's dynamic resource does. Only where the code runs changes:
the inputs, the outputs and the behaviour stay the same.
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable
from typing import Any, Final, TypeVar, Unpack

import grpc
import pulumi
from google.protobuf import empty_pb2
from pulumi.dynamic import ConfigureRequest, ResourceProvider
from pulumi.dynamic.config import Config
from pulumi.provider import Provider
from pulumi.provider.server import ProviderServicer
from pulumi.runtime import proto, rpc

from nvlfabric.api import names
from nvlfabric.api.errors import NvlfabricError
from nvlfabric.provider.computedomain import (
    ComputeDomainOutputs,
    ComputeDomainProvider,
    ResourceInputs,
    resource_inputs,
)
from nvlfabric.provider.jobparallelism import JobParallelismArgs, JobParallelismProvider
from nvlfabric.provider.racknodes import RackNodesArgs, RackNodesProvider

COMPUTE_DOMAIN: Final = "nvlfabric:kubernetes:ComputeDomain"
"""The type token of a ComputeDomain's object when the component provider serves it."""
RACK_NODES: Final = names.RACK_NODES_TYPES[1]
"""... and of an Nvl72Rack's node labelling."""
JOB_PARALLELISM: Final = names.JOB_PARALLELISM_TYPES[1]
"""... and of an elastic BoundJob's Job size."""
PROVIDERS: Final[dict[str, Callable[[], ResourceProvider]]] = {COMPUTE_DOMAIN: ComputeDomainProvider,
                                                                RACK_NODES: RackNodesProvider,
                                                                JOB_PARALLELISM: JobParallelismProvider}

_serving: list[bool] = []
T = TypeVar("T")


def serve_resources() -> None:
    """From now on, components in this process register the objects this package serves (the
    component provider calls this once at start)."""
    _serving.append(True)


def serving() -> bool:
    return bool(_serving)


class ComputeDomain(pulumi.CustomResource, ComputeDomainOutputs):
    """A ComputeDomain and its channel claim, served by nvlfabric's component provider."""

    def __init__(self, resource_name: str, opts: pulumi.ResourceOptions | None = None,
                 **inputs: Unpack[ResourceInputs]) -> None:
        super().__init__(COMPUTE_DOMAIN, resource_name, resource_inputs(**inputs), opts)


class RackNodes(pulumi.CustomResource):
    """An Nvl72Rack's labels and taints on its Nodes, served by nvlfabric's component provider."""

    def __init__(self, resource_name: str, args: RackNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(RACK_NODES, resource_name, args.model_dump() | {"missing": None, "drift": None}, opts)


class JobParallelism(pulumi.CustomResource):
    """An elastic BoundJob's Job size, served by nvlfabric's component provider."""

    def __init__(self, resource_name: str, args: JobParallelismArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(JOB_PARALLELISM, resource_name, args.model_dump(), opts)


def type_of(urn: str) -> str:
    """`urn:pulumi:stack::project::parent$type::name` → `type`."""
    parts = urn.split("::")
    return parts[2].split("$")[-1] if len(parts) >= 4 else ""


class ResourceServicer(ProviderServicer):
    """The component provider's gRPC service plus CRUD for the types in `PROVIDERS`, delegated to
    their `pulumi.dynamic.ResourceProvider`s exactly as the dynamic provider host does."""

    def __init__(self, provider: Provider, args: list[str], engine_address: str) -> None:
        super().__init__(provider, args, engine_address)
        self._providers: dict[str, ResourceProvider] = {}
        self._config: dict[str, Any] = {}

    def _provider(self, urn: str) -> ResourceProvider:
        kind = type_of(urn)
        if kind not in PROVIDERS:
            raise NvlfabricError(f"{urn}: this package serves no resource of type {kind!r} "
                                 f"(only {', '.join(PROVIDERS)})")
        if kind not in self._providers:
            served = PROVIDERS[kind]()
            served.configure(ConfigureRequest(Config(raw_config=self._config,
                                                     project_name=os.environ.get("PULUMI_PROJECT", ""))))
            self._providers[kind] = served
        return self._providers[kind]

    async def _run(self, context: Any, call: Callable[[], T]) -> T:
        """`call` (blocking: it talks to the API server) on a worker thread; its failure becomes the
        gRPC error the engine prints: our own errors by their message, anything else with its traceback."""
        try:
            return await asyncio.to_thread(call)
        except NvlfabricError as exc:
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        except Exception:  # a bug: show where
            await context.abort(grpc.StatusCode.UNKNOWN, traceback.format_exc())
        raise AssertionError("unreachable: context.abort raises")

    async def Configure(self, request: Any, context: Any) -> Any:
        # This package's config (`nvlfabric:kubeconfig`) as the ComputeDomainProvider reads it.
        args = rpc.deserialize_properties(request.args)
        self._config = {f"nvlfabric:{k}": rpc.unwrap_rpc_secret(v) for k, v in args.items()}
        return await super().Configure(request, context)

    async def CheckConfig(self, request: Any, context: Any) -> Any:
        return proto.CheckResponse(inputs=request.news)

    async def DiffConfig(self, request: Any, context: Any) -> Any:
        return proto.DiffResponse(changes=proto.DiffResponse.DIFF_NONE)

    async def Check(self, request: Any, context: Any) -> Any:
        olds = rpc.deserialize_properties(request.olds, True)
        news = rpc.deserialize_properties(request.news, True)
        served = self._provider(request.urn)
        result = await self._run(context, lambda: served.check(olds, news))
        return proto.CheckResponse(
            inputs=await rpc.serialize_properties(result.inputs, {}),
            failures=[proto.CheckFailure(property=f.property, reason=f.reason) for f in result.failures])

    async def Diff(self, request: Any, context: Any) -> Any:
        olds = rpc.deserialize_properties(request.olds, True)
        news = rpc.deserialize_properties(request.news, True)
        served = self._provider(request.urn)
        result = await self._run(context, lambda: served.diff(request.id, olds, news))
        changes = (proto.DiffResponse.DIFF_UNKNOWN if result.changes is None
                   else proto.DiffResponse.DIFF_SOME if result.changes else proto.DiffResponse.DIFF_NONE)
        return proto.DiffResponse(changes=changes, replaces=result.replaces or [],
                                  deleteBeforeReplace=bool(result.delete_before_replace))

    async def Create(self, request: Any, context: Any) -> Any:
        props = rpc.deserialize_properties(request.properties)
        served = self._provider(request.urn)
        result = await self._run(context, lambda: served.create(props))
        return proto.CreateResponse(id=result.id, properties=await rpc.serialize_properties(result.outs or {}, {}))

    async def Read(self, request: Any, context: Any) -> Any:
        props = rpc.deserialize_properties(request.properties)
        served = self._provider(request.urn)
        result = await self._run(context, lambda: served.read(request.id, props))
        fields: dict[str, Any] = {"id": result.id or "",
                                  "properties": await rpc.serialize_properties(result.outs or {}, {})}
        if result.inputs is not None:  # refreshed inputs, so later diffs compare with what is live
            fields["inputs"] = await rpc.serialize_properties(result.inputs, {})
        return proto.ReadResponse(**fields)

    async def Update(self, request: Any, context: Any) -> Any:
        olds = rpc.deserialize_properties(request.olds)
        news = rpc.deserialize_properties(request.news)
        served = self._provider(request.urn)
        result = await self._run(context, lambda: served.update(request.id, olds, news))
        return proto.UpdateResponse(properties=await rpc.serialize_properties(result.outs or {}, {}))

    async def Delete(self, request: Any, context: Any) -> Any:
        props = rpc.deserialize_properties(request.properties)
        served = self._provider(request.urn)
        await self._run(context, lambda: served.delete(request.id, props))
        return empty_pb2.Empty()
