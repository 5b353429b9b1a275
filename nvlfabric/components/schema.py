"""The `nvlfabric` Pulumi package schema, derived from the components' pydantic models.

Other Pulumi languages use the components through a component provider (`nvlfabric.components.pluginserver`),
which serves this schema. It repeats nothing the models say; per component it comes from:

- **inputs**: the pydantic args model (`ComputeDomainArgs`, ...), through pydantic's own JSON
  schema: a field's type, description and (primitive) default. Names are camelCase (the field's
  alias if it has one, else `to_camel(name)`); nested models (`ComputeDomainSpec`, `Placement`)
  and enums (`AwaitFor`, `IMEXMode`) become the package's `types`, under their API (alias) names.
  An input is required when the constructor has no default for it: `name`, required by the
  model, is optional here as in Python (left out, it is the resource name). Constructor
  parameters that are not model fields (`BoundJob(compute_domain=...)`) are inputs too: one typed
  with another component is a reference to that component's resource;
- **outputs**: the component class's annotations (`claim_name: pulumi.Output[str]`, `name: str`),
  their types run through pydantic's `TypeAdapter` and the same translation;
- the descriptions of resources and types: the classes' docstrings. Only two texts are this
  module's own: that a left-out `name` is the resource name, and the description of
  `BoundJob.computeDomain` (a constructor parameter, in no model).

Limits, patterns and cross-field rules have no place in a Pulumi schema: they stay in the models,
which the provider validates every Construct with, so a consumer in any language gets the same
checks and messages as a Python program (see `nvlfabric.components.pluginserver`).

`python -m nvlfabric.components.schema` prints the schema.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import typing
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

import pulumi
from pydantic import BaseModel, TypeAdapter
from pydantic.alias_generators import to_camel

from nvlfabric.api.release import __version__
from nvlfabric.components.computedomain import ComputeDomain, ComputeDomainArgs
from nvlfabric.components.driver import NvlfabricDriver, NvlfabricDriverArgs
from nvlfabric.components.rack import Nvl72Rack, Nvl72RackArgs
from nvlfabric.components.workload import BoundJob, BoundJobArgs

PACKAGE: Final = "nvlfabric"
MODULE: Final = "index"
ANY: Final = {"$ref": "pulumi.json#/Any"}
_PRIMITIVES: Final = {"string", "integer", "number", "boolean"}
_SKIPPED_PARAMS: Final = {"self", "resource_name", "opts", "return"}
#: What a component does with a model-required argument the consumer leaves out (constructor default).
_DERIVED: Final = {"name": "Defaults to the resource's name."}
#: Descriptions of constructor parameters that are not model fields.
_PARAM_DESCRIPTIONS: Final = {
    "compute_domain": "the ComputeDomain (a resource of this program) whose IMEX channel the Job's pods use; "
                      "its claim, namespace and GPU clique bind the pods",
}


class SchemaError(ValueError):
    """A model uses a type this translation has no Pulumi schema equivalent for."""


def token(name: str) -> str:
    return f"{PACKAGE}:{MODULE}:{name}"


def version() -> str:
    """This release as Pulumi writes versions (semver): the package schema's and the provider
    plugin's version. `nvlfabric.__version__` is PEP 440; the forms a release takes (X.Y.Z, and
    X.Y.Z.devN or X.Y.ZrcN between releases) map one to one."""
    return semver(__version__)


def semver(pep440: str) -> str:
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(?:\.dev(\d+)|rc(\d+))?", pep440)
    if match is None:
        raise ValueError(f"version {pep440!r} is not X.Y.Z, X.Y.Z.devN or X.Y.ZrcN (docs/compatibility.md)")
    release, dev, rc = match.groups()
    return f"{release}-dev.{dev}" if dev is not None else f"{release}-rc.{rc}" if rc is not None else release


@dataclass(frozen=True)
class Exposed:
    """One component served by the provider: its class and the pydantic model of its arguments."""

    cls: type[pulumi.ComponentResource]
    args: type[BaseModel]

    @property
    def token(self) -> str:
        return token(self.cls.__name__)

    @cached_property
    def params(self) -> dict[str, inspect.Parameter]:
        """The constructor's keyword parameters other than resource_name and opts."""
        sig = inspect.signature(self.cls.__init__)
        # (`**unknown` only carries a mistyped keyword into validation, which names it)
        return {n: p for n, p in sig.parameters.items()
                if n not in _SKIPPED_PARAMS and p.kind is not inspect.Parameter.VAR_KEYWORD}

    @cached_property
    def param_types(self) -> dict[str, Any]:
        return typing.get_type_hints(self.cls.__init__)

    @cached_property
    def inputs(self) -> dict[str, str]:
        """Schema (camelCase) input name → constructor parameter name."""
        out = {}
        for name in self.params:
            f = self.args.model_fields.get(name)
            out[(f.alias if f is not None and f.alias else None) or to_camel(name)] = name
        return out

    @cached_property
    def outputs(self) -> dict[str, Any]:
        """The component's declared outputs: attribute name → value type (`Output[T]` unwrapped)."""
        hints = inspect.get_annotations(self.cls, eval_str=True)  # the class's own, not pulumi.Resource's
        return {n: _unwrap_output(t) for n, t in hints.items() if not n.startswith("_")}


def _unwrap_output(typ: Any) -> Any:
    origin: Any = typing.get_origin(typ)
    return typing.get_args(typ)[0] if origin is pulumi.Output else typ


COMPONENTS: Final = (
    Exposed(NvlfabricDriver, NvlfabricDriverArgs),
    Exposed(Nvl72Rack, Nvl72RackArgs),
    Exposed(ComputeDomain, ComputeDomainArgs),
    Exposed(BoundJob, BoundJobArgs),
)
BY_TOKEN: Final = {c.token: c for c in COMPONENTS}


