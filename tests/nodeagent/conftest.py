"""Fixtures the node agent's IMEX tests share: a driver root with the IMEX stand-ins, and the
members of one domain (tests/support/imexnodes.py), every daemon they started killed afterwards."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.imexnodes import Nodes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A driver root with the stand-ins in usr/bin, built once with `make -C nvlfabric/sim/imex`."""
    root = tmp_path_factory.mktemp("driver-root")
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(REPO / "nvlfabric" / "sim" / "imex"),
                           f"OUT={root / 'usr' / 'bin'}"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture
def nodes(tmp_path: Path, driver_root: Path) -> Iterator[Nodes]:
    n = Nodes(tmp_path, driver_root)
    try:
        yield n
    finally:
        n.close()
