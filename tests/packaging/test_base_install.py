"""The base install, `pip install nvlfabric` without an extra (what a new user types first): the
contract room imports, and a component's import fails with the line that fixes it rather than a
bare `No module named ...` of whichever library the components happen to import first."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import installed


@pytest.mark.timeout(900)
def test_the_base_install_names_the_extra_a_component_needs(tmp_path: Path) -> None:
    python = installed.venv(tmp_path / "venv", "")

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    proc = run("from nvlfabric.api import names, computedomain; print(names.DRIVER)")
    assert proc.returncode == 0, proc.stderr
    for component in ("ComputeDomain", "BoundJob", "NvlfabricDriver", "Nvl72Rack"):
        proc = run(f"from nvlfabric import {component}")
        assert proc.returncode != 0
        assert "pip install 'nvlfabric[pulumi]'" in proc.stderr, proc.stderr
        assert f"nvlfabric.{component} needs the Pulumi SDK" in proc.stderr, proc.stderr
