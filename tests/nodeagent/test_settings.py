"""The agent's settings are checked once, before anything starts: a bad value is one line naming the
flag, its environment twin and what is allowed, and exit code 2 (not a traceback and a crash loop)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvlfabric.api.computedomain import IMEXMode
from nvlfabric.api.process import SettingsError
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
