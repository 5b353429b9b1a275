"""The rooms' import contracts (pyproject.toml `[tool.importlinter]`) hold: `make check` runs the same
check, and this runs it in `make test`, so CI refuses a change that makes data flow the wrong way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_a_users_own_components_and_sim_folders_shadow_nothing(tmp_path: Path) -> None:
    """A platform repo (or a state dir) with folders named like our rooms, as the simulated kubelet
    and a Pulumi program see it: nvlfabric's modules are still nvlfabric's."""
    for room in ("components", "provider", "sim", "nodeagent", "kubeletapi"):
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text("raise ImportError('the user\\'s own package was imported')\n")
    probe = ("from nvlfabric import ComputeDomain; from nvlfabric.sim.kubelet import kubelet; "
             "from nvlfabric.sim.nodes import SimNode; print('ok')")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "nvlfabric.sim.kubelet", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
