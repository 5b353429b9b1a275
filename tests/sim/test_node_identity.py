"""A node's GPU software finds its node from the node's own files, as on a real node: a process
started with a clean environment (`env -i`, as NVIDIA's driver runs `nvidia-smi` from its driver
root) reads the NVML stand-in's identity file beside the library, not `NVLFABRIC_NVML_*`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.sim import agenthost, hardware


@pytest.fixture
def host(tmp_path: Path) -> Iterator[agenthost.Host]:
    h = agenthost.make_host(tmp_path / "host", range(240, 245))
    yield h
    agenthost.remove_host(h)


def _smi(host: agenthost.Host, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    smi = host.node.driver_root / "usr" / "bin" / "nvidia-smi"
    return subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_nvidia_smi_with_a_clean_environment_answers_as_its_node(host: agenthost.Host) -> None:
    told = _smi(host, {**os.environ, **hardware.node_env(host.state, host.node)})
    assert told.returncode == 0 and told.stdout.count("UUID: GPU-") == 4, told
    clean = _smi(host, {})  # env -i
    assert (clean.returncode, clean.stdout) == (0, told.stdout), clean


def test_without_its_identity_file_the_stand_in_says_where_it_looked(host: agenthost.Host) -> None:
    path = host.node.driver_root / "usr" / "lib64" / hardware.NODE_FILE
    path.unlink()
    clean = _smi(host, {})
    assert clean.returncode != 0
    assert f"{hardware.NODE_FILE}: No such file or directory" in clean.stdout + clean.stderr, clean
