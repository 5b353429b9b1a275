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

    # The IMEX keeper: built from the installed package's C sources with the Dockerfile's command,
    # found on the PATH by `python -m nvlfabric imex`, which becomes it (same pid, same arguments).
    (sources,) = (tmp_path / "venv").glob("lib/python*/site-packages/nvlfabric/nodeagent/keeper")
    image_bin = tmp_path / "usr-local-bin"
    make = subprocess.run(["make", "-s", "-C", str(sources), f"OUT={image_bin}"], capture_output=True, text=True,
                          timeout=300)
    assert make.returncode == 0, make.stderr
    env = {"PATH": f"{image_bin}:/usr/bin:/bin"}
    proc = subprocess.run([str(python), "-m", "nvlfabric", "imex", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "--kubelet-root" in proc.stdout and "--driver-root" in proc.stdout, proc.stderr
    proc = subprocess.run([str(python), "-m", "nvlfabric", "imex", "--log-format", "xml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "--log-format" in proc.stderr, proc.stderr  # the keeper itself answered
    # Without it, the pod's log and termination message say what is missing and where it belongs.
    proc = subprocess.run([str(python), "-m", "nvlfabric", "imex"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "nvlfabric-imex-keeper is not on the PATH" in proc.stderr, proc.stderr
