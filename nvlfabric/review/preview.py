"""The part of `pulumi preview --json` the report reads, as pydantic models (the one schema).

The engine's JSON: `steps` (one per resource: `op`, `urn`, the old and new state with `type`,
`inputs` and `outputs`, `detailedDiff`, `replaceReasons`), `diagnostics` (messages the program and
the providers logged, with the resource's `urn` and a `severity`) and `changeSummary` (op → count).
Everything else is ignored, so a newer CLI's additions do not break the report.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

REPLACE_OPS = frozenset({"replace", "create-replacement", "delete-replaced"})
"""Ops of one replacement (the engine lists a replace as one step, or as its two halves)."""


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class State(_Loose):
    type: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)
    outputs: dict[str, Any] = Field(default_factory=dict)


class Step(_Loose):
    op: str
    urn: str
    old_state: State | None = Field(None, alias="oldState")
    new_state: State | None = Field(None, alias="newState")
    detailed_diff: dict[str, Any] | None = Field(None, alias="detailedDiff")
    replace_reasons: list[str] = Field(default_factory=list, alias="replaceReasons")
    diff_reasons: list[str] = Field(default_factory=list, alias="diffReasons")

    @property
    def type(self) -> str:
        """The resource's type token (from the URN: the states may be absent)."""
        return self.urn.split("::")[-2].split("$")[-1]

    @property
    def name(self) -> str:
        return self.urn.split("::")[-1]

    @property
    def parent_types(self) -> list[str]:
        """The type tokens of the resource's parents, outermost first."""
        return self.urn.split("::")[-2].split("$")[:-1]

    @property
    def state(self) -> State:
        """The new state, else the old (a delete has only the old)."""
        return self.new_state or self.old_state or State()

    def changed_fields(self) -> list[str]:
        """What the step changes: the replace reasons, else the detailed diff's paths, else the diff reasons."""
        return list(self.replace_reasons) or sorted(self.detailed_diff or {}) or list(self.diff_reasons)


class Diagnostic(_Loose):
    urn: str = ""
    message: str = ""
    severity: str = ""


class Preview(_Loose):
    steps: list[Step] = Field(default_factory=list)
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    change_summary: dict[str, int] = Field(default_factory=dict, alias="changeSummary")


class PreviewError(ValueError):
    """The input is not `pulumi preview --json` output; the message says what was expected."""


def load(text: str) -> Preview:
    """The preview from `pulumi preview --json`'s output (a `PreviewError` when it is not one)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PreviewError(f"not JSON ({exc.msg} at line {exc.lineno}): pass the output of `pulumi preview --json`") \
            from None
    if not isinstance(data, dict) or "steps" not in data:
        raise PreviewError("no 'steps' in the JSON: pass the output of `pulumi preview --json`")
    try:
        return Preview.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PreviewError(f"unexpected preview JSON at {where}: {first['msg']}") from None
