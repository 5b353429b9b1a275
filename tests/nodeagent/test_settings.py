"""The agent's settings are checked once, before anything starts: a bad value is one line naming the
flag, its environment twin and what is allowed, and exit code 2 (not a traceback and a crash loop)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvlfabric.api.computedomain import IMEXMode
from nvlfabric.daemon.process import SettingsError
from nvlfabric.nodeagent import settings

NODE = {"NODE_NAME": "n1", "NODE_IP": "127.0.0.1"}


def test_the_downward_api_environment_gives_typed_settings() -> None:
    cfg = settings.parse([], {**NODE, "RESYNC_SECONDS": "2.5", "IMEX_MODES": "CliqueScoped", "HEALTH_PORT": "0",
                              "KUBELET_ROOT": "/k"})
    assert cfg.node_name == "n1" and cfg.resync_s == 2.5 and cfg.health_port == 0
    assert cfg.imex_modes == frozenset({IMEXMode.CLIQUE_SCOPED}) and cfg.kubelet_root == Path("/k")
    assert settings.parse(["--resync-seconds", "7"], {**NODE, "RESYNC_SECONDS": "2"}).resync_s == 7  # flags win


@pytest.mark.parametrize(("env", "named"), [
    pytest.param({"RESYNC_SECONDS": "soon"}, "--resync-seconds / $RESYNC_SECONDS: 'soon'", id="resync"),
    pytest.param({"RESYNC_SECONDS": "0"}, "positive number of seconds", id="resync-zero"),
    pytest.param({"HEALTH_PORT": "x"}, "--health-port / $HEALTH_PORT: 'x' is not a whole number in 0..65535",
                 id="port"),
    pytest.param({"METRICS_PORT": "70000"}, "--metrics-port / $METRICS_PORT", id="port-range"),
    pytest.param({"IMEX_MODES": "Shared"}, "--imex-modes / $IMEX_MODES: 'Shared'", id="modes"),
    pytest.param({"NODE_NAME": ""}, "--node-name / $NODE_NAME and --node-ip / $NODE_IP are required", id="node"),
])
def test_a_bad_value_names_the_flag_and_its_twin(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as exc:
        settings.parse([], {**NODE, **env})
    assert named in str(exc.value)


def test_the_agent_exits_2_with_one_line_on_a_bad_environment_value() -> None:
    env = {**os.environ, **NODE, "HEALTH_PORT": "fifty"}
    proc = subprocess.run([sys.executable, "-m", "nvlfabric", "agent"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "nvlfabric agent: --health-port / $HEALTH_PORT: 'fifty' is not a whole number in 0..65535 (0 disables)"]


def _roots(tmp_path: Path, *, registry: bool = True, lib_dir: str | None = "usr/lib64") -> dict[str, str]:
    kubelet, driver = tmp_path / "kubelet", tmp_path / "driver"
    kubelet.mkdir()
    driver.mkdir()
    if registry:
        (kubelet / "plugins_registry").mkdir()
    if lib_dir is not None:
        (driver / lib_dir).mkdir(parents=True)
        (driver / lib_dir / "libnvidia-ml.so.1").write_bytes(b"")
    return {**NODE, "KUBELET_ROOT": str(kubelet), "DRIVER_ROOT": str(driver)}


@pytest.mark.parametrize("lib_dir", ["usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/lib/x86_64-linux-gnu"])
def test_a_kubelet_root_and_a_driver_root_that_look_like_them_pass(tmp_path: Path, lib_dir: str) -> None:
    settings.check_paths(settings.parse([], _roots(tmp_path, lib_dir=lib_dir)))


@pytest.mark.parametrize(("roots", "change", "named"), [
    pytest.param({"registry": False}, {}, "--kubelet-root / $KUBELET_ROOT: {kubelet} has no plugins_registry "
                 "directory, so it is not the kubelet's root directory", id="kubelet-root"),
    pytest.param({"lib_dir": None}, {}, "--driver-root / $DRIVER_ROOT: {driver} has no libnvidia-ml.so.1 (looked in "
                 "usr/lib64", id="driver-root-empty"),
    pytest.param({}, {"DRIVER_ROOT": "/run/nvidia/driver-typo"}, "--driver-root / $DRIVER_ROOT: "
                 "/run/nvidia/driver-typo does not exist, so it is not an NVIDIA driver root",
                 id="driver-root-missing"),
])
def test_a_root_that_is_not_one_is_refused_naming_the_setting_and_the_fix(
        tmp_path: Path, roots: dict[str, object], change: dict[str, str], named: str) -> None:
    env = {**_roots(tmp_path, **roots), **change}  # type: ignore[arg-type]
    with pytest.raises(SettingsError) as exc:
        settings.check_paths(settings.parse([], env))
    assert named.format(kubelet=tmp_path / "kubelet", driver=tmp_path / "driver") in str(exc.value)
    assert "set NvlfabricDriver(" in str(exc.value)


def test_the_agent_exits_2_with_one_line_on_a_kubelet_root_that_is_not_one(tmp_path: Path) -> None:
    env = {**os.environ, **_roots(tmp_path, registry=False)}
    proc = subprocess.run([sys.executable, "-m", "nvlfabric", "agent"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("nvlfabric agent: --kubelet-root / $KUBELET_ROOT: ")


@pytest.mark.parametrize(("value", "seconds"), [("60", 60.0), ("0", 0.0), ("0.0", 0.0), ("2.5", 2.5)])
def test_the_registration_timeout_is_seconds_or_0_for_ever(value: str, seconds: float) -> None:
    assert settings.parse([], {**NODE, "REGISTRATION_TIMEOUT": value}).registration_timeout_s == seconds


def test_a_bad_registration_timeout_names_the_flag_and_that_0_waits_for_ever() -> None:
    with pytest.raises(SettingsError, match=r"--registration-timeout / \$REGISTRATION_TIMEOUT: 'soon'.*0: wait"):
        settings.parse([], {**NODE, "REGISTRATION_TIMEOUT": "soon"})
