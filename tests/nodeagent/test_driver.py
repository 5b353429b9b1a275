"""Prepare/unprepare of a ComputeDomain channel claim, end to end on one simulated node pair:
real API server and scheduler, real IMEX stand-in daemons, real device nodes and CDI specs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    CELDeviceSelector,
    DeviceClaim,
    DeviceClaimConfiguration,
    DeviceClassSpec,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    OpaqueDeviceConfiguration,
    ResourceClaimSpec,
)
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.channelconfig import ChannelConfig, ComputeDomainRef
from nvlfabric.api.names import DRIVER
from nvlfabric.controller import pools
from nvlfabric.controller.reconcile import ComputeDomainResource
from nvlfabric.nodeagent import checkpoint, kubeapi
from nvlfabric.nodeagent.driver import ChannelDriver, NodeIdentity, Paths
from nvlfabric.nodeagent.server import ClaimRef
from nvlfabric.sim import hardware
from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes
from nvlfabric.sim.kubelet import cdi as runtime_cdi
from nvlfabric.sim.nodes import IMEX_CHANNELS_MAJOR, SimNode, rack_nodes, runtime_root
from tests.conftest import Cluster
from tests.support.keepers import Keeper

pytestmark = pytest.mark.cluster
CLASS = names.DEVICE_CLASS


@dataclass
class Setup:
    clique: str
    nodes: list[SimNode]
    drivers: dict[str, ChannelDriver]
    client: Client
    agent_client: kubeapi.Client
    keepers: dict[str, Keeper] = field(default_factory=dict)
    """Each node's IMEX keeper (the C program, as its DaemonSet runs it), started with its first driver."""

    def keeper(self, node: SimNode) -> Path:
        """The socket of `node`'s keeper, started on first use."""
        if node.name not in self.keepers:
            paths = self.paths(node)
            self.keepers[node.name] = Keeper.start(paths.imex_workdir, node.driver_root,
                                                   log=node.dir / "imex-keeper.log")
        return self.keepers[node.name].socket

    def paths(self, node: SimNode) -> Paths:
        boot = node.dir / "boot_id"
        if not boot.exists():
            boot.write_text(str(uuid.uuid4()) + "\n")
        return Paths(plugin_dir=node.kubelet_root / "plugins" / DRIVER, cdi_dir=node.cdi_dirs[1],
                     driver_root=node.driver_root, proc_devices=node.proc_devices, boot_id=boot)

    def driver(self, node: SimNode) -> ChannelDriver:
        return ChannelDriver(client=self.agent_client, node=NodeIdentity(node.name, node.address, self.clique),
                             paths=self.paths(node), imex_keeper=self.keeper(node))