@dataclass
class _Translator:
    """pydantic JSON schema (draft 2020-12) → Pulumi schema type specs; collects the named types."""

    types: dict[str, dict[str, Any]] = field(default_factory=dict)

    def property(self, node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
        """A Pulumi property spec (type + description + primitive default) for one JSON-schema node."""
        spec = self.type(node, defs, where)
        if node.get("description"):
            spec["description"] = node["description"]
        default = node.get("default")
        if default is not None and spec.get("type") in _PRIMITIVES and not isinstance(default, (dict, list)):
            spec["default"] = default
        return spec

    def type(self, node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
        if "$ref" in node:
            return self.named(node["$ref"].rsplit("/", 1)[-1], defs, where)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) != 1:
                raise SchemaError(f"{where}: a union of {len(options)} types has no Pulumi schema equivalent")
            return self.type(options[0], defs, where)
        kind = node.get("type")
        if kind in _PRIMITIVES:
            return {"type": kind}
        if kind == "array":
            return {"type": "array", "items": self.type(node.get("items", {}), defs, f"{where}[]")}
        if kind == "object":
            if "properties" in node:
                raise SchemaError(f"{where}: an inline object type; declare it as a pydantic model")
            extra = node.get("additionalProperties", True)
            items = ANY if extra is True or extra == {} else self.type(extra, defs, f"{where}{{}}")
            return {"type": "object", "additionalProperties": items}
        if not node:  # typing.Any
            return dict(ANY)
        raise SchemaError(f"{where}: JSON schema {node} has no Pulumi schema equivalent")

    def named(self, name: str, defs: dict[str, Any], where: str) -> dict[str, Any]:
        ref = {"$ref": f"#/types/{token(name)}"}
        if token(name) in self.types:
            return ref
        node = defs[name]
        if "enum" in node:
            kinds = {type(v) for v in node["enum"]}
            if kinds != {str}:
                raise SchemaError(f"{where}: enum {name} must have string values")
            self.types[token(name)] = {"type": "string", "description": node.get("description", ""),
                                       "enum": [{"value": v} for v in node["enum"]]}
            return ref
        self.types[token(name)] = spec = {"type": "object", "description": node.get("description", ""),
                                          "properties": {}}
        for key, child in node.get("properties", {}).items():
            spec["properties"][key] = self.property(child, defs, f"{name}.{key}")
        if node.get("required"):
            spec["required"] = list(node["required"])
        return ref


def _doc(obj: type) -> str:
    return inspect.cleandoc(obj.__doc__ or "")


def resource_spec(exposed: Exposed, tr: _Translator) -> dict[str, Any]:
    model_schema = exposed.args.model_json_schema(by_alias=True)
    defs = model_schema.get("$defs", {})
    model_props = model_schema.get("properties", {})
    inputs: dict[str, Any] = {}
    required = []
    for camel, param in exposed.inputs.items():
        f = exposed.args.model_fields.get(param)
        if f is not None:
            spec = tr.property(model_props[f.alias or param], defs, f"{exposed.cls.__name__}.{camel}")
            has_default = exposed.params[param].default is not inspect.Parameter.empty
            if f.is_required() and has_default and param in _DERIVED:
                spec["description"] = f"{spec.get('description', '')}. {_DERIVED[param]}".lstrip(". ")
        else:  # a constructor parameter outside the model: a component reference, or a plain type
            typ = exposed.param_types[param]
            if isinstance(typ, type) and issubclass(typ, pulumi.ComponentResource):
                spec = {"$ref": f"#/resources/{token(typ.__name__)}"}
            else:
                js = TypeAdapter(typ).json_schema(by_alias=True)
                spec = tr.type(js, js.get("$defs", {}), f"{exposed.cls.__name__}.{camel}")
            if param in _PARAM_DESCRIPTIONS:
                spec["description"] = _PARAM_DESCRIPTIONS[param]
        inputs[camel] = spec
        if exposed.params[param].default is inspect.Parameter.empty:
            required.append(camel)
    outputs: dict[str, Any] = {}
    always = []
    for name, typ in exposed.outputs.items():
        js = TypeAdapter(typ).json_schema(by_alias=True)
        spec = tr.type(js, js.get("$defs", {}), f"{exposed.cls.__name__}.{name} (output)")
        f = exposed.args.model_fields.get(name)
        if f is not None and f.description:
            spec["description"] = f.description
        outputs[to_camel(name)] = spec
        if "anyOf" not in js or not any(o.get("type") == "null" for o in js["anyOf"]):
            always.append(to_camel(name))
    spec = {"isComponent": True, "description": _doc(exposed.cls), "inputProperties": inputs,
            "requiredInputs": required, "properties": outputs, "required": always}
    return {k: v for k, v in spec.items() if v != []}  # (as the CLI writes a schema back: no empty lists)


def package_schema() -> dict[str, Any]:
    """The whole package schema (a dict; `json.dumps` it for GetSchema)."""
    tr = _Translator()
    resources = {c.token: resource_spec(c, tr) for c in COMPONENTS}
    return {
        "name": PACKAGE,
        "displayName": "nvlfabric",
        "version": version(),
        "description": "NVLink ComputeDomains on Kubernetes: the nvlfabric DRA driver, NVL72 racks, "
                       "ComputeDomains and workloads bound to them (components served by a Python provider)",
        "resources": resources,
        "types": dict(sorted(tr.types.items())),
    }


if __name__ == "__main__":
    json.dump(package_schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
