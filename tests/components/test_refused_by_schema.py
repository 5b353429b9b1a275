"""Every argument of every component, given a value it must not take, drawn from the component's own
schema (issue 49, item 4): a boolean, a string or a float for an integer, a string or a non-finite
number for a number, a number for a boolean, a mapping or a list for a scalar, a number out of the
field's bounds, and, where the field is a Kubernetes name, one the API server would refuse
(uppercase, too long, a character no name has). Each is refused by the component's own validation
(`args.validate`, what the constructors call, so what `pulumi preview` runs), naming the component
and the field; never another exception (a traceback) and never taken as something else.

The fields come from each args model's JSON schema (the one the component provider's Pulumi schema
is derived from, schema.py), nested models included (`spec.numNodes`, `taints[0].key`): a field
added to a model is drawn without a change here.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from nvlfabric.api.names import DNS_LABEL, DNS_SUBDOMAIN
from nvlfabric.components.args import ComponentArgsError, validate
from nvlfabric.components.computedomain import ComputeDomainArgs, NvidiaComputeDomainArgs
from nvlfabric.components.driver import NvlfabricDriverArgs
from nvlfabric.components.pluginserver import NvlfabricProvider
from nvlfabric.components.rack import Nvl72RackArgs
from nvlfabric.components.schema import BY_TOKEN
from nvlfabric.components.workload import BoundJobArgs

TEMPLATE = {"spec": {"containers": [{"name": "worker", "image": "registry.invalid/train:1"}]}}

#: Each component's args model, with the smallest arguments it takes (what the bad value goes into).
MODELS: list[tuple[str, type[BaseModel], dict[str, Any]]] = [
    ("NvlfabricDriver", NvlfabricDriverArgs, {}),
    ("Nvl72Rack", Nvl72RackArgs, {"name": "rack-0", "nodes": ["n0"]}),
    ("ComputeDomain", ComputeDomainArgs, {"name": "cd"}),
    ("ComputeDomain", NvidiaComputeDomainArgs, {"name": "cd", "backend": "nvidia"}),
    ("BoundJob", BoundJobArgs, {"name": "job", "pod_template": TEMPLATE}),
]
KEY = "k"  # the key a bad value of a mapping's values goes under


@dataclass(frozen=True)
class Place:
    """One place in a component's arguments a value goes: its path and its JSON schema."""

    component: str
    model: type[BaseModel]
    base: dict[str, Any]
    path: tuple[str | int, ...]
    node: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.model.__name__}.{shown(self.path)}"


