"""The contract room is the one home of every shared name and limit: what a component accepts, the
controller and the node agent accept too, and names formatted by one room parse in another.

Before the contract room, `NvlfabricDriver(channels_per_clique=2048)` passed the component and
crash-looped the controller (its pool planner stopped at 2047). These tests hold the boundary from
both sides, through each room's own entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from nvlfabric.api import names
from nvlfabric.components import NvlfabricDriverArgs
from nvlfabric.components.driver import driver_objects
from nvlfabric.controller import pools
from nvlfabric.controller.__main__ import channels_per_clique, settings
from nvlfabric.daemon.process import SettingsError
from nvlfabric.sim import nodeimage
from tests.support import keepers

CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"


def _controller_env(args: NvlfabricDriverArgs) -> dict[str, str]:
    """The environment the driver component gives the controller's container."""
    (deploy,) = [o for o in driver_objects(args) if o["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize("channels", [1, names.DEFAULT_CHANNELS_PER_CLIQUE, names.MAX_CHANNELS_PER_CLIQUE])
def test_every_pool_size_the_component_accepts_the_controller_publishes(
        channels: int, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _controller_env(NvlfabricDriverArgs(channels_per_clique=channels))
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    assert settings([]).channels_per_clique == channels
    slices = pools.desired_slices(CLIQUE, channels, generation=1)
    devices = [d.name for s in slices for d in (s.spec.devices if s.spec else [])]
    assert devices == [names.channel_device(n) for n in range(1, channels + 1)]
    assert all(len(s.spec.devices) <= names.MAX_DEVICES_PER_SLICE for s in slices if s.spec)


def test_one_past_the_limit_is_refused_by_the_component_the_controller_and_the_planner() -> None:
    over = names.MAX_CHANNELS_PER_CLIQUE + 1
    assert over == 2048
    with pytest.raises(ValidationError, match="less than or equal to 2047"):
        NvlfabricDriverArgs(channels_per_clique=over)
    with pytest.raises(SettingsError, match=r"--channels-per-clique / \$CHANNELS_PER_CLIQUE: '2048'.*1\.\.2047"):
        channels_per_clique(str(over))
    with pytest.raises(ValueError, match="between 1 and 2047"):
        pools.desired_slices(CLIQUE, over, generation=1)


@pytest.mark.parametrize("modes", [["CliqueScoped"], ["Dedicated"], ["CliqueScoped", "Dedicated"]])
def test_the_controller_knows_the_imex_modes_the_component_gives_the_agents(
        modes: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    env = _controller_env(NvlfabricDriverArgs(imex_modes=modes))  # type: ignore[arg-type]
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    assert {m.value for m in settings([]).imex_modes} == set(modes)
    proc = subprocess.run([sys.executable, "-m", "nvlfabric", "controller", "--imex-modes", "Shared"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--imex-modes / $IMEX_MODES" in proc.stderr


@pytest.mark.parametrize("value", ["0", "2048", "-1", "many", ""])
def test_the_controller_refuses_a_bad_pool_size_in_one_line_and_exits_2(value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nvlfabric", "controller", "--channels-per-clique", value],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--channels-per-clique" in lines[0] and "1..2047" in lines[0], proc.stderr


def test_the_image_entry_point_names_its_three_commands() -> None:
    proc = subprocess.run([sys.executable, "-m", "nvlfabric", "kubelet"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "{agent,imex,controller}" in proc.stderr
    # `imex` hands its arguments to the keeper's program (built here), which the node image's ENV names
    keepers.program()
    proc = subprocess.run([sys.executable, "-m", "nvlfabric", "imex", "--kubelet-root", "/" + "k" * 80],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **nodeimage.image_env()})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--kubelet-root / $KUBELET_ROOT" in proc.stderr


@given(st.integers(min_value=1, max_value=names.MAX_CHANNEL))
def test_channel_device_names_round_trip(channel: int) -> None:
    assert names.channel_of_device(names.channel_device(channel)) == channel


@given(st.text(max_size=12))
def test_only_canonical_channel_device_names_parse(suffix: str) -> None:
    parsed = names.channel_of_device(names.DEVICE_PREFIX + suffix)
    canonical = suffix.isascii() and suffix.isdigit() and str(int(suffix)) == suffix and 1 <= int(suffix) <= 2047
    assert (parsed is not None) == canonical
    if parsed is not None:
        assert names.channel_device(parsed) == names.DEVICE_PREFIX + suffix


@pytest.mark.parametrize("device", ["channel-0", "channel-2048", "channel-07", "channel-", "chan-1", "channel-1 "])
def test_devices_that_are_not_pool_channels_do_not_parse(device: str) -> None:
    assert names.channel_of_device(device) is None


@given(st.text(min_size=1, max_size=60))
def test_pool_names_round_trip(clique: str) -> None:
    assert names.clique_of_pool(names.pool_name(clique)) == clique
    assert names.clique_of_pool(clique) is None or clique.startswith(names.POOL_PREFIX)


@given(st.text(alphabet="abcz09-.A_", max_size=70))
def test_the_dns_rules_are_the_ones_the_models_enforce(value: str) -> None:
    from nvlfabric.api.computedomain import ComputeDomain

    def model_accepts(name: str) -> bool:
        body: dict[str, Any] = {"apiVersion": "nvlfabric.io/v1alpha1", "kind": "ComputeDomain",
                                "metadata": {"name": name}}
        try:
            ComputeDomain.model_validate(body)
        except ValidationError:
            return False
        return True

    assert names.is_dns_label(value) == model_accepts(value)
    if names.is_dns_label(value):
        assert names.is_dns_subdomain(value)
