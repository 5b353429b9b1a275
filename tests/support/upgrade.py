"""The previous release and the golden files of an upgrade's preview: what tests/e2e/test_upgrade.py
and tests/components/test_yaml_upgrade.py (a Python and a YAML platform repo) both upgrade from
and compare against."""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

import pytest

import nvlfabric
from tests.support import installed

GOLDEN = installed.REPO / "tests" / "golden" / "upgrade"
RELEASE = re.compile(r"^## (\d+\.\d+\.\d+) — ", re.M)
#: The types whose objects hold a running job: an upgrade's preview must not touch them.
KEPT_TYPES = ("ComputeDomain", "BoundJob", "batch/v1:Job", "ResourceClaim")


def previous_release() -> tuple[str, str]:
    """(version, git ref) of the newest release before this version."""
    released = RELEASE.findall((installed.REPO / "CHANGELOG.md").read_text())
    older = [v for v in released if v != nvlfabric.__version__]
    if not older:
        pytest.skip("no release before this one to upgrade from")
    version = older[0]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(installed.REPO), *args], check=True, capture_output=True, text=True,
                              timeout=60).stdout.strip()

    if git("tag", "--list", f"v{version}"):
        return version, f"v{version}"
    # A clone without tags: the commit that set the version (tests/packaging/test_release.py holds the two equal).
    commit = installed.commit_setting(version)
    assert commit, f"no tag v{version} and no commit that sets version {version}"
    return version, commit


def steps_of(preview: dict[str, Any]) -> list[list[Any]]:
    """The preview's steps that do something: [op, type, name, the properties that differ], sorted."""
    out = []
    for st in preview["steps"]:
        if st["op"] in ("same", "read"):
            continue
        type_, name = st["urn"].split("::")[-2].split("$")[-1], st["urn"].split("::")[-1]
        out.append([st["op"], type_, name, sorted(st.get("detailedDiff") or st.get("diffReasons") or [])])
    return sorted(out)


def golden(name: str, got: list[list[Any]]) -> list[list[Any]]:
    """The golden file `name` (written from `got` when NVLFABRIC_UPDATE_GOLDEN is set)."""
    path = GOLDEN / name
    if os.environ.get("NVLFABRIC_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert path.exists(), f"{path} is missing; run with NVLFABRIC_UPDATE_GOLDEN=1 and review it"
    return list(json.loads(path.read_text()))