def shown(path: tuple[str | int, ...]) -> str:
    """A path as a refusal names it: `spec.placement.cliques`, `nodes[0]`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _resolved(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The node with `$ref` followed and `X | None` made X; None for a union of several types."""
    if "$ref" in node:
        return {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        return _resolved(options[0], defs) if len(options) == 1 else None
    return node


def _walk(node: dict[str, Any], defs: dict[str, Any], path: tuple[str | int, ...]
          ) -> list[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every place under `node` (itself, its properties, its items, its mapping's values) and its schema."""
    resolved = _resolved(node, defs)
    if resolved is None:
        return []
    out = [(path, resolved)]
    if "properties" in resolved:
        for key, child in resolved["properties"].items():
            out += _walk(child, defs, (*path, key))
    elif resolved.get("type") == "array" and resolved.get("items"):
        out += _walk(resolved["items"], defs, (*path, 0))
    elif resolved.get("type") == "object" and isinstance(resolved.get("additionalProperties"), dict):
        out += _walk(resolved["additionalProperties"], defs, (*path, KEY))
    return out


def places() -> list[Place]:
    out = []
    for component, model, base in MODELS:
        schema = model.model_json_schema(by_alias=True)
        for key, child in schema["properties"].items():
            out += [Place(component, model, base, path, node) for path, node in _walk(child, schema.get("$defs", {}),
                                                                                     (key,))]
    return [p for p in out if bad_values(p.node) is not None]


# -- values each kind of field must refuse ---------------------------------------------------------

NON_FINITE = st.sampled_from([math.inf, -math.inf, math.nan])
SHAPES = st.sampled_from([{"a": 1}, [1], ["x"], {}])  # a mapping or a list where a scalar goes
GOOD_NAME = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)


def _bad_names(pattern: str, max_length: int | None) -> st.SearchStrategy[str]:
    """Names Kubernetes refuses: uppercase, a character no name has, an edge that is not
    alphanumeric, empty, longer than allowed (and for a DNS label, a dot)."""
    options = [GOOD_NAME.map(str.upper), GOOD_NAME.map(lambda s: f"{s}_{s}"), GOOD_NAME.map(lambda s: f"{s} x"),
               GOOD_NAME.map(lambda s: f"-{s}"), GOOD_NAME.map(lambda s: f"{s}-"), GOOD_NAME.map(lambda s: f"{s}/x"),
               st.just("")]
    if max_length is not None:
        options.append(st.integers(max_length + 1, max_length + 40).map(lambda n: "a" * n))
    if pattern == DNS_LABEL:
        options.append(GOOD_NAME.map(lambda s: f"{s}.{s}"))
    return st.one_of(options)


def _out_of_bounds(node: dict[str, Any], integer: bool) -> list[st.SearchStrategy[Any]]:
    def num(lo: float | None = None, hi: float | None = None) -> st.SearchStrategy[Any]:
        if integer:
            return st.integers(None if lo is None else math.ceil(lo), None if hi is None else math.floor(hi))
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False)

    out = []
    if "minimum" in node:
        out.append(num(hi=node["minimum"] - 1) if integer else num(hi=node["minimum"]).filter(
            lambda v: v < node["minimum"]))
    if "exclusiveMinimum" in node:
        out.append(num(hi=node["exclusiveMinimum"]))
    if "maximum" in node:
        out.append(num(lo=node["maximum"] + 1) if integer else num(lo=node["maximum"]).filter(
            lambda v: v > node["maximum"]))
    if "exclusiveMaximum" in node:
        out.append(num(lo=node["exclusiveMaximum"]))
    return out


def bad_values(node: dict[str, Any]) -> st.SearchStrategy[Any] | None:
    """What a field of JSON schema `node` must refuse; None for a field that takes anything."""
    kind = node.get("type")
    if "enum" in node:
        return st.one_of(st.text(max_size=12).filter(lambda s: s not in node["enum"]), st.integers(), st.booleans(),
                         SHAPES)
    if kind == "integer":
        return st.one_of(st.booleans(), st.integers(-10**6, 10**6).map(str), st.integers(-10**6, 10**6).map(float),
                         st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
                         NON_FINITE, SHAPES, *_out_of_bounds(node, integer=True))
    if kind == "number":
        return st.one_of(st.booleans(), st.floats(-1e6, 1e6).map(str), NON_FINITE, SHAPES,
                         *_out_of_bounds(node, integer=False))
    if kind == "boolean":
        return st.one_of(st.integers(), st.sampled_from(["true", "false", "yes", "no", "on", "1", "0"]),
                         st.floats(), SHAPES)
    if kind == "string":
        options = [st.integers(), st.booleans(), st.floats(), SHAPES]
        pattern = node.get("pattern")
        if pattern in (DNS_LABEL, DNS_SUBDOMAIN):
            options.append(_bad_names(pattern, node.get("maxLength")))
        elif pattern is not None:
            options.append(st.text(max_size=20).filter(lambda s: re.search(pattern, s) is None))
        if pattern not in (DNS_LABEL, DNS_SUBDOMAIN) and "maxLength" in node:
            options.append(st.integers(node["maxLength"] + 1, node["maxLength"] + 40).map(lambda n: "a" * n))
        return st.one_of(options)
    if kind == "array":
        return st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.just({"a": 1}),
                         *([st.just([])] if node.get("minItems", 0) >= 1 else []))
    if kind == "object":
        return st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.floats(), st.just([1]))
    return None  # typing.Any: anything goes (a pod template's insides are checked by templatechecks.py)


