"""Validated component arguments: pydantic models checked when a component is constructed.

A bad argument fails the program (so `pulumi preview` already fails) with one line per problem,
each naming the component, the field, what was wrong and how to fix it (the field's description).

Numbers and booleans are taken as they are, never converted (issue 49): pydantic's lax mode made
`channels_per_clique=True` a pool of 1 channel, `parallelism="5"` five pods and `wait=1` True.
`validate` checks the values a second time in pydantic's strict mode and keeps that pass's
type errors of integers, numbers and booleans (a string for an enum is strict mode's error too, but
a right one: those are left out), for the component's own models and the API models nested in them
(`spec.numNodes`) alike; and it refuses a non-finite number (inf, NaN) anywhere, a pod template
included. What arrives from the component provider is already plain: every number crosses its
wire as a float, and integral ones are made ints before this (pluginserver.py), so 4.0 there is 4.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final, TypeVar

import pulumi
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from nvlfabric.api import names
from nvlfabric.api.names import COMPONENT_LABEL

PART_OF: Final = {names.PART_OF_LABEL: names.PART_OF}

M = TypeVar("M", bound=BaseModel)
MAX_GOT: Final = 160
"""A problem quotes the value it got up to this length (a whole pod template would bury the message)."""
STRICT_TYPES: Final = frozenset({"int_type", "float_type", "bool_type"})
"""The errors of pydantic's strict mode that `validate` reports: a value lax mode would convert."""
_KINDS: Final = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", dict: "a mapping",
                 list: "a list"}


class ComponentArgsError(pulumi.RunError):
    """Invalid component arguments; the message names every bad field and its fix.

    A `pulumi.RunError`, so the program stops with this message and no Python traceback.
    `problems` holds the same as data, `(location, text)` per bad field (an empty location means
    the arguments as a whole), for the component provider to report per property.
    """

    def __init__(self, message: str, problems: list[tuple[tuple[int | str, ...], str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(arguments)"


def _named_in(model: type[BaseModel], message: str) -> tuple[str, ...]:
    """The field a problem of the arguments as a whole is about: the first of the model's fields
    its message names (a cross-field rule names the field to change first), else none."""
    found = [(m.start(), name) for name in model.model_fields
             if (m := re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message)) is not None]
    return (min(found)[1],) if found else ()


def validate(model: type[M], component: str, resource_name: str, values: dict[str, Any],
             unknown: dict[str, Any] | None = None) -> M:
    """`model` validated from `values`, or a `ComponentArgsError` naming each field and its fix.
    `unknown`: the keywords the constructor has no parameter for, each refused as unknown (an
    internal field a component derives, e.g. BoundJob's clique_groups, among them: given as a
    keyword it would override what the component derived). A value pydantic would convert (a
    boolean or a string for an integer, a float for an integer, ...) or a non-finite number is
    refused, not converted (module docstring)."""
    values = {**values, **{(f"{k} " if k in model.model_fields else k): v for k, v in (unknown or {}).items()}}
    errors: list[ErrorDetails] = []
    validated: M | None = None
    try:
        validated = model.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors()
    for err in _converted(model, values):
        if not any(_covered(tuple(err["loc"]), e) for e in errors):
            errors.append(err)
    if validated is not None and not errors:
        return validated
    problems = [_problem(model, err) for err in errors]
    raise ComponentArgsError(
        f"{component} {resource_name!r}: invalid arguments\n"
        + "\n".join(f"  {_path(loc)}: {text}" for loc, text in problems), problems) from None


def _problem(model: type[BaseModel], err: ErrorDetails) -> tuple[tuple[int | str, ...], str]:
    """One problem's location and text: pydantic's message, the value given, the fix."""
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        loc = tuple(str(p).rstrip() for p in loc)  # an internal field given as a keyword
    field = model.model_fields.get(str(loc[0])) if loc else None
    loc = loc or _named_in(model, err["msg"])
    hint = f" (expected: {field.description})" if field is not None and field.description else ""
    # (the input of a problem of the arguments as a whole is all of them: not worth repeating)
    got = "" if err["type"] in ("missing", "extra_forbidden") or not loc else f" (got {err.get('input')!r})"
    if len(got) > MAX_GOT or (isinstance(err.get("input"), dict | list) and err["type"] == "value_error"):
        got = ""  # a whole pod template, say: the message names the part that is wrong
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        valid = [n for n, f in model.model_fields.items()
                 if not (isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("internal"))]
        msg = f"unknown argument; valid ones are {', '.join(valid)}"
    return loc, f"{msg}{got}{hint}"


def _converted(model: type[BaseModel], values: dict[str, Any]) -> list[ErrorDetails]:
    """The values lax validation would have converted (strict mode's type errors of integers,
    numbers and booleans, saying what was given), and every non-finite number in `values`."""
    found: list[ErrorDetails] = []
    try:
        model.model_validate(values, strict=True)
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] in STRICT_TYPES:
                kind = _KINDS.get(type(err["input"]), type(err["input"]).__name__)
                found.append({**err, "msg": f"{err['msg']}, not {kind}"})
    found.extend(_non_finite(values, ()))
    return found


def _non_finite(value: Any, loc: tuple[int | str, ...]) -> list[ErrorDetails]:
    if isinstance(value, float) and not math.isfinite(value):
        return [{"type": "finite_number", "loc": loc, "msg": "Input should be a finite number", "input": value}]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _non_finite(v, (*loc, str(k)))]
    if isinstance(value, list | tuple):
        return [e for i, v in enumerate(value) for e in _non_finite(v, (*loc, i))]
    return []


def _covered(loc: tuple[int | str, ...], err: ErrorDetails) -> bool:
    """Whether `err` already reports the value at `loc`: the same place, or a value around it of
    the wrong type (a rule over several fields, a `value_error`, says something else)."""
    at = tuple(err["loc"])
    return at == loc or (at == loc[:len(at)] and err["type"] != "value_error")


def labels(component: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The labels every object of an nvlfabric component carries."""
    return {**(extra or {}), **PART_OF, COMPONENT_LABEL: component}
