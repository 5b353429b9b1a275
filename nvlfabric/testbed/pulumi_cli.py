"""Running the real Pulumi CLI offline against a simulator's control plane: what tests, benchmarks and the
demo share (a project copied from a fixture, the offline environment, a runner that says what failed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvlfabric.sim.environment import simulator_env
from nvlfabric.sim.paths import load_tools
from nvlfabric.sim.processes import run_owned

# Anything that tries the network gets a proxy that refuses; loopback goes direct. With plugin
# downloads and update checks disabled nothing should try, and this makes sure of it.
OFFLINE = {
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
}


@dataclass
class PulumiProject:
    workdir: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = run_owned(["pulumi", *args], cwd=self.workdir, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {proc.returncode}\n"
                                 f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args).stdout)


def project_from_fixture(fixture: Path, workdir: Path, *, kubeconfig: Path, venv: Path) -> PulumiProject:
    shutil.copytree(fixture, workdir)
    template = workdir / "Pulumi.yaml.in"
    if template.exists():  # Python fixtures name the virtualenv; a YAML project has none
        (workdir / "Pulumi.yaml").write_text(template.read_text().replace("@VENV@", str(venv)))
        template.unlink()
    backend = workdir / ".backend"
    backend.mkdir()
    env = dict(os.environ)
    env.update(simulator_env(tools=load_tools(), kubeconfig=kubeconfig, backend_dir=backend))
    env.update(OFFLINE)
    return PulumiProject(workdir=workdir, env=env)
