"""Fixtures the component tests share: the ComputeDomain CRD on the session's control plane, and
the wheelhouse a consumer project's plugin installs nvlfabric from."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nvlfabric.components import plugin_dir
from nvlfabric.sim.cluster import install_crd
from tests.conftest import Cluster
from tests.support import installed


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Cluster:
    """The ComputeDomain CRD installed and Established: the part of the driver install a
    ComputeDomain needs on a control plane without nodes."""
    install_crd(cluster.client)
    return cluster


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel tests/support/installed.py builds and every distribution `nvlfabric[pulumi]` needs, fetched
    once: what pip installs the plugin's virtualenv from, with no index (the CLI runs offline)."""
    wheel = installed.wheel()
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"nvlfabric/components/plugin/{f}" for f in plugin_dir.FILES} <= set(names), names
    where = tmp_path_factory.mktemp("wheelhouse")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                           "--dest", str(where), f"nvlfabric[pulumi] @ {wheel.as_uri()}"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"pip download: {proc.stdout}\n{proc.stderr}"
    assert (where / wheel.name).exists()
    return where
