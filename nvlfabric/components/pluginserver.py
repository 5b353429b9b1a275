"""nvlfabric's components as a Pulumi component provider, for programs in any Pulumi language.

`nvlfabric/components/plugin/` is the plugin directory a consumer adds with `pulumi package add` (a copy
anywhere, written by `python -m nvlfabric.components.plugin_dir DIR`, in a virtualenv of its own that
the engine creates); it runs `main()`, which serves:

- **GetSchema**: `nvlfabric.components.schema.package_schema()`, derived from the pydantic args models;
- **Construct**: the very component classes a Python program uses. Inputs arrive under their
  schema (camelCase) names and are mapped back to the constructor's parameters, so validation is
  the same pydantic model with the same messages; a bad argument fails `pulumi preview` as an
  input-property error naming the property as the consumer wrote it (`gpusPerPod`) and the fix.

Arguments are validated when the program runs, so they must be known then: literals and config
values are; another resource's output is not and is refused, naming the property (the one
exception is `BoundJob.computeDomain`, a reference to a ComputeDomain of the same program).

A `BoundJob` needs its ComputeDomain as the live Python object (its claim, namespace, pod count).
The engine runs one provider process per deployment, which constructed that ComputeDomain too: a
reference to it is resolved from that process's own record of the ComputeDomains it built.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

import grpc
import pulumi
import pulumi.provider as pprov
from pulumi.errors import InputPropertiesError, InputPropertyErrorDetails
from pulumi.resource import DependencyResource
from pulumi.runtime._grpc_settings import _GRPC_CHANNEL_OPTIONS
from pulumi.runtime.proto import provider_pb2_grpc
from pulumi.runtime.rpc import ResourceModule, register_resource_module
from pydantic.alias_generators import to_camel

from nvlfabric.components import served
from nvlfabric.components.args import ComponentArgsError
from nvlfabric.components.computedomain import ComputeDomain
from nvlfabric.components.schema import BY_TOKEN, MODULE, PACKAGE, Exposed, package_schema, token, version

#: ComputeDomains this process constructed, by URN, for `BoundJob.computeDomain` references.
_DOMAINS: dict[str, ComputeDomain] = {}


class _References(ResourceModule):
    """Deserializes references to `nvlfabric:index:*` resources into this process's objects."""

    def version(self) -> None:
        return None

    def construct(self, name: str, typ: str, urn: str) -> pulumi.Resource:
        return _DOMAINS.get(urn) or DependencyResource(urn)


def _camel_path(exposed: Exposed, loc: tuple[int | str, ...]) -> str:
    """A pydantic error location with the first part under its schema (camelCase) name."""
    if not loc:  # the arguments as a whole (a path the engine finds no value at, so shows none)
        return "(arguments)"
    by_param = {p: camel for camel, p in exposed.inputs.items()}
    out = by_param.get(str(loc[0]), str(loc[0]))
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _plain(value: Any) -> Any:
    """A known, plain input value; integral floats (all numbers cross the wire as floats) as ints."""
    if isinstance(value, pulumi.Output):
        raise TypeError("an output of another resource")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class NvlfabricProvider(pprov.Provider):
    """Serves the `nvlfabric` package: its schema, and Construct for each component."""

    def __init__(self) -> None:
        super().__init__(version(), json.dumps(package_schema()))

    def construct(self, name: str, resource_type: str, inputs: pulumi.Inputs,
                  options: pulumi.ResourceOptions | None = None) -> pprov.ConstructResult:
        exposed = BY_TOKEN.get(resource_type)
        if exposed is None:
            raise pulumi.RunError(f"unknown resource type {resource_type}; this package has {', '.join(BY_TOKEN)}")
        kwargs, problems = self._arguments(exposed, dict(inputs))
        if problems:
            raise InputPropertiesError("invalid arguments", problems)
        try:
            component = exposed.cls(name, **kwargs, opts=options)
        except ComponentArgsError as exc:  # the engine shows each problem under its input's schema name
            found = exc.problems or [((), str(exc))]
            raise InputPropertiesError("invalid arguments", [
                {"property_path": _camel_path(exposed, loc), "reason": text} for loc, text in found]) from None
        if isinstance(component, ComputeDomain):
            component.urn.apply(lambda urn: _DOMAINS.__setitem__(urn, component))
        state = {to_camel(attr): getattr(component, attr) for attr in exposed.outputs}
        return pprov.ConstructResult(urn=component.urn, state=state)

    @staticmethod
    def _arguments(exposed: Exposed, inputs: dict[str, Any]) -> tuple[dict[str, Any],
                                                                      list[InputPropertyErrorDetails]]:
        kwargs: dict[str, Any] = {}
        problems: list[InputPropertyErrorDetails] = []
        for key, value in inputs.items():
            param = exposed.inputs.get(key)
            if param is None:
                problems.append({"property_path": key, "reason": "unknown argument; valid ones are "
                                 + ", ".join(exposed.inputs)})
                continue
            wanted = exposed.param_types.get(param)
            if isinstance(wanted, type) and issubclass(wanted, pulumi.ComponentResource):  # a reference
                if not isinstance(value, wanted):
                    problems.append({"property_path": key, "reason": f"expected an {token(wanted.__name__)} "
                                     f"declared in the same program (got {type(value).__name__})"})
                kwargs[param] = value
                continue
            try:
                kwargs[param] = _plain(value)
            except TypeError as exc:
                problems.append({"property_path": key, "reason": f"must be known when the program runs (a literal "
                                 f"or a config value), not {exc}"})
        return kwargs, problems


def main() -> None:
    """The plugin's entry point: a gRPC server on a free loopback port, the port on stdout (the
    engine's handshake, as `pulumi.provider.main` does), serving Construct and the objects of
    `nvlfabric.components.served`."""
    register_resource_module(PACKAGE, MODULE, _References())
    served.serve_resources()
    argp = argparse.ArgumentParser(description="nvlfabric component provider (a Pulumi plugin)")
    argp.add_argument("engine", help="the Pulumi engine's address")
    known, _ = argp.parse_known_args()

    async def serve() -> None:
        server = grpc.aio.server(options=_GRPC_CHANNEL_OPTIONS)
        servicer = served.ResourceServicer(NvlfabricProvider(), sys.argv[1:], engine_address=known.engine)
        provider_pb2_grpc.add_ResourceProviderServicer_to_server(servicer, server)
        port = server.add_insecure_port(address="127.0.0.1:0")
        await server.start()
        sys.stdout.buffer.write(f"{port}\n".encode())
        sys.stdout.buffer.flush()
        await server.wait_for_termination()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
