"""Golden files of `pulumi preview --diff` output: compared exactly, written anew only when
NVLFABRIC_UPDATE_GOLDEN is set."""

from __future__ import annotations

import os
import re

from tests.support import installed

GOLDEN = installed.REPO / "tests" / "golden"


def normalise(text: str, suffix: str) -> str:
    """`text` with the run's suffix, colours and trailing spaces taken out."""
    text = text.replace(suffix, "SUFFIX")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines()) + "\n"


def check(name: str, text: str) -> None:
    """`text` is the golden file `name` (tests/golden/)."""
    path = GOLDEN / name
    if os.environ.get("NVLFABRIC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} is missing; run with NVLFABRIC_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (f"`pulumi preview --diff` output changed; if intended, regenerate with "
                                      f"NVLFABRIC_UPDATE_GOLDEN=1. Got:\n{text}")
