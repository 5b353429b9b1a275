"""The contract room is the one home of every shared name and limit: what a component accepts, the
controller and the node agent accept too, and names formatted by one room parse in another.

Before the contract room, `NvlfabricDriver(channels_per_clique=2048)` passed the component and
crash-looped the controller (its pool planner stopped at 2047). These tests hold the boundary from
both sides, through each room's own entry point.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

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


# -- one home per fact (issue 50): each limit, port, default and budget below is typed once, in
# nvlfabric/api/names.py (or the model that owns it), and these hold every room to that one.

REPO = Path(__file__).resolve().parents[2]


def test_imex_ports_and_slots_are_the_contracts_in_every_room() -> None:
    from nvlfabric.api.computedomain import ComputeDomainStatus
    from nvlfabric.controller.reconcile import SlotRequest, assign_port_slots
    from nvlfabric.nodeagent import imexconfig
    from nvlfabric.sim.imex.config import ImexConfig

    last = names.MAX_IMEX_PORT_SLOT
    # the agent: slot 0 is IMEX's default pair, each slot a stride further, the last one the contract's
    assert imexconfig.ports_for_slot(0) == imexconfig.DomainPorts(names.IMEX_SERVER_PORT, names.IMEX_CMD_PORT)
    assert imexconfig.ports_for_slot(last) == imexconfig.DomainPorts(
        names.IMEX_SERVER_PORT + names.IMEX_PORT_STRIDE * last, names.IMEX_CMD_PORT + names.IMEX_PORT_STRIDE * last)
    with pytest.raises(ValueError, match=f"0..{last}"):
        imexconfig.ports_for_slot(last + 1)
    # the CRD's status field and the controller's assignment stop at the same slot
    ComputeDomainStatus.model_validate({"imexPortSlot": last})
    with pytest.raises(ValidationError):
        ComputeDomainStatus.model_validate({"imexPortSlot": last + 1})
    crd = yaml.safe_load((REPO / "nvlfabric/manifests/crds/nvlfabric.io_computedomains.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["imexPortSlot"]["maximum"] == last
    assert f"peer port {names.IMEX_SERVER_PORT}+{names.IMEX_PORT_STRIDE}*slot" in status["imexPortSlot"]["description"]
    held = [SlotRequest(key=f"ns/d{i}", clique="c", slot=i) for i in range(1, last + 1)]
    assert assign_port_slots([*held, SlotRequest(key="ns/new", clique="c", slot=None)])["ns/new"] is None
    # the simulated daemon's defaults, and both C programs' (the keeper's parser, the IMEX stand-in)
    assert (ImexConfig().SERVER_PORT, ImexConfig().IMEX_CMD_PORT) == (names.IMEX_SERVER_PORT, names.IMEX_CMD_PORT)
    keeper = (REPO / "nvlfabric/nodeagent/keeper/imexconfig.c").read_text()
    assert f"num[ARRAY_LEN(NUMBERS)] = {{{names.IMEX_SERVER_PORT}, {names.IMEX_CMD_PORT}," in keeper
    assert '{"SERVER_PORT", 1, 65535}, {"IMEX_CMD_PORT", 1, 65535},' in keeper  # in that order
    standin = (REPO / "nvlfabric/sim/imex/imex_common.c").read_text()
    assert f"cfg->server_port = {names.IMEX_SERVER_PORT};" in standin
    assert f"cfg->cmd_port = {names.IMEX_CMD_PORT};" in standin


def _root_for(path_of: Callable[[str], str], size: int) -> str:
    """A kubelet root (two-byte characters mostly) whose `path_of` is `size` bytes long, and far
    fewer characters: a check that counts characters lets it through."""
    suffix = len(path_of("/x").encode()) - len("/x")  # what `path_of` adds to a root
    rest = size - suffix - 1  # the root's bytes after its "/"
    root = "/" + "é" * (rest // 2) + "x" * (rest % 2)
    assert len(path_of(root).encode()) == size and len(path_of(root)) < names.MAX_UNIX_SOCKET_PATH
    return root


def test_a_unix_socket_path_is_counted_in_bytes_against_the_one_limit_in_every_room() -> None:
    from nvlfabric.nodeagent.server import SocketPaths
    from nvlfabric.sim.imex.config import ImexConfig

    limit = names.MAX_UNIX_SOCKET_PATH

    def agent_path(root: str) -> str:  # the longer of the agent's two sockets
        paths = SocketPaths(kubelet_root=Path(root), driver=names.DRIVER)
        return max((str(paths.endpoint), str(paths.registration)), key=lambda p: len(p.encode()))

    for size, fits in ((limit, True), (limit + 1, False)):
        root = _root_for(names.imex_keeper_socket, size)
        if fits:
            NvlfabricDriverArgs(kubelet_root=root)
        else:
            with pytest.raises(ValidationError, match=f"would have {size} bytes, a unix socket path at most {limit}"):
                NvlfabricDriverArgs(kubelet_root=root)
        root = _root_for(agent_path, size)
        if fits:
            SocketPaths(kubelet_root=Path(root), driver=names.DRIVER).check()
        else:
            with pytest.raises(ValueError, match=f"is {size} bytes; unix sockets allow {limit}"):
                SocketPaths(kubelet_root=Path(root), driver=names.DRIVER).check()
        path = _root_for(lambda r: r, size)
        if fits:
            ImexConfig(IMEX_CMD_UNIX_DOMAIN_PATH=path)
        else:
            with pytest.raises(ValidationError, match=f"at most {limit} bytes"):
                ImexConfig(IMEX_CMD_UNIX_DOMAIN_PATH=path)
    # the keeper (C) defines the same limit and counts bytes too
    assert f"#define MAX_UNIX_SOCKET_PATH {limit} " in (REPO / "nvlfabric/nodeagent/keeper/settings.h").read_text()
    keepers.program()
    root = _root_for(names.imex_keeper_socket, limit + 1)
    proc = subprocess.run([str(keepers.program()), "--kubelet-root", root], capture_output=True, text=True,
                          timeout=10, env={k: v for k, v in os.environ.items() if k != "KUBELET_ROOT"})
    assert proc.returncode == 2 and f"may be ({limit} bytes)" in proc.stderr, proc.stderr


def test_the_default_pool_size_is_the_contracts_in_the_component_and_the_controller() -> None:
    from nvlfabric.controller.reconcile import Controller
    from nvlfabric.controller.reservations import Reserver

    default = names.DEFAULT_CHANNELS_PER_CLIQUE
    assert NvlfabricDriverArgs().channels_per_clique == default
    assert inspect.signature(Controller).parameters["channels_per_clique"].default == default
    assert inspect.signature(Reserver).parameters["channels_per_clique"].default == default
    assert default <= names.MAX_DEVICES_PER_SLICE  # one ResourceSlice's worth


def test_a_claims_consumers_are_counted_against_the_contracts_limit() -> None:
    from nvlfabric.controller import reservationplan

    assert reservationplan.MAX_RESERVED == names.MAX_PODS_PER_CLAIM


def test_the_kubelets_budget_is_the_agents_and_the_simulated_kubelets() -> None:
    from nvlfabric.daemon.metrics import DEFAULT_BUCKETS
    from nvlfabric.nodeagent import checkpointstate
    from nvlfabric.sim.kubelet import plugins

    budget = names.KUBELET_PREPARE_TIMEOUT_S
    assert budget == plugins.CALL_TIMEOUT_S  # how long the simulated kubelet waits for a prepare
    assert checkpointstate.STALE_PREPARE_WINDOW.total_seconds() == 2 * budget
    assert DEFAULT_BUCKETS[-1] == budget  # the prepare histogram ends where the kubelet gives up
    source = (REPO / "nvlfabric/nodeagent/imexdomains.py").read_text()
    assert "45 s" not in source and "names.KUBELET_PREPARE_TIMEOUT_S:g} s budget" in source


def test_the_simulated_hardware_is_the_contracts_gb200() -> None:
    from nvlfabric.sim import nodes
    from nvlfabric.sim.nvml import topology

    assert topology.GPUS_PER_NODE == nodes.GPUS_PER_NODE == names.GPUS_PER_NODE
    assert topology.NODES_PER_RACK == nodes.NODES_PER_RACK == names.NODES_PER_CLIQUE


@pytest.mark.parametrize("length", [1, names.DNS_LABEL_MAX - 6, names.DNS_LABEL_MAX, names.DNS_LABEL_MAX + 1])
def test_a_computedomain_name_is_judged_alike_by_the_component_both_backends_and_the_crd(length: int) -> None:
    from nvlfabric.api.computedomain import ObjectMeta
    from nvlfabric.components.computedomain import ComputeDomainArgs, NvidiaComputeDomainArgs
    from nvlfabric.provider.nvidiadomain import NvidiaArgs
    from nvlfabric.provider.nvlfabricdomain import NvlfabricArgs

    name = "a" * length

    def accepts(model: Any, **extra: Any) -> bool:
        try:
            model.model_validate({"name": name, **extra})
        except ValidationError:
            return False
        return True

    verdicts = {accepts(ObjectMeta), accepts(ComputeDomainArgs), accepts(NvidiaComputeDomainArgs, backend="nvidia"),
                accepts(NvlfabricArgs), accepts(NvidiaArgs, backend="nvidia")}
    assert verdicts == {length <= names.DNS_LABEL_MAX}


def test_a_computedomains_timeout_defaults_alike_in_the_component_and_both_backends() -> None:
    from nvlfabric.components.computedomain import ComputeDomain, ComputeDomainArgs
    from nvlfabric.provider.domaininputs import DEFAULT_TIMEOUT_S, SETTINGS
    from nvlfabric.provider.nvidiadomain import NvidiaArgs
    from nvlfabric.provider.nvlfabricdomain import NvlfabricArgs

    assert inspect.signature(ComputeDomain).parameters["timeout_s"].default == DEFAULT_TIMEOUT_S
    assert ComputeDomainArgs(name="cd").timeout_s == SETTINGS["timeout_s"] == DEFAULT_TIMEOUT_S
    assert NvlfabricArgs(name="cd").timeout_s == NvidiaArgs(name="cd", backend="nvidia").timeout_s == DEFAULT_TIMEOUT_S


def test_no_two_models_of_the_contract_components_or_provider_share_a_name() -> None:
    """Two `ComputeDomainArgs` (the component's, the provider's) read as one model and were two
    with different limits: each model has a name of its own."""
    homes: dict[str, set[str]] = {}
    for package in ("nvlfabric.api", "nvlfabric.components", "nvlfabric.provider"):
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for cls in vars(module).values():
                if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == info.name:
                    homes.setdefault(cls.__name__, set()).add(info.name)
    assert {n: sorted(m) for n, m in homes.items() if len(m) > 1} == {}


def test_the_node_report_and_claim_hold_protocols_have_modules_of_their_own() -> None:
    """They left api/computedomain.py without a re-export there: no stack state can name them. Pulumi
    pickles a dynamic provider by reference (its class's module path) with only its own attributes,
    none of them from nvlfabric.api; tests/packaging/test_release.py keeps those paths importable."""
    import dill  # type: ignore[import-untyped]

    from nvlfabric.api import claimhold, computedomain, nodereports
    from nvlfabric.provider.computedomain import ComputeDomainProvider
    from nvlfabric.provider.deviceclass import DeviceClassProvider
    from nvlfabric.provider.racknodes import RackNodesProvider

    moved = {nodereports: ("NodeReport", "node_report", "node_report_key", "node_reports"),
             claimhold: ("hold_consumer", "is_hold", "release_hold_patch")}
    for module, moved_names in moved.items():
        assert set(module.__all__) == set(moved_names)
        assert not [n for n in moved_names if hasattr(computedomain, n)], "no second home"
    for provider in (ComputeDomainProvider(), DeviceClassProvider(), RackNodesProvider()):
        assert b"nvlfabric.api" not in dill.dumps(provider, recurse=True)
    entry = claimhold.hold_consumer("cd", "uid-1")
    assert claimhold.is_hold(entry) and not claimhold.is_hold({"resource": "pods", "name": "p", "uid": "u"})
    report = nodereports.node_report("ns", "cd", computedomain.NodeStatus(name="n0", ready=True))
    (key,) = report
    assert key.startswith(names.NODE_REPORT_PREFIX) and nodereports.node_reports(report)[0].entry.ready


def test_the_imex_domain_ids_the_agent_records_are_the_ones_it_reads_back() -> None:
    """Ids live on in checkpoints and the keeper's directories: one spelling, made and read in imexconfig."""
    from nvlfabric.nodeagent import imexconfig

    clique, uid = CLIQUE, "0b7e4c4e-51b5-4f0e-9d7a-2f3f3f6c1a11"
    assert imexconfig.clique_domain_id(clique) == f"clique-{clique}"  # as agents before issue 50 recorded them
    assert imexconfig.dedicated_domain_id(uid) == f"cd-{uid}"
    assert imexconfig.clique_of_domain(imexconfig.clique_domain_id(clique)) == clique
    assert imexconfig.is_dedicated(imexconfig.dedicated_domain_id(uid))
    assert not imexconfig.is_dedicated(imexconfig.clique_domain_id(clique))
    assert all(imexconfig.is_domain_id(d) for d in (imexconfig.clique_domain_id(clique),
                                                    imexconfig.dedicated_domain_id(uid)))


@pytest.mark.parametrize(("devices", "effect"), [("DevicePlugin", "NoSchedule"), ("DRA", "NoExecute"), ("DRA", "None")])
def test_the_agents_read_the_gpu_settings_the_component_gives_them(devices: str, effect: str) -> None:
    """NvlfabricDriver(gpu_devices, gpu_taint_effect) → the agents' DaemonSet env → the agent's
    settings; DRA also lets the GPU DeviceClass serve nvidia.com/gpu, DevicePlugin must not (a GPU
    would be handed out twice)."""
    from nvlfabric.nodeagent.settings import parse

    objs = driver_objects(NvlfabricDriverArgs(gpu_devices=devices, gpu_taint_effect=effect))  # type: ignore[arg-type]
    agent = next(o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvlfabric-agent")
    env = {e["name"]: e["value"] for e in agent["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    cfg = parse([], {**env, "NODE_NAME": "gb-1", "NODE_IP": "10.0.0.1"})
    assert (cfg.publish_gpus, cfg.gpu_taint_effect) == (devices == "DRA", effect)
    assert set(names.GPU_TAINT_EFFECTS) == set(NvlfabricDriverArgs.model_fields["gpu_taint_effect"].annotation.__args__)
    (gpu_class,) = [o for o in objs if o["kind"] == "DeviceClass" and o["metadata"]["name"] == names.GPU_DEVICE_CLASS]
    assert gpu_class["spec"].get("extendedResourceName") == (names.GPU_RESOURCE if devices == "DRA" else None)
    with pytest.raises(ValidationError, match="gpu_taint_effect"):
        NvlfabricDriverArgs(gpu_taint_effect="Evict")  # type: ignore[arg-type]
    node = {"NODE_NAME": "gb-1", "NODE_IP": "10.0.0.1"}
    with pytest.raises(SettingsError, match=r"--gpu-taint-effect / \$GPU_TAINT_EFFECT: 'Evict' is not one of No"):
        parse([], {**node, "GPU_TAINT_EFFECT": "Evict"})
    with pytest.raises(SettingsError, match=r"--publish-gpus / \$PUBLISH_GPUS: 'yes' is not one of true, false"):
        parse(["--publish-gpus", "yes"], node)
