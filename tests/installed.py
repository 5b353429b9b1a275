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
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "build" / "dist"
_lock = threading.Lock()
_built: list[Path] = []


def wheel() -> Path:
    """The nvlfabric wheel of this checkout, built once per session."""
    with _lock:
        if not _built:
            out = DIST / f"session-{os.getpid()}"
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO)],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise AssertionError(f"building the wheel failed\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
            (built,) = out.glob("nvlfabric-*.whl")
            _built.append(built)
        return _built[0]


def venv(where: Path, extras: str = "pulumi") -> Path:
    """A new virtualenv at `where` with the wheel installed (`nvlfabric[extras]`); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    spec = f"nvlfabric[{extras}] @ {wheel().as_uri()}" if extras else f"nvlfabric @ {wheel().as_uri()}"
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
                          capture_output=True, text=True, timeout=900, cwd=where)
    if proc.returncode != 0:
        raise AssertionError(f"pip install {spec} failed\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return python
