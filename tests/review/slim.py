"""Shrink a real `pulumi preview --json` to what the report reads, for the golden files: each
step's op, URN and reasons, and the inputs the report looks at (a domain's, a workload's, a rack's
node patch; of any other resource its name), without the providers' pickles and manifests.

    python -m tests.review.slim preview.json > tests/golden/report/<scenario>.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from nvlfabric.review import impact

KEEP_INPUTS = {*impact.DOMAIN_TYPES, *impact.WORKLOAD_TYPES, "kubernetes:core/v1:NodePatch"}


def _state(state: dict[str, Any] | None, keep: bool) -> dict[str, Any] | None:
    if not state:
        return None
    inputs = {k: v for k, v in (state.get("inputs") or {}).items() if k != "__provider"}
    if not keep:
        meta = inputs.get("metadata") or {}
        inputs = {"metadata": {k: meta[k] for k in ("name", "namespace") if k in meta}} if meta else {}
    return {"type": state.get("type", ""), "inputs": inputs}


def slim(preview: dict[str, Any]) -> dict[str, Any]:
    steps = []
    for s in preview.get("steps") or []:
        kind = s["urn"].split("::")[-2].split("$")[-1]
        keep = kind in KEEP_INPUTS
        steps.append({k: v for k, v in {
            "op": s["op"], "urn": s["urn"], "replaceReasons": s.get("replaceReasons"),
            "diffReasons": s.get("diffReasons"), "detailedDiff": s.get("detailedDiff"),
            "oldState": _state(s.get("oldState"), keep), "newState": _state(s.get("newState"), keep)}.items()
            if v is not None})
    return {"steps": steps, "diagnostics": preview.get("diagnostics") or [],
            "changeSummary": preview.get("changeSummary") or {}}


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(json.dumps(slim(json.load(fh)), indent=1, sort_keys=True))
