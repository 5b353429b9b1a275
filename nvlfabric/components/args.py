"""Validated component arguments: pydantic models checked when a component is constructed.

A bad argument fails the program (so `pulumi preview` already fails) with one line per problem,
each naming the component, the field, what was wrong and how to fix it (the field's description).
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import pulumi
from pydantic import BaseModel, ValidationError

from nvlfabric.api import names
from nvlfabric.api.names import COMPONENT_LABEL

PART_OF: Final = {names.PART_OF_LABEL: names.PART_OF}

M = TypeVar("M", bound=BaseModel)
MAX_GOT: Final = 160
"""A problem quotes the value it got up to this length (a whole pod template would bury the message)."""


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
    keyword it would override what the component derived)."""
    values = {**values, **{(f"{k} " if k in model.model_fields else k): v for k, v in (unknown or {}).items()}}
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems: list[tuple[tuple[int | str, ...], str]] = []
        for err in exc.errors():
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
            problems.append((loc, f"{msg}{got}{hint}"))
        raise ComponentArgsError(
            f"{component} {resource_name!r}: invalid arguments\n"
            + "\n".join(f"  {_path(loc)}: {text}" for loc, text in problems), problems) from None


def labels(component: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The labels every object of an nvlfabric component carries."""
    return {**(extra or {}), **PART_OF, COMPONENT_LABEL: component}
