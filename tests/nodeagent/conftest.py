"""Fixtures the node agent's IMEX tests share: a driver root with the IMEX stand-ins, and the
members of one domain with a keeper per node (tests/support/imexnodes.py), every keeper and daemon
they started stopped afterwards."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.imexnodes import Nodes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A driver root whose usr/bin holds the stand-ins `make nvml` builds into build/imex (made
    here if they are missing or stale)."""
    built = REPO / "build" / "imex"
    proc = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(REPO / "nvlfabric" / "sim" / "imex"),
                           f"OUT={built}"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = tmp_path_factory.mktemp("driver-root")
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("nvidia-imex", "nvidia-imex-ctl"):
        (root / "usr" / "bin" / name).symlink_to(built / name)
    return root


@pytest.fixture
def nodes(tmp_path: Path, driver_root: Path) -> Iterator[Nodes]:
    n = Nodes(tmp_path, driver_root)
    try:
        yield n
    finally:
        n.close()
