"""The node image's install, `nvlfabric[node]` (deploy/Dockerfile), from the wheel into a fresh
virtualenv: the agent and the controller start from it, and it carries no Pulumi, no
pulumi-kubernetes and none of the simulator's extras.

The installed size is printed (`-s` shows it) for the notes; `bench/` holds no figure for it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import installed


def _site_packages_mb(venv: Path) -> float:
    (site,) = venv.glob("lib/python*/site-packages")
    return sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 1e6


@pytest.mark.timeout(1200)
def test_the_node_extra_runs_the_agent_and_the_controller_without_pulumi(tmp_path: Path) -> None:
    python = installed.venv(tmp_path / "venv", "node")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    for command in ("agent", "controller"):
        proc = run("-m", "nvlfabric", command, "--help")
        assert proc.returncode == 0 and f"python -m nvlfabric {command}" in proc.stdout, proc.stderr
    # (cryptography is in it: IMEX TLS, the controller's authorities and the agents' node keys.)
    probe = ("import importlib.util as u, nvlfabric; "
             "print(nvlfabric.__file__); "
             "print(*[m for m in ('pulumi', 'pulumi_kubernetes', 'components', 'provider', 'sim', "
             "'nodeagent', 'kubeletapi') if u.find_spec(m)])")
    proc = run("-c", probe)
    where, present = [*proc.stdout.splitlines(), "", ""][:2]
    assert proc.returncode == 0 and where.startswith(str(tmp_path / "venv")), proc.stdout + proc.stderr
    assert present == "", f"the node image would carry {present}"
    # A platform program's import fails with what to install, not a bare ModuleNotFoundError.
    proc = run("-c", "from nvlfabric import ComputeDomain")
    assert proc.returncode != 0 and "pip install 'nvlfabric[pulumi]'" in proc.stderr
    print(f"nvlfabric[node] site-packages: {_site_packages_mb(tmp_path / 'venv'):.1f} MB")