@pytest.fixture
def setup(cluster: Cluster) -> Iterator[Setup]:
    client = cluster.client
    state = Path(tempfile.mkdtemp(prefix="nvld-", dir="/tmp"))
    nodes = rack_nodes(state, racks=1, nodes_per_rack=2, first_rack=200)
    built = hardware.build_standins()
    for n in nodes:
        n.prepare_dirs()
        hardware.install_driver_root(n, built)
    clique = f"{uuid.uuid4()}.32766"
    install_crd(client)
    make_ready_nodes(client, {n.name: {pools.CLIQUE_LABEL: clique} for n in nodes},
                     addresses={n.name: n.address for n in nodes})
    pools.apply(client, clique, channels=4)
    with contextlib.suppress(ApiError):
        client.create(DeviceClass(metadata=ObjectMeta(name=CLASS), spec=DeviceClassSpec(selectors=[
            DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{DRIVER}"'))])))
    agent_client = kubeapi.Client(kubeapi.from_kubeconfig(cluster.kubeconfig), field_manager="nvlfabric-tests")
    s = Setup(clique=clique, nodes=nodes, drivers={}, client=client, agent_client=agent_client)
    yield s
    for d in s.drivers.values():
        d.stop()
    for k in s.keepers.values():
        k.terminate(10)  # stops its daemons, as the keeper's pod going does
    delete_nodes(client, [n.name for n in nodes])
    pools.withdraw(client, clique)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(runtime_root(state), ignore_errors=True)
    agent_client.close()


def compute_domain(s: Setup, node: SimNode) -> tuple[str, ClaimRef]:
    """A ComputeDomain with its shared claim (as the provider makes them) and one pod on `node`."""
    client, name = s.client, f"cd-{uuid.uuid4().hex[:6]}"
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec={}))
    config = ChannelConfig(compute_domain=ComputeDomainRef(name=name, namespace="default", uid=cd.metadata.uid))
    claim = client.create(ResourceClaim(metadata=ObjectMeta(name=f"{name}-channel", namespace="default"),
                                        spec=ResourceClaimSpec(devices=DeviceClaim(
                                            requests=[DeviceRequest(name="channel", exactly=ExactDeviceRequest(
                                                deviceClassName=CLASS))],
                                            config=[DeviceClaimConfiguration(opaque=OpaqueDeviceConfiguration(
                                                driver=DRIVER, parameters=config.to_kube()))]))))
    client.create(Pod(metadata=ObjectMeta(name=f"{name}-0", namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{name}-channel")],
        containers=[Container(name="w", image="registry.invalid/w:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
    eventually("the claim to be allocated", lambda: client.get(
        ResourceClaim, f"{name}-channel", namespace="default").status.allocation)
    return name, ClaimRef(namespace="default", name=f"{name}-channel", uid=claim.metadata.uid)


def cleanup(s: Setup, name: str) -> None:
    for kind, n in ((Pod, f"{name}-0"), (ResourceClaim, f"{name}-channel"), (ComputeDomainResource, name)):
        with contextlib.suppress(ApiError):
            s.client.delete(kind, n, namespace="default", **({"grace_period": 0} if kind is Pod else {}))


def test_prepare_gives_the_channel_device_and_unprepare_takes_it_back(setup: Setup) -> None:
    node = setup.nodes[0]
    name, ref = compute_domain(setup, node)
    try:
        driver = setup.drivers[node.name] = setup.driver(node)
        result = driver.prepare([ref])[ref.uid]
        assert not isinstance(result, str), result
        (device,) = result
        channel = int(device.device_name.removeprefix("channel-"))
        assert device.pool_name == pools.pool_name(setup.clique) and device.request_names == ("channel",)
        # What the container runtime would inject for this claim:
        edits = runtime_cdi.resolve(node.cdi_dirs, list(device.cdi_device_ids))
        assert [(d.path, d.type, d.major, d.minor) for d in edits.device_nodes] == [
            (f"/dev/nvidia-caps-imex-channels/channel{channel}", "c", IMEX_CHANNELS_MAJOR, channel)]
        assert f"NVLFABRIC_COMPUTE_DOMAIN={name}" in edits.env
        host_node = node.driver_root / "dev" / "nvidia-caps-imex-channels" / f"channel{channel}"
        st = host_node.stat()
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (IMEX_CHANNELS_MAJOR,
                                                                                                channel)
        entry = driver.state.get(ref.uid)
        assert entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED
        # Its entry for the domain, on its own Node (the controller copies it into the domain's status).
        (report,) = api.node_reports(setup.client.get(Node, node.name).metadata.annotations)
        assert (report.namespace, report.name) == ("default", name)
        assert report.entry.model_dump(exclude_none=True) == {"name": node.name, "address": node.address,
                                                              "clique": setup.clique, "ready": True}

        t0 = time.monotonic()
        again = driver.prepare([ref])[ref.uid]
        assert again == result and time.monotonic() - t0 < 1.0  # idempotent, no second setup

        # A restarted agent finds the claim in its checkpoint and answers the same.
        driver.stop()
        restarted = setup.drivers[node.name] = setup.driver(node)
        assert restarted.prepare([ref])[ref.uid] == result

        assert restarted.unprepare([ref]) == {ref.uid: ""}
        assert not list(node.cdi_dirs[1].glob("*.json")) and not host_node.exists()
        assert restarted.state.get(ref.uid) is None
        assert not api.node_reports(setup.client.get(Node, node.name).metadata.annotations)  # withdrawn
        assert restarted.unprepare([ref]) == {ref.uid: ""}  # idempotent
        saved = json.loads((node.kubelet_root / "plugins" / DRIVER / "checkpoint.json").read_text())
        assert saved["claims"] == {}
    finally:
        cleanup(setup, name)


def test_a_replaced_claim_or_a_foreign_clique_is_refused_with_the_reason(setup: Setup) -> None:
    node = setup.nodes[1]
    name, ref = compute_domain(setup, node)
    try:
        driver = setup.drivers[node.name] = setup.driver(node)
        stale = ClaimRef(namespace=ref.namespace, name=ref.name, uid="0000-old-uid")
        assert "got replaced" in str(driver.prepare([stale])[stale.uid])
        other = ChannelDriver(client=setup.agent_client, node=NodeIdentity(node.name, node.address, "elsewhere.1"),
                              paths=setup.paths(node), imex_keeper=setup.keeper(node))
        msg = str(other.prepare([ref])[ref.uid])
        assert f"allocated in clique {setup.clique}" in msg and "is in clique elsewhere.1" in msg
        assert driver.state.get(ref.uid) is None  # nothing recorded for refused claims
    finally:
        cleanup(setup, name)


def test_an_imex_mode_the_driver_does_not_allow_is_refused_naming_the_setting(setup: Setup) -> None:
    node = setup.nodes[0]
    name, ref = compute_domain(setup, node)
    try:
        only_dedicated = ChannelDriver(client=setup.agent_client, paths=setup.paths(node),
                                       node=NodeIdentity(node.name, node.address, setup.clique),
                                       imex_keeper=setup.keeper(node),
                                       imex_modes=frozenset({api.IMEXMode.DEDICATED}))
        setup.drivers[node.name] = only_dedicated
        msg = str(only_dedicated.prepare([ref])[ref.uid])
        assert "imexMode CliqueScoped is not enabled" in msg and "NvlfabricDriver imex_modes" in msg, msg
        assert only_dedicated.state.get(ref.uid) is None
    finally:
        cleanup(setup, name)