def put(values: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """`values` with `value` at `path` (the mappings and lists on the way made where missing)."""
    out = copy.deepcopy(values)
    here: Any = out
    for part, after in itertools.pairwise(path):
        empty: Any = [] if isinstance(after, int) else {}
        if isinstance(part, int):
            while len(here) <= part:
                here.append(copy.copy(empty))
            if not isinstance(here[part], type(empty)):
                here[part] = empty
        elif not isinstance(here.get(part), type(empty)):
            here[part] = empty
        here = here[part]
    last = path[-1]
    if isinstance(last, int) and len(here) <= last:
        here.append(value)
    else:
        here[last] = value
    return out


PLACES = places()


def test_the_schema_walk_reaches_every_kind_of_field() -> None:
    """The fields issue 49 names are drawn: were the walk to miss nested models, this says so."""
    ids = {f.id for f in PLACES}
    assert {"NvlfabricDriverArgs.channels_per_clique", "NvlfabricDriverArgs.channel_quota_per_namespace",
            "NvlfabricDriverArgs.imex_modes[0]", "NvlfabricDriverArgs.labels.k", "Nvl72RackArgs.nodes[0]",
            "Nvl72RackArgs.taints[0].key", "Nvl72RackArgs.observe", "ComputeDomainArgs.timeout_s",
            "ComputeDomainArgs.spec.numNodes", "ComputeDomainArgs.spec.placement.cliques",
            "ComputeDomainArgs.spec.channelClaim.name", "NvidiaComputeDomainArgs.spec.numNodes",
            "BoundJobArgs.parallelism", "BoundJobArgs.completions", "BoundJobArgs.master_port",
            "BoundJobArgs.queue_name", "BoundJobArgs.wait", "BoundJobArgs.name"} <= ids, sorted(ids)


@pytest.mark.parametrize("field", PLACES, ids=[f.id for f in PLACES])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_value_the_field_must_not_take_is_refused_naming_the_component_and_the_field(
        field: Place, data: st.DataObject) -> None:
    strategy = bad_values(field.node)
    assert strategy is not None
    bad = data.draw(strategy, label="value")
    values = put(field.base, field.path, bad)
    try:
        accepted = validate(field.model, field.component, "fuzz", values)
    except ComponentArgsError as exc:
        first, *lines = str(exc).splitlines()
        assert first == f"{field.component} 'fuzz': invalid arguments", str(exc)
        assert lines and all(line.startswith("  ") for line in lines), str(exc)
        where = shown(field.path)
        named = [ln for ln in lines if ln.startswith(f"  {where}:")]
        assert named, f"no line names {where}:\n{exc}"
        if not isinstance(bad, dict | list) and len(repr(bad)) < 100:  # (a longer one is not repeated)
            assert any(f"(got {bad!r})" in ln for ln in named), str(exc)
        return
    pytest.fail(f"{field.id} = {bad!r} was accepted: {shown(field.path)} became "
                f"{accepted.model_dump(by_alias=True)!r}")


# -- what the component provider passes is still taken ---------------------------------------------

@pytest.mark.parametrize("inputs, param, want", [
    ({"gpusPerPod": 4.0}, "gpus_per_pod", 4),
    ({"parallelism": 2.0}, "parallelism", 2),
    ({"masterPort": 29500.0}, "master_port", 29500),
])
def test_integral_floats_from_the_component_provider_are_still_integers(inputs: dict[str, Any], param: str,
                                                                         want: int) -> None:
    """Every number crosses the provider's wire as a float (a protobuf Struct): 4.0 from a YAML or
    TypeScript program is the 4 its schema's integer says, made an int before validation."""
    kwargs, problems = NvlfabricProvider._arguments(BY_TOKEN["nvlfabric:index:BoundJob"], inputs)
    assert not problems
    args = validate(BoundJobArgs, "BoundJob", "trainer", {"name": "trainer", "pod_template": TEMPLATE, **kwargs})
    got = getattr(args, param)
    assert got == want and type(got) is int


@pytest.mark.parametrize("inputs, line", [
    ({"gpusPerPod": True}, "  gpus_per_pod: Input should be a valid integer, not a boolean (got True)"),
    ({"gpusPerPod": 2.5}, "  gpus_per_pod: Input should be a valid integer, got a number with a fractional part "
                          "(got 2.5)"),
    ({"parallelism": "2"}, "  parallelism: Input should be a valid integer, not a string (got '2')"),
])
def test_what_the_component_provider_passes_is_refused_as_in_python(inputs: dict[str, Any], line: str) -> None:
    kwargs, problems = NvlfabricProvider._arguments(BY_TOKEN["nvlfabric:index:BoundJob"], inputs)
    assert not problems
    with pytest.raises(ComponentArgsError) as err:
        validate(BoundJobArgs, "BoundJob", "trainer", {"name": "trainer", "pod_template": TEMPLATE, **kwargs})
    assert any(ln.startswith(line) for ln in str(err.value).splitlines()), str(err.value)


def test_a_float_for_a_number_is_still_a_number() -> None:
    """A number field takes an int (600 is 600.0) as before; only what is no number is refused."""
    for given_ in (60, 60.5, 600.0):
        args = validate(ComputeDomainArgs, "ComputeDomain", "cd", {"name": "cd", "timeout_s": given_})
        assert args.timeout_s == given_
