"""The whole node side on the simulator: the driver deployed as in a real cluster (DaemonSet +
controller Deployment, run by the simulated kubelets as local processes), agents discovering
their clique through NVML, the controller publishing the clique's channels, ComputeDomains as
one shared claim each, and pods starting with the right IMEX channel in their container edits."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.core_v1 import EnvVar
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from nvlfabric import manifests
from nvlfabric.api.names import DRIVER
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim import faults
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import print_simulator_logs
from tests.support.agents import domain_with_pods, edits, imex_daemon, pod_gone

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
PORTS = free_ports()  # a control plane of its own; free ports so sessions never clash
RACK = 150  # addresses 127.10.150.x: away from a demo's racks on the same machine


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[ControlPlane, Client]]:
    state = Path(tempfile.mkdtemp(prefix="nvle-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=PORTS, racks=1, nodes_per_rack=3, first_rack=RACK,
                      progress=lambda m: None)
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="e2e")
    try:
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            if obj.kind == "DaemonSet":  # re-check the fabric every 2 s instead of 30 s, for the fault test
                obj.spec.template.spec.containers[0].env.append(EnvVar(name="RESYNC_SECONDS", value="2"))
            client.apply(obj, field_manager="e2e", force=True)
        yield cp, client
    finally:
        client.close()
        cp.down()
        print_simulator_logs(state)
        shutil.rmtree(state, ignore_errors=True)


def test_pods_of_two_domains_start_with_their_own_channel(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    names = [n.name for n in cp.nodes()]
    labelled = eventually("every agent to label its Node with the clique", lambda: (
        cliques if len(cliques := {client.get(Node, n).metadata.labels.get(pools.CLIQUE_LABEL) for n in names}
                       - {None}) == 1 else None), timeout=90)
    clique = labelled.pop()
    eventually("the controller to publish the clique's channel pool",
               lambda: list(client.list(ResourceSlice, labels={pools.POOL_LABEL: pools.pool_name(clique)})))

    a, b = f"a-{uuid.uuid4().hex[:5]}", f"b-{uuid.uuid4().hex[:5]}"
    domain_with_pods(client, a, names[:2])  # one domain over two nodes
    domain_with_pods(client, b, names[1:2])  # another domain sharing a node with the first
    try:
        for pod in (f"{a}-0", f"{a}-1", f"{b}-0"):
            eventually(f"pod {pod} to run", lambda pod=pod: (
                client.get(Pod, pod, namespace="default").status.phase == "Running"), timeout=120)
        channel = {}
        for cd in (a, b):
            claim = client.get(ResourceClaim, f"{cd}-channel", namespace="default")
            (result,) = claim.status.allocation.devices.results
            channel[cd] = int(result.device.removeprefix("channel-"))
        assert channel[a] != channel[b]
        for pod, node, cd in ((f"{a}-0", names[0], a), (f"{a}-1", names[1], a), (f"{b}-0", names[1], b)):
            rec = edits(cp.state_dir, node, pod)
            assert rec["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel[cd]}",
                                           "type": "c", "major": 507, "minor": channel[cd]}], (pod, rec)
            assert f"NVLFABRIC_COMPUTE_DOMAIN={cd}" in rec["env"]  # type: ignore[operator]
        # Without numNodes a domain is Ready once every member placed so far is: wait for both.
        status = eventually("domain a to be Ready on both its nodes", lambda: (
            s if (s := client.get(ComputeDomainResource, a, namespace="default").status or {}).get("phase") == "Ready"
            and s.get("readyNodes") == 2 else None), timeout=60)
        assert status["clique"] == clique and status["channel"] == channel[a] and status["totalNodes"] == 2
    finally:
        for cd, count in ((a, 2), (b, 1)):
            for i in range(count):
                with contextlib.suppress(ApiError):
                    client.delete(Pod, f"{cd}-{i}", namespace="default")
    for cd, count in ((a, 2), (b, 1)):
        for i in range(count):
            eventually("the pods to be removed after unprepare", lambda cd=cd, i=i: pod_gone(client, f"{cd}-{i}"))
    for node in names:
        assert not list((cp.state_dir / "nodes" / node / "cdi" / "run").glob("k8s.channel.nvlfabric.io-claim_*"))


def _listening(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return True
    return False


def test_a_dedicated_domain_with_all_channels_gets_its_own_imex_daemons(sim: tuple[ControlPlane, Client]) -> None:
    """imexMode Dedicated + channelAllocationMode All over two nodes: the controller assigns a port
    slot, each member runs the domain's own daemon there with both members in its nodes file, every
    pod gets every channel of its own domain (never another domain's: docs/tenants.md), and the
    daemons stop with the last pod."""
    cp, client = sim
    nodes = {n.name: n for n in cp.nodes()}
    names = sorted(nodes)[1:3]
    eventually("the agents to label their Nodes", lambda: all(
        (client.get(Node, n).metadata.labels or {}).get(pools.CLIQUE_LABEL) for n in names), timeout=90)
    name = f"d-{uuid.uuid4().hex[:5]}"
    uid = domain_with_pods(client, name, names,
                           {"imexMode": "Dedicated", "channelAllocationMode": "All", "numNodes": 2})
    try:
        for i in range(2):
            eventually(f"pod {name}-{i} to run", lambda i=i: (
                client.get(Pod, f"{name}-{i}", namespace="default").status.phase == "Running"), timeout=120)
        status = eventually("the dedicated domain to be Ready", lambda: (
            s if (s := client.get(ComputeDomainResource, name, namespace="default").status or {}).get("phase")
            == "Ready" else None), timeout=60)
        slot = status["imexPortSlot"]
        assert 1 <= slot <= 99
        addresses = sorted(nodes[n].address for n in names)
        for i, node in enumerate(names):
            rec = edits(cp.state_dir, node, f"{name}-{i}")
            devices = [d["path"] for d in rec["deviceNodes"]]  # type: ignore[attr-defined]
            assert devices == [f"/dev/nvidia-caps-imex-channels/channel{status['channel']}"], devices
            assert f"NVLFABRIC_IMEX_CHANNEL={status['channel']}" in rec["env"]  # type: ignore[operator]
            domain_dir = nodes[node].kubelet_root / "plugins" / DRIVER / "imex" / f"cd-{uid}"
            eventually(f"{node}'s dedicated daemon to know both members", lambda d=domain_dir: (
                (d / "nodes.cfg").read_text().split() == addresses))
            assert f"SERVER_PORT={50000 + 10 * slot}" in (domain_dir / "config.cfg").read_text()
            assert _listening(nodes[node].address, 50000 + 10 * slot)
    finally:
        for i in range(2):
            with contextlib.suppress(ApiError):
                client.delete(Pod, f"{name}-{i}", namespace="default")
    for i in range(2):
        eventually("the pods to be removed after unprepare", lambda i=i: pod_gone(client, f"{name}-{i}"))
    for node in names:
        assert not _listening(nodes[node].address, 50000 + 10 * slot), "the dedicated daemon outlived its pods"
        assert not (nodes[node].kubelet_root / "plugins" / DRIVER / "imex" / f"cd-{uid}").exists()
    client.delete(ComputeDomainResource, name, namespace="default")
    client.delete(ResourceClaim, f"{name}-channel", namespace="default")


def test_agents_report_health_metrics_and_a_fabric_that_stops_being_ready(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    nodes = cp.nodes()
    node = nodes[2]
    eventually("the agent to report the fabric condition", lambda: any(
        c.type == "NVLinkFabricReady" and c.status == "True"
        for c in client.get(Node, node.name).status.conditions or []), timeout=90)
    with grpc.insecure_channel(f"{node.address}:51515") as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    body = urllib.request.urlopen(f"http://{nodes[0].address}:9400/metrics", timeout=5).read().decode()
    assert "nvlfabric_fabric_ready 1.0" in body and "nvlfabric_prepare_seconds_bucket" in body

    assert "NVML fault" in faults.inject(cp.state_dir, node, "fabric-not-started")
    try:
        cond = eventually("the agent to notice the fabric is not ready", lambda: next((
            c for c in client.get(Node, node.name).status.conditions or []
            if c.type == "NVLinkFabricReady" and c.status == "False"), None), timeout=60)
        assert "fabric registration is NotStarted" in (cond.message or "")
        # The label is a patch of its own after the condition's: seen within a moment of it.
        eventually("the clique label to go", lambda: pools.CLIQUE_LABEL not in (
            client.get(Node, node.name).metadata.labels or {}), timeout=10)
        events = client.list(Event, namespace="default", fields={"involvedObject.name": node.name})
        assert any(e.reason == "NVLinkFabricNotReady" for e in events)
    finally:
        faults.inject(cp.state_dir, node, "clear")
    eventually("the clique label to come back", lambda: pools.CLIQUE_LABEL in (
        client.get(Node, node.name).metadata.labels or {}), timeout=60)


def _agent_pods(client: Client) -> dict[str, Pod]:
    return {p.spec.nodeName: p for p in client.list(Pod, namespace="nvlfabric-system",
                                                    labels={"app.kubernetes.io/name": "nvlfabric-agent"})}


def _agents_serving(client: Client, image: str, restarts: dict[str, int] | None = None) -> bool:
    pods = _agent_pods(client)
    return len(pods) == 3 and all(
        p.metadata.deletionTimestamp is None and p.status.phase == "Running" and p.spec.containers[0].image == image
        and (restarts is None or (p.status.containerStatuses or [None])[0].restartCount > restarts.get(node, -1))
        for node, p in pods.items())


def test_running_pods_keep_their_imex_daemon_across_an_agent_kill_and_a_rolling_update(
        sim: tuple[ControlPlane, Client]) -> None:
    """The IMEX daemons belong to the keeper's DaemonSet: an agent SIGKILL (the kubelet restarts the
    container) and a rolling update of the agent DaemonSet to a new image leave every daemon with
    its pid and members, the pods with their channel and the claims prepared."""
    cp, client = sim
    nodes = {n.name: n for n in cp.nodes()}
    names = sorted(nodes)[:2]
    # Every node of the rack in the clique (an earlier test's fault may just have cleared): the
    # daemons' members must not change under this test for any other reason.
    clique = eventually("every agent to label its Node", lambda: (
        c.pop() if len(c := [(client.get(Node, n).metadata.labels or {}).get(pools.CLIQUE_LABEL)
                             for n in nodes]) == len(nodes) and None not in c and len(set(c)) == 1 else None),
        timeout=90)
    name = f"u-{uuid.uuid4().hex[:5]}"
    domain_with_pods(client, name, names)
    try:
        for i in range(2):
            eventually(f"pod {name}-{i} to run", lambda i=i: (
                client.get(Pod, f"{name}-{i}", namespace="default").status.phase == "Running"), timeout=120)
        claim = client.get(ResourceClaim, f"{name}-channel", namespace="default")
        before = {n: imex_daemon(nodes[n], clique) for n in names}
        assert all(len(pids) == 1 for pids, _ in before.values()), before
        containers = {i: edits(cp.state_dir, n, f"{name}-{i}") for i, n in enumerate(names)}

        def unchanged(when: str) -> None:
            for n in names:
                assert imex_daemon(nodes[n], clique) == before[n], f"{when}: {n}'s IMEX daemon changed"
                cp_file = nodes[n].kubelet_root / "plugins" / DRIVER / "checkpoint.json"
                entry = json.loads(cp_file.read_text())["claims"][claim.metadata.uid]
                assert entry["state"] == "PrepareCompleted", f"{when}: {n}: {entry}"
            for i, n in enumerate(names):
                pod = client.get(Pod, f"{name}-{i}", namespace="default")
                assert pod.status.phase == "Running" and pod.metadata.deletionTimestamp is None, f"{when}: {pod.status}"
                assert edits(cp.state_dir, n, f"{name}-{i}") == containers[i], f"{when}: the container changed"
            now = client.get(ResourceClaim, f"{name}-channel", namespace="default")
            assert now.status.allocation == claim.status.allocation
            assert [r.uid for r in now.status.reservedFor if r.resource == "pods"] == [
                r.uid for r in claim.status.reservedFor if r.resource == "pods"]

        image = _agent_pods(client)[names[0]].spec.containers[0].image
        restarts = {n: p.status.containerStatuses[0].restartCount for n, p in _agent_pods(client).items()}
        assert "killed pid" in faults.inject(cp.state_dir, nodes[names[0]], "agent-killed")
        eventually("the kubelet to restart the killed agent", lambda: (
            _agent_pods(client)[names[0]].status.containerStatuses[0].restartCount > restarts[names[0]]), timeout=60)
        time.sleep(3)  # a resync (2 s here) of the restarted agent: it must leave the daemon alone too
        unchanged("after the agent was killed")

        new_image = image.rsplit(":", 1)[0] + ":0.1.1-rc1"
        client.patch(DaemonSet, "nvlfabric-agent", {"spec": {"template": {"spec": {"containers": [
            {"name": "agent", "image": new_image}]}}}}, namespace="nvlfabric-system")
        eventually("the rolling update to replace every agent", lambda: _agents_serving(client, new_image),
                   timeout=180)
        time.sleep(3)
        unchanged("after the rolling update")
        keeper = {p.spec.nodeName: p for p in client.list(Pod, namespace="nvlfabric-system",
                                                          labels={"app.kubernetes.io/name": "nvlfabric-imex"})}
        assert all(p.spec.containers[0].image == image for p in keeper.values())  # the keeper was not rolled
    finally:
        for i in range(2):
            with contextlib.suppress(ApiError):
                client.delete(Pod, f"{name}-{i}", namespace="default")
    for i in range(2):
        eventually("the pods to be removed after unprepare", lambda i=i: pod_gone(client, f"{name}-{i}"))
    client.delete(ComputeDomainResource, name, namespace="default")
    client.delete(ResourceClaim, f"{name}-channel", namespace="default")


@pytest.mark.parametrize(("override", "named"), [
    # (The simulated kubelet still rewrites paths in the environment to its node's directories,
    # issue 15: the message names the node's stand-in for the path, ending as the path does.)
    pytest.param({"kubelet_root": "/var/lib/kubelet-typo"},
                 "/var/lib/kubelet-typo has no plugins_registry directory, so it is not the kubelet's root",
                 id="kubelet-root"),
    pytest.param({"driver_root": "/run/nvidia/driver-typo"}, "has no libnvidia-ml.so.1 (looked in usr/lib64",
                 id="driver-root"),
])
def test_an_agent_given_a_wrong_root_refuses_to_start_and_says_so_in_its_pod_status(
        sim: tuple[ControlPlane, Client], override: dict[str, str], named: str) -> None:
    """The agent DaemonSet as NvlfabricDriver(kubelet_root=... / driver_root=...) makes it, with a
    typo: its container exits at once and restarts with back-off, and `kubectl describe pod`
    shows why (the termination message from its log), instead of Running "healthy" while the
    kubelet never finds it or NVML never loads. The node's real agent is not disturbed."""
    from nvlfabric.components.driver import NvlfabricDriverArgs, driver_objects

    cp, client = sim
    node = cp.nodes()[-1].name
    name = f"typo-{next(iter(override)).split('_')[0]}"
    (ds,) = [o for o in driver_objects(NvlfabricDriverArgs(**override))  # type: ignore[arg-type]
             if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvlfabric-agent"]
    ds["metadata"]["name"] = name
    ds["spec"]["selector"] = {"matchLabels": {"app.kubernetes.io/name": name}}
    ds["spec"]["template"]["metadata"]["labels"] = {"app.kubernetes.io/name": name}
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    # The agent is hostNetwork: a second one on the node would ask for the real one's host ports
    # and stay Pending (the scheduler's NodePorts filter). The copy gets a network of its own.
    ds["spec"]["template"]["spec"]["hostNetwork"] = False
    real = _agent_pods(client)[node]
    before = real.status.containerStatuses[0].restartCount
    client.create(DaemonSet.from_dict(ds))
    try:
        def refused() -> object:
            pods = list(client.list(Pod, namespace="nvlfabric-system", labels={"app.kubernetes.io/name": name}))
            status = pods[0].status.containerStatuses[0] if pods and pods[0].status and \
                pods[0].status.containerStatuses else None
            last = status.lastState.terminated if status and status.lastState else None
            return last if last is not None and status is not None and status.restartCount >= 1 else None

        last = eventually(f"the {name} agent to exit and be restarted", refused, timeout=60)
        assert last.exitCode == 2, last
        assert named in (last.message or ""), last.message
        flag = "--kubelet-root / $KUBELET_ROOT" if "kubelet_root" in override else "--driver-root / $DRIVER_ROOT"
        assert (last.message or "").startswith(f"nvlfabric agent: {flag}: ") and "set NvlfabricDriver(" in last.message
        assert (last.message or "").strip().count("\n") == 0, "the refusal is one line"
        now = _agent_pods(client)[node]
        assert now.metadata.uid == real.metadata.uid and now.status.containerStatuses[0].restartCount == before
    finally:
        client.delete(DaemonSet, name, namespace="nvlfabric-system")
