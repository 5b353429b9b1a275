"""nvlfabric as a user installs it: the wheel built from this checkout, in a virtualenv of its own.

`wheel()` builds the wheel once per test session (into build/dist/, with `python -m build`, in an
isolated build environment, exactly what a release would publish); `venv(dir, extras)` creates a
fresh virtualenv there and installs the wheel with those extras from it, the dependencies from the
package index (pip's cache makes this seconds after the first time). Nothing of the checkout is on
that interpreter's `sys.path`: tests that use it prove what a platform repo gets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from nvlfabric.sim.environment import simulator_env
from nvlfabric.sim.paths import load_tools
from nvlfabric.testbed.pulumi_cli import OFFLINE, PulumiProject

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "build" / "dist"
_lock = threading.Lock()
_built: list[Path] = []


def wheel() -> Path:
    """The nvlfabric wheel of this checkout, built once per session."""
    with _lock:
        if not _built:
            _built.append(_build(REPO, DIST / f"session-{os.getpid()}"))
        return _built[0]


def _build(source: Path, out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"building the wheel failed\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    (built,) = out.glob("nvlfabric-*.whl")
    return built


def release_wheel(ref: str) -> Path:
    """The wheel of an earlier release, built from this checkout's git history (`ref`: its tag or
    commit) as that release published it; kept in build/dist/<commit>/ (a commit's wheel never
    changes)."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", f"{ref}^{{commit}}"], check=True,
                            capture_output=True, text=True, timeout=60).stdout.strip()
    out = DIST / commit
    with _lock:
        if done := list(out.glob("nvlfabric-*.whl")):
            return done[0]
        source = DIST / f"src-{commit}"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True,
                                 timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True, timeout=120)
        try:
            return _build(source, out)
        finally:
            shutil.rmtree(source, ignore_errors=True)


def venv(where: Path, extras: str = "pulumi", wheel_file: Path | None = None) -> Path:
    """A new virtualenv at `where` with the wheel (this checkout's, or `wheel_file`) installed
    (`nvlfabric[extras]`); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    uri = (wheel_file or wheel()).as_uri()
    spec = f"nvlfabric[{extras}] @ {uri}" if extras else f"nvlfabric @ {uri}"
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
                          capture_output=True, text=True, timeout=900, cwd=where)
    if proc.returncode != 0:
        raise AssertionError(f"pip install {spec} failed\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return python


def commit_setting(version: str) -> str | None:
    """The commit that set `version` in nvlfabric/api/release.py (a release found without its tag,
    as in a clone of the branch alone), or None."""
    commits = subprocess.run(["git", "-C", str(REPO), "log", "--format=%H", "-S", f'__version__ = "{version}"', "--",
                              "nvlfabric/api/release.py"], check=True, capture_output=True, text=True,
                             timeout=60).stdout.split()
    return commits[-1] if commits else None


def clean_env(venv: Path) -> dict[str, str]:
    """The environment without anything that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    checkout_venv = REPO / ".venv"
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not Path(p).is_relative_to(checkout_venv)]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    return env


def platform_project(workdir: Path, venv: Path, kubeconfig: Path, program: str) -> PulumiProject:
    """The platform repo's Pulumi project (`program`), in the offline environment of
    nvlfabric/testbed/pulumi_cli.py (`simulator_env` + OFFLINE), with only the platform venv's Python on PATH."""
    workdir.mkdir()
    (workdir / "Pulumi.yaml").write_text(textwrap.dedent(f"""\
        name: platform
        runtime:
          name: python
          options:
            virtualenv: {venv}
        """))
    (workdir / "__main__.py").write_text(program)
    backend = workdir / ".backend"
    backend.mkdir()
    tools = load_tools()
    env = clean_env(venv)
    path = env["PATH"]
    env.update(simulator_env(tools=tools, kubeconfig=kubeconfig, backend_dir=backend))
    env.update(OFFLINE)
    # simulator_env puts this interpreter's bin (the checkout's .venv) on PATH: not here.
    env["PATH"] = os.pathsep.join([str(tools.bin_dir), path])
    return PulumiProject(workdir=workdir, env=env)
