"""Prepare/unprepare of a ComputeDomain channel claim, end to end on one simulated node pair:
real API server and scheduler, real IMEX stand-in daemons, real device nodes and CDI specs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.names import DRIVER
from nvlfabric.api.nodereports import node_reports
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.nodeagent import cdi, checkpoint, imexkeeper, kubeapi
from nvlfabric.nodeagent.driver import ChannelDriver, NodeIdentity, Paths
from nvlfabric.nodeagent.server import ClaimRef
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim import hardware
from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes
from nvlfabric.sim.kubelet import cdi as runtime_cdi
from nvlfabric.sim.nodes import IMEX_CHANNELS_MAJOR, SimNode, rack_nodes, runtime_root
from tests.conftest import Cluster
from tests.support.keepers import Keeper

pytestmark = pytest.mark.cluster
CLASS = names.DEVICE_CLASS


class CountingClient(kubeapi.Client):
    """The agent's client, recording each request it makes (method, path)."""

    def __init__(self, config: kubeapi.Config, *, field_manager: str) -> None:
        super().__init__(config, field_manager=field_manager)
        self.requests: list[tuple[str, str]] = []

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> kubeapi.JSON:
        self.requests.append((method, path))
        return super().request(method, path, body, **kwargs)

    def gets(self, plural: str) -> list[str]:
        """The paths of the GETs of objects of `plural` (not lists) since the last `requests.clear()`."""
        return [p for m, p in self.requests if m == "GET" and f"/{plural}/" in p]


@dataclass
class Setup:
    clique: str
    nodes: list[SimNode]
    drivers: dict[str, ChannelDriver]
    client: Client
    agent_client: CountingClient
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
    agent_client = CountingClient(kubeapi.from_kubeconfig(cluster.kubeconfig), field_manager="nvlfabric-tests")
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


def compute_domain(s: Setup, node: SimNode, spec: dict[str, Any] | None = None, *, group: int = 0,
                   claim: Callable[[dict[str, Any], str], None] | None = None) -> tuple[str, ClaimRef]:
    """A ComputeDomain with its shared claim (as the provider makes them: nvlfabric/provider's
    `channel_claim`, owned by the domain) and one pod on `node`; `claim` edits the claim's body
    first (given the domain's UID), for claims the provider would not make."""
    client, name = s.client, f"cd-{uuid.uuid4().hex[:6]}"
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec=spec or {}))
    body = channel_claim(name, "default", cd.metadata.uid, api.ComputeDomainSpec.model_validate(spec or {}), group)
    if claim is not None:
        claim(body, cd.metadata.uid)
    made = client.create(codecs.from_dict(body))
    return name, pod_for(s, node, name, ClaimRef(namespace="default", name=made.metadata.name, uid=made.metadata.uid))


def pod_for(s: Setup, node: SimNode, name: str, ref: ClaimRef, index: int = 0) -> ClaimRef:
    """A pod `<name>-<index>` of the claim on `node`; returns the claim once it is allocated."""
    s.client.create(Pod(metadata=ObjectMeta(name=f"{name}-{index}", namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=ref.name)],
        containers=[Container(name="w", image="registry.invalid/w:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))
    eventually("the claim to be allocated and reserved", lambda: (
        (st := s.client.get(ResourceClaim, ref.name, namespace="default").status) and st.allocation
        and st.reservedFor))
    return ref


def channel_of(s: Setup, ref: ClaimRef) -> int:
    alloc = s.client.get(ResourceClaim, ref.name, namespace="default").status.allocation
    return int(alloc.devices.results[0].device.removeprefix("channel-"))


def cleanup(s: Setup, name: str, claim: str | None = None, pods: int = 1) -> None:
    for i in range(pods):
        with contextlib.suppress(ApiError):
            s.client.delete(Pod, f"{name}-{i}", namespace="default", grace_period=0)
    for kind, n in ((ResourceClaim, claim or f"{name}-channel"), (ComputeDomainResource, name)):
        with contextlib.suppress(ApiError):
            s.client.delete(kind, n, namespace="default")


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
        (report,) = node_reports(setup.client.get(Node, node.name).metadata.annotations)
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
        assert not node_reports(setup.client.get(Node, node.name).metadata.annotations)  # withdrawn
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


# ----------------------------------------------------------------------------------------------
# Issue 49: a tenant's pod gets its own domain's channel and nothing else.

ALL = {"imexMode": "Dedicated", "channelAllocationMode": "All"}
MADE_BY_DOMAIN = "a channel claim is made by its ComputeDomain: declare the domain, and name its claim"


def dedicated_slot(s: Setup, name: str, slot: int = 1) -> None:
    """The IMEX port slot the controller would give a Dedicated domain (no controller runs here)."""
    s.client.patch(ComputeDomainResource.Status, name, {"status": {"imexPortSlot": slot}}, namespace="default",
                   patch_type=PatchType.MERGE)


def channel_nodes(node: SimNode) -> set[int]:
    return {int(p.name.removeprefix("channel"))
            for p in (node.driver_root / "dev" / "nvidia-caps-imex-channels").glob("channel*")}


def injected(node: SimNode, ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """(the channels, the env) the container runtime would give a container for these CDI devices."""
    edits = runtime_cdi.resolve(node.cdi_dirs, list(ids))
    assert all((d.path, d.type, d.major) == (f"/dev/nvidia-caps-imex-channels/channel{d.minor}", "c",
                                            IMEX_CHANNELS_MAJOR) for d in edits.device_nodes), edits.device_nodes
    return [d.minor for d in edits.device_nodes], list(edits.env)


def dedicated_daemon(s: Setup, node: SimNode, uid: str) -> int | None:
    """The pid of the Dedicated domain's daemon the node's keeper runs."""
    return imexkeeper.KeeperDomain(s.keeper(node), domain_id=f"cd-{uid}", workdir=s.paths(node).imex_workdir,
                                   driver_root=node.driver_root, bind_address=node.address).pid


def test_a_cold_prepare_reads_the_claim_and_its_domain_once_and_a_warm_one_nothing(setup: Setup) -> None:
    node = setup.nodes[0]
    name, ref = compute_domain(setup, node)
    try:
        driver = setup.drivers[node.name] = setup.driver(node)
        setup.agent_client.requests.clear()
        first = driver.prepare([ref])[ref.uid]
        assert not isinstance(first, str), first
        assert setup.agent_client.gets("resourceclaims") == [f"/apis/resource.k8s.io/v1/namespaces/default/"
                                                             f"resourceclaims/{ref.name}"]
        assert setup.agent_client.gets("computedomains") == [f"/apis/{api.API_VERSION}/namespaces/default/"
                                                             f"computedomains/{name}"]
        setup.agent_client.requests.clear()
        assert driver.prepare([ref])[ref.uid] == first and setup.agent_client.requests == []  # warm: API-free
        driver.stop()
        restarted = setup.drivers[node.name] = setup.driver(node)
        setup.agent_client.requests.clear()
        assert restarted.prepare([ref])[ref.uid] == first  # cold again, answered from the checkpoint
        assert [p.rsplit("/", 2)[1] for m, p in setup.agent_client.requests if m == "GET"] == [
            "resourceclaims", "computedomains"]
    finally:
        cleanup(setup, name)


def test_an_all_claim_gets_its_own_channel_not_the_other_domain_s_on_its_node(setup: Setup) -> None:
    """channelAllocationMode All: every channel of the claim's own ComputeDomain on this node (the
    one its claim holds), under the set's device name; not channel 0..2047, which would hand the
    pod the channel of another team's domain prepared on the same node."""
    node = setup.nodes[0]
    other, other_ref = compute_domain(setup, node)
    name, ref = compute_domain(setup, node, ALL)
    try:
        dedicated_slot(setup, name)
        driver = setup.drivers[node.name] = setup.driver(node)
        theirs = driver.prepare([other_ref])[other_ref.uid]
        assert not isinstance(theirs, str), theirs
        setup.agent_client.requests.clear()
        result = driver.prepare([ref])[ref.uid]
        assert not isinstance(result, str), result
        own, their_channel = channel_of(setup, ref), channel_of(setup, other_ref)
        assert own != their_channel
        (device,) = result
        assert device.device_name == f"channel-{own}"
        assert device.cdi_device_ids == (f"{names.CDI_KIND}={ref.uid}-channels",)  # the set's name (cdi.py)
        channels, env = injected(node, device.cdi_device_ids)
        assert channels == [own] and f"NVLFABRIC_IMEX_CHANNEL={own}" in env
        assert f"NVLFABRIC_COMPUTE_DOMAIN={name}" in env
        entry = driver.state.get(ref.uid)
        assert entry is not None and entry.allocation.channels == (own,) and entry.allocation.all_channels
        saved = json.loads(setup.paths(node).checkpoint.read_text())["claims"][ref.uid]
        assert (saved["channels"], saved["channelAllocationMode"]) == ([own], "All")
        assert channel_nodes(node) == {own, their_channel}
        # One read of the domain for both the owner check and the dedicated IMEX view.
        assert len(setup.agent_client.gets("computedomains")) == 1, setup.agent_client.requests
        assert dedicated_daemon(setup, node, entry.allocation.compute_domain_uid)

        assert driver.unprepare([ref]) == {ref.uid: ""}
        assert channel_nodes(node) == {their_channel}
        assert injected(node, theirs[0].cdi_device_ids)[0] == [their_channel]  # the other claim as it was
    finally:
        cleanup(setup, name)
        cleanup(setup, other)


def _checksum(obj: dict[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                 ensure_ascii=False).encode()).hexdigest()


def as_an_earlier_agent_left_it(paths: Paths, uid: str, domain: str, *, spec: bool) -> None:
    """The claim as an agent before issue 49 prepared allocation mode All: its checkpoint entry
    with channels 0..2047 and no channelAllocationMode; with `spec`, its CDI spec (2048 device
    nodes, device `<uid>-channels`) and every channel's node under the driver root."""
    raw = json.loads(paths.checkpoint.read_text())
    entry = raw["claims"][uid]
    entry["channels"] = list(range(names.IMEX_CHANNEL_COUNT))
    entry.pop("channelAllocationMode", None)  # (an earlier agent never wrote it)
    raw["checksum"] = _checksum(raw)
    paths.checkpoint.write_text(json.dumps(raw))
    if spec:
        every = range(names.IMEX_CHANNEL_COUNT)
        cdi.write_claim_spec(paths.cdi_dir, uid, cdi.claim_spec(claim_uid=uid, channels=every,
                                                                major=IMEX_CHANNELS_MAJOR, compute_domain=domain))
        for ch in every:
            cdi.channel_device_node(paths.driver_root, ch, IMEX_CHANNELS_MAJOR)


def test_an_all_claim_an_earlier_agent_gave_every_channel_is_narrowed_at_start(
        setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    node = setup.nodes[1]
    other, other_ref = compute_domain(setup, node)
    name, ref = compute_domain(setup, node, ALL)
    paths = setup.paths(node)
    try:
        dedicated_slot(setup, name)
        driver = setup.drivers[node.name] = setup.driver(node)
        first = driver.prepare([other_ref, ref])
        assert all(not isinstance(r, str) for r in first.values()), first
        own, their_channel = channel_of(setup, ref), channel_of(setup, other_ref)
        entry = driver.state.get(ref.uid)
        assert entry is not None
        answer = first[ref.uid]
        assert not isinstance(answer, str)
        cd_uid, ids = entry.allocation.compute_domain_uid, answer[0].cdi_device_ids
        daemon = dedicated_daemon(setup, node, cd_uid)
        assert daemon
        driver.stop()
        as_an_earlier_agent_left_it(paths, ref.uid, name, spec=True)
        assert injected(node, ids)[0] == list(range(names.IMEX_CHANNEL_COUNT))  # the hole: their channel too

        with caplog.at_level(logging.WARNING, logger="nvlfabric.nodeagent.driver"):
            restarted = setup.drivers[node.name] = setup.driver(node)  # the upgraded agent starts
        entry = restarted.state.get(ref.uid)
        assert entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED
        assert entry.allocation.channels == (own,) and entry.allocation.all_channels
        assert entry.cdi_device_ids == ids  # what the kubelet holds still resolves
        channels, env = injected(node, ids)
        assert channels == [own] and f"NVLFABRIC_IMEX_CHANNEL={own}" in env
        cp, report = checkpoint.load(paths.checkpoint, paths.boot_id)
        assert report.status is checkpoint.LoadStatus.LOADED and not report.skipped_entries
        assert cp.get(ref.uid) == entry
        saved = json.loads(paths.checkpoint.read_text())["claims"][ref.uid]
        assert (saved["channels"], saved["channelAllocationMode"]) == ([own], "All")
        assert f"claim default/{ref.name} ({ref.uid}, PrepareCompleted): narrowed from every channel" in caplog.text
        assert dedicated_daemon(setup, node, cd_uid) == daemon  # no IMEX daemon touched

        restarted.housekeeping(clique=setup.clique)  # recovery's sweep: the nodes no claim uses go
        assert channel_nodes(node) == {own, their_channel}
        assert dedicated_daemon(setup, node, cd_uid) == daemon
        assert restarted.prepare([ref, other_ref]) == first  # answered as before, from the checkpoint

        # Killed after the spec's rewrite, before the checkpoint's save: the next start finishes.
        restarted.stop()
        as_an_earlier_agent_left_it(paths, ref.uid, name, spec=False)
        again = setup.drivers[node.name] = setup.driver(node)
        narrowed = again.state.get(ref.uid)
        assert narrowed is not None and narrowed.allocation.channels == (own,) and narrowed.cdi_device_ids == ids
        assert injected(node, ids)[0] == [own]
        assert again.unprepare([ref, other_ref]) == {ref.uid: "", other_ref.uid: ""}
        assert channel_nodes(node) == set() and not list(paths.cdi_dir.glob("*.json"))
    finally:
        cleanup(setup, name)
        cleanup(setup, other)


def _bad_owner(owner: dict[str, str]) -> Callable[[Setup, str, ClaimRef], None]:
    """Replace the claim's owner references once it is allocated and reserved (so the garbage
    collector, finding no such owner, can only mark it deleted: a reserved claim stays)."""
    def edit(s: Setup, name: str, ref: ClaimRef) -> None:
        cd = s.client.get(ComputeDomainResource, name, namespace="default")
        ref_owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": name, "uid": cd.metadata.uid, **owner}
        s.client.patch(ResourceClaim, ref.name, {"metadata": {"ownerReferences": [ref_owner]}}, namespace="default",
                       patch_type=PatchType.MERGE)
    return edit


@pytest.mark.parametrize(("case", "expected"), [
    ("no domain", "names ComputeDomain default/{name}, which does not exist"),
    ("another namespace's uid", "its configuration names ComputeDomain default/{name} with uid {config_uid}, but "
                                "default/{name} has uid {uid}: the claim is not that domain's"),
    ("owner of version v9", "is not owned by ComputeDomain default/{name}: it needs the owner reference apiVersion "
                            f"{api.API_VERSION}, kind {api.KIND}, name {{name}}, uid {{uid}}, and has nvlfabric.io/v9 "
                            "ComputeDomain {name} (uid {uid})"),
    ("owner of another kind", "is not owned by ComputeDomain default/{name}: it needs the owner reference "
                              f"apiVersion {api.API_VERSION}, kind {api.KIND}, name {{name}}, uid {{uid}}, and has "
                              f"{api.API_VERSION} ConfigMap {{name}} (uid {{uid}})"),
    ("not the domain's claim name", "is not a channel claim of ComputeDomain default/{name}, whose claim is "
                                    "{name}-channel"),
])
def test_a_claim_that_is_not_its_domain_s_own_is_refused_saying_why(setup: Setup, case: str, expected: str) -> None:
    """A tenant's hand-written claim gets no channel: the agent reads the domain the claim's config
    names and refuses unless it exists with the config's UID, owns the claim, and names it."""
    node, client = setup.nodes[0], setup.client
    other_ns = f"nvlt-{uuid.uuid4().hex[:6]}"
    config_uid: str | None = None
    after: Callable[[Setup, str, ClaimRef], None] | None = None

    def edit(body: dict[str, Any], uid: str) -> None:
        nonlocal config_uid
        params = body["spec"]["devices"]["config"][0]["opaque"]["parameters"]["computeDomain"]
        if case == "no domain":  # the config and the owner name a domain that is not there
            params["name"] = body["metadata"]["name"].removesuffix("-channel") + "-gone"
            body["metadata"]["name"] = params["name"] + "-channel"
            del body["metadata"]["ownerReferences"]  # (or the garbage collector takes the claim)
        elif case == "another namespace's uid":  # copied from `kubectl get -o yaml` of another team's domain
            params["uid"] = config_uid = other.metadata.uid
        elif case == "not the domain's claim name":
            body["metadata"]["name"] = body["metadata"]["name"] + "-extra"

    if case == "owner of version v9":
        after = _bad_owner({"apiVersion": "nvlfabric.io/v9"})
    elif case == "owner of another kind":
        after = _bad_owner({"kind": "ConfigMap"})
    name = ""
    ref: ClaimRef | None = None
    try:
        client.create(Namespace(metadata=ObjectMeta(name=other_ns)))
        other = client.create(ComputeDomainResource(metadata=ObjectMeta(name="twin", namespace=other_ns), spec={}))
        name, ref = compute_domain(setup, node, claim=edit)
        if after is not None:
            after(setup, name, ref)
        domain = params_name(setup, ref)
        uid = client.get(ComputeDomainResource, name, namespace="default").metadata.uid if domain == name else ""
        driver = setup.drivers[node.name] = setup.driver(node)
        msg = driver.prepare([ref])[ref.uid]
        assert isinstance(msg, str), f"{case}: prepared {msg}"
        assert msg.startswith(f"claim default/{ref.name}"), msg
        assert expected.format(name=domain, uid=uid, config_uid=config_uid) in msg, msg
        assert MADE_BY_DOMAIN in msg and "resourceClaimName" in msg, msg
        assert other_ns not in msg and "twin" not in msg, msg  # nothing of another namespace
        assert driver.state.get(ref.uid) is None and not list(node.cdi_dirs[1].glob("*.json"))
        assert channel_nodes(node) == set()
    finally:
        if ref is not None:
            cleanup(setup, name, ref.name)
        with contextlib.suppress(ApiError):
            client.delete(Namespace, other_ns)


def params_name(s: Setup, ref: ClaimRef) -> str:
    """The ComputeDomain the claim's config names."""
    claim = s.client.get(ResourceClaim, ref.name, namespace="default")
    return str(claim.spec.devices.config[0].opaque.parameters["computeDomain"]["name"])


@pytest.mark.parametrize(("spec", "group"), [
    ({"channelClaim": {"name": "shared-{hex}"}}, 0),
    ({"placement": {"scope": "MultiClique", "cliques": 2}}, 1),
], ids=["channelClaim name", "MultiClique group 1"])
def test_the_provider_s_claims_prepare(setup: Setup, spec: dict[str, Any], group: int) -> None:
    node = setup.nodes[1]
    spec = json.loads(json.dumps(spec).replace("{hex}", uuid.uuid4().hex[:6]))
    name, ref = compute_domain(setup, node, spec, group=group)
    try:
        assert ref.name in api.channel_claim_names(name, api.ComputeDomainSpec.model_validate(spec))
        driver = setup.drivers[node.name] = setup.driver(node)
        result = driver.prepare([ref])[ref.uid]
        assert not isinstance(result, str), result
        assert driver.unprepare([ref]) == {ref.uid: ""}
    finally:
        cleanup(setup, name, ref.name)


def test_a_domain_being_deleted_keeps_its_prepared_claim_and_prepares_it_for_no_new_pod(setup: Setup) -> None:
    first_node, second_node = setup.nodes
    name, ref = compute_domain(setup, first_node)
    try:
        driver = setup.drivers[first_node.name] = setup.driver(first_node)
        first = driver.prepare([ref])[ref.uid]
        assert not isinstance(first, str), first
        pod_for(setup, second_node, name, ref, index=1)
        setup.client.patch(ComputeDomainResource, name, {"metadata": {"finalizers": ["nvlfabric.io/test-hold"]}},
                           namespace="default", patch_type=PatchType.MERGE)
        setup.client.delete(ComputeDomainResource, name, namespace="default")
        assert setup.client.get(ComputeDomainResource, name, namespace="default").metadata.deletionTimestamp
        driver.stop()
        restarted = setup.drivers[first_node.name] = setup.driver(first_node)
        assert restarted.prepare([ref])[ref.uid] == first  # prepared here before: still answered
        second = setup.drivers[second_node.name] = setup.driver(second_node)
        msg = second.prepare([ref])[ref.uid]
        assert isinstance(msg, str) and f"ComputeDomain default/{name} is being deleted" in msg, msg
        assert second.state.get(ref.uid) is None
    finally:
        with contextlib.suppress(ApiError):
            setup.client.patch(ComputeDomainResource, name, {"metadata": {"finalizers": None}}, namespace="default",
                               patch_type=PatchType.MERGE)
        cleanup(setup, name, pods=2)
