"""The simulated kubelet against the real control plane and a DRA plugin speaking the real gRPC."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container, EnvVar, PodResourceClaim, PodSpec, ResourceRequirements
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    CELDeviceSelector,
    Device,
    DeviceClaim,
    DeviceClassSpec,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaimSpec,
    ResourceClaimTemplateSpec,
    ResourcePool,
    ResourceSliceSpec,
)
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.kubelet.fakeplugin import FakePlugin
from nvlfabric.sim.nodes import SimNode, rack_nodes
from tests.conftest import Cluster
from tests.support.simkubelet import standalone_kubelet, state_dir

pytestmark = pytest.mark.cluster
RACK = 90  # a rack number of its own, so these nodes never collide with other tests'
ECHO_IMAGE = "nvlfabric.test/echo-agent"
ECHO = Path(__file__).with_name("echo_agent.py")



@pytest.fixture(scope="module")
def sim_nodes(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimNode]]:
    state = state_dir("nvlk-")
    # A stale slice for a node must be wiped when its kubelet starts.
    stale = rack_nodes(state, racks=1, nodes_per_rack=2, first_rack=RACK)[0]
    cluster.client.create(slice_for(stale.name, "stale.test.nvlfabric.io", name=f"stale-{uuid.uuid4().hex[:5]}"))
    with standalone_kubelet(cluster, state, rack=RACK, nodes=2,
                            images={ECHO_IMAGE: [sys.executable, str(ECHO)]}) as (nodes, _):
        yield nodes


def slice_for(node: str, driver: str, *, name: str) -> ResourceSlice:
    return ResourceSlice(metadata=ObjectMeta(name=name), spec=ResourceSliceSpec(
        driver=driver, nodeName=node, pool=ResourcePool(name=node, generation=1, resourceSliceCount=1),
        devices=[Device(name="gpu-0")]))


@pytest.fixture
def plugin(cluster: Cluster, sim_nodes: list[SimNode]) -> Iterator[FakePlugin]:
    node = sim_nodes[0]
    driver = f"d{uuid.uuid4().hex[:6]}.test.io"
    p = FakePlugin(driver=driver, registry_dir=node.registry_dir, plugin_dir=node.kubelet_root / "plugins" / driver,
                   cdi_dir=node.cdi_dirs[1])
    p.start()
    client = cluster.client
    client.create(DeviceClass(metadata=ObjectMeta(name=driver), spec=DeviceClassSpec(selectors=[
        DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{driver}"'))])))
    client.create(slice_for(node.name, driver, name=f"{driver}-slice"))
    client.create(ResourceClaimTemplate(metadata=ObjectMeta(name=driver, namespace="default"),
                                        spec=ResourceClaimTemplateSpec(spec=ResourceClaimSpec(devices=DeviceClaim(
                                            requests=[DeviceRequest(name="gpu", exactly=ExactDeviceRequest(
                                                deviceClassName=driver))])))))
    yield p
    p.stop()
    for kind, name, ns in ((ResourceClaimTemplate, driver, "default"), (ResourceSlice, f"{driver}-slice", None),
                           (DeviceClass, driver, None)):
        with contextlib.suppress(ApiError):
            client.delete(kind, name, namespace=ns) if ns else client.delete(kind, name)


def make_pod(client: Client, driver: str, node: str) -> str:
    name = f"p-{uuid.uuid4().hex[:6]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node},
        resourceClaims=[PodResourceClaim(name="gpu", resourceClaimTemplateName=driver)],
        containers=[Container(name="main", image="registry.invalid/train:1",
                              resources=ResourceRequirements(claims=[ContainerClaim(name="gpu")])),
                    Container(name="sidecar", image="registry.invalid/log:1")])))
    return name


def phase(client: Client, name: str) -> str | None:
    try:
        pod = client.get(Pod, name, namespace="default")
    except ApiError:
        return "Gone"
    return pod.status.phase if pod.status else None


def test_nodes_register_ready_with_gb200_capacity_and_renew_leases(cluster: Cluster, sim_nodes: list[SimNode]) -> None:
    client = cluster.client
    node = client.get(Node, sim_nodes[1].name)
    assert node.status.capacity["pods"] == "110" and node.status.capacity["cpu"] == "144"
    # 4 GPUs, as NVIDIA's device plugin advertises them on a GB200 compute tray
    assert node.status.capacity["nvidia.com/gpu"] == node.status.allocatable["nvidia.com/gpu"] == "4"
    assert {a.type: a.address for a in node.status.addresses}["InternalIP"] == f"127.10.{RACK}.2"
    assert node.metadata.labels["nvlfabric.io/rack"] == f"rack-{RACK}"
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True"
    first = client.get(Lease, sim_nodes[1].name, namespace="kube-node-lease").spec.renewTime
    eventually("the Lease to be renewed",
               lambda: client.get(Lease, sim_nodes[1].name, namespace="kube-node-lease").spec.renewTime != first,
               timeout=25)
    stale = list(client.list(ResourceSlice, fields={"spec.nodeName": sim_nodes[0].name,
                                                    "spec.driver": "stale.test.nvlfabric.io"}))
    assert stale == [], "the kubelet must wipe its node's slices at start"


def test_a_deleted_lease_is_made_again(cluster: Cluster, sim_nodes: list[SimNode]) -> None:
    """The kubelet's lease controller creates its Lease when it is gone; without that the node goes
    NotReady for good."""
    client, name = cluster.client, sim_nodes[1].name
    client.delete(Lease, name, namespace="kube-node-lease")
    lease = eventually("the Lease to be made again",
                       lambda: next(iter(client.list(Lease, namespace="kube-node-lease",
                                                     fields={"metadata.name": name})), None), timeout=25)
    assert lease.spec.holderIdentity == name and lease.metadata.ownerReferences[0].name == name


def test_a_pod_the_node_controller_marked_not_ready_is_ready_again(cluster: Cluster,
                                                                    sim_nodes: list[SimNode]) -> None:
    """The node-lifecycle controller sets `Ready` False on the pods of a node it saw go NotReady;
    once the node heartbeats again, its kubelet writes the pod's real status back (before, the pod
    stayed `ContainersReady` True, `Ready` False for good, and a DaemonSet's rollout never finished)."""
    client = cluster.client
    name = f"ready-{uuid.uuid4().hex[:6]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": sim_nodes[1].name},
        containers=[Container(name="main", image="registry.invalid/serve:1")])))

    def ready() -> str | None:
        pod = client.get(Pod, name, namespace="default")
        return next((c.status for c in (pod.status.conditions or []) if c.type == "Ready"), None) \
            if pod.status else None

    eventually("the pod to be Ready", lambda: ready() == "True")
    # What the node-lifecycle controller writes (MarkPodsNotReady): the Ready condition alone, False.
    client.patch(Pod.Status, name, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}}, namespace="default")
    eventually("the kubelet to write Ready again", lambda: ready() == "True", timeout=15)
    client.delete(Pod, name, namespace="default")
    eventually("the pod to be removed", lambda: phase(client, name) == "Gone")


def test_pod_with_a_claim_is_prepared_resolved_and_started(cluster: Cluster, sim_nodes: list[SimNode],
                                                           plugin: FakePlugin) -> None:
    client, node = cluster.client, sim_nodes[0]
    assert plugin.registered.wait(10), plugin.registration_error
    pod = make_pod(client, plugin.driver, node.name)
    eventually("the pod to run", lambda: phase(client, pod) == "Running")
    assert [c[:2] for c in plugin.calls] == [("prepare", "v1")]
    record = json.loads((node.containers_dir / f"default_{pod}_main.json").read_text())
    assert record["env"][0].startswith(f"FAKE_CLAIM={pod}-gpu-")  # the generated claim name
    assert record["deviceNodes"] == [{"path": "/dev/fake0", "type": "c", "major": 507, "minor": 1}]
    assert record["cdi_device_ids"][0].startswith(f"k8s.{plugin.driver}/claim=")
    sidecar = json.loads((node.containers_dir / f"default_{pod}_sidecar.json").read_text())
    assert sidecar["cdi_device_ids"] == [] and sidecar["deviceNodes"] == []
    status = client.get(Pod, pod, namespace="default").status
    assert status.hostIP == node.address and all(c.ready for c in status.containerStatuses)

    client.delete(Pod, pod, namespace="default")
    eventually("the pod to be removed after unprepare", lambda: phase(client, pod) == "Gone")
    assert [c[0] for c in plugin.calls] == ["prepare", "unprepare"]
    assert plugin.calls[0][2] == plugin.calls[1][2]
    assert not list(plugin.cdi_dir.glob(f"k8s.{plugin.driver}-claim_*.json"))


def test_a_claim_two_pods_on_the_node_share_is_unprepared_with_the_last_of_them(
        cluster: Cluster, sim_nodes: list[SimNode], plugin: FakePlugin) -> None:
    """As the kubelet's claim info does: a claim stays prepared while another pod on the node uses
    it (a domain's shared channel claim, two of its pods on one node), and is unprepared when the
    last one goes. Unpreparing it with the first pod took the channel from the one still running."""
    client, node = cluster.client, sim_nodes[0]
    assert plugin.registered.wait(10), plugin.registration_error
    claim = f"shared-{uuid.uuid4().hex[:6]}"
    client.create(ResourceClaim(metadata=ObjectMeta(name=claim, namespace="default"), spec=ResourceClaimSpec(
        devices=DeviceClaim(requests=[DeviceRequest(name="gpu", exactly=ExactDeviceRequest(
            deviceClassName=plugin.driver))]))))
    pods = [f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    try:
        for pod in pods:
            client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
                nodeSelector={"kubernetes.io/hostname": node.name},
                resourceClaims=[PodResourceClaim(name="gpu", resourceClaimName=claim)],
                containers=[Container(name="main", image="registry.invalid/train:1",
                                      resources=ResourceRequirements(claims=[ContainerClaim(name="gpu")]))])))
        for pod in pods:
            eventually(f"pod {pod} to run", lambda pod=pod: phase(client, pod) == "Running")
        client.delete(Pod, pods[0], namespace="default")
        eventually("the first pod to be removed", lambda: phase(client, pods[0]) == "Gone")
        assert "unprepare" not in [c[0] for c in plugin.calls], plugin.calls
        assert phase(client, pods[1]) == "Running"
        client.delete(Pod, pods[1], namespace="default")
        eventually("the last pod to be removed after unprepare", lambda: phase(client, pods[1]) == "Gone")
        assert [c[0] for c in plugin.calls].count("unprepare") == 1
    finally:
        for pod in pods:
            with contextlib.suppress(ApiError):
                client.delete(Pod, pod, namespace="default")
        with contextlib.suppress(ApiError):
            client.delete(ResourceClaim, claim, namespace="default")


def test_a_pod_deleted_while_its_claim_is_being_prepared_is_still_removed(
        cluster: Cluster, sim_nodes: list[SimNode], plugin: FakePlugin) -> None:
    """The deletion arrives while the kubelet's sync of the pod waits on NodePrepareResources: it
    must not be lost (the pod would stay Terminating, and a foreground delete of its Job hang)."""
    client = cluster.client
    assert plugin.registered.wait(10), plugin.registration_error
    plugin.prepare_delay_s = 3.0
    try:
        pod = make_pod(client, plugin.driver, sim_nodes[0].name)
        eventually("the prepare call to be in flight", lambda: any(c[0] == "prepare" for c in plugin.calls))
        client.delete(Pod, pod, namespace="default")
        eventually("the pod to be removed after unprepare", lambda: phase(client, pod) == "Gone", timeout=30)
        assert [c[0] for c in plugin.calls][-1] == "unprepare"
    finally:
        plugin.prepare_delay_s = 0.0


def test_an_unresolvable_cdi_device_fails_the_container_start(cluster: Cluster, sim_nodes: list[SimNode],
                                                              plugin: FakePlugin) -> None:
    client = cluster.client
    plugin.skip_cdi_spec = True
    pod = make_pod(client, plugin.driver, sim_nodes[0].name)

    def warning() -> str | None:
        events = client.list(Event, namespace="default", fields={"involvedObject.name": pod})
        return next((e.message for e in events if "unresolvable CDI devices" in (e.message or "")), None)

    message = eventually("an unresolvable-CDI event", warning)
    assert f"k8s.{plugin.driver}/claim=" in message
    assert phase(client, pod) == "Pending"
    client.delete(Pod, pod, namespace="default")
    eventually("the pod to be removed", lambda: phase(client, pod) == "Gone")


def test_a_v1beta1_only_plugin_is_called_on_v1beta1(cluster: Cluster, sim_nodes: list[SimNode],
                                                    plugin: FakePlugin) -> None:
    plugin.stop()
    plugin.versions = ["v1beta1.DRAPlugin"]
    plugin.registered.clear()
    plugin.start()
    # The kubelet notices the replaced socket on one of its next scans and registers it again.
    assert plugin.registered.wait(timeout=30), "the kubelet did not register the restarted plugin"
    client = cluster.client
    pod = make_pod(client, plugin.driver, sim_nodes[0].name)
    eventually("the pod to run", lambda: phase(client, pod) == "Running")
    assert ("prepare", "v1beta1") in [c[:2] for c in plugin.calls]
    client.delete(Pod, pod, namespace="default")
    eventually("the pod to be removed", lambda: phase(client, pod) == "Gone")


def test_a_plugin_with_no_known_version_is_told_why(sim_nodes: list[SimNode], tmp_path: Path) -> None:
    node = sim_nodes[1]
    p = FakePlugin(driver="old.test.nvlfabric.io", registry_dir=node.registry_dir,
                   plugin_dir=node.kubelet_root / "plugins" / "old", cdi_dir=node.cdi_dirs[1],
                   versions=["v1alpha4.NodeService"])
    p.start()
    try:
        eventually("a registration error", lambda: p.registration_error)
        assert "none of the plugin's supported versions" in p.registration_error
        assert not p.registered.is_set()
    finally:
        p.stop()


def test_a_job_pod_with_a_run_time_succeeds_after_it(cluster: Cluster, sim_nodes: list[SimNode]) -> None:
    client = cluster.client
    name = f"job-{uuid.uuid4().hex[:6]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default",
                                          annotations={"sim.nvlfabric.io/run-seconds": "1"}),
                      spec=PodSpec(restartPolicy="Never", nodeSelector={"kubernetes.io/hostname": sim_nodes[1].name},
                                   containers=[Container(name="main", image="registry.invalid/job:1")])))
    eventually("the pod to succeed", lambda: phase(client, name) == "Succeeded")
    status = client.get(Pod, name, namespace="default").status
    assert status.containerStatuses[0].state.terminated.exitCode == 0
    client.delete(Pod, name, namespace="default")
    eventually("the pod to be removed", lambda: phase(client, name) == "Gone")


def test_a_container_gets_its_downward_api_fields_and_expanded_references(cluster: Cluster,
                                                                          sim_nodes: list[SimNode]) -> None:
    """What a launcher line relies on: env from the pod's labels and annotations, `$(VAR)` in env
    values (earlier entries only), command and args expanded as a kubelet expands them."""
    client, node = cluster.client, sim_nodes[1]
    name = f"env-{uuid.uuid4().hex[:6]}"
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    client.create(Pod.from_dict({
        "metadata": {"name": name, "namespace": "default", "labels": {"apps.kubernetes.io/pod-index": "3"},
                     "annotations": {"batch.kubernetes.io/job-completion-index": "2"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name}, "containers": [{
            "name": "main", "image": "registry.invalid/train:1",
            "command": ["torchrun", "--node-rank=$(RANK)"], "args": ["--master-addr=$(ADDR)", "$$(RANK)", "$(UNSET)"],
            "env": [{"name": "EARLY", "value": "$(PORT)"},  # PORT comes later: not expanded
                    {"name": "RANK", "valueFrom": index},
                    {"name": "ORDINAL", "valueFrom": {"fieldRef": {
                        "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
                    {"name": "PORT", "value": "29500"},
                    {"name": "ADDR", "value": "job-$(RANK).svc:$(PORT)"}]}]}}))
    eventually("the pod to run", lambda: phase(client, name) == "Running")
    record = json.loads((node.containers_dir / f"default_{name}_main.json").read_text())
    assert record["containerEnv"] == {"EARLY": "$(PORT)", "RANK": "2", "ORDINAL": "3", "PORT": "29500",
                                      "ADDR": "job-2.svc:29500"}
    assert record["command"] == ["torchrun", "--node-rank=2"]
    assert record["args"] == ["--master-addr=job-2.svc:29500", "$(RANK)", "$(UNSET)"]
    client.delete(Pod, name, namespace="default")
    eventually("the pod to be removed", lambda: phase(client, name) == "Gone")


def test_a_process_container_gets_its_claims_cdi_env_over_its_own(cluster: Cluster, sim_nodes: list[SimNode],
                                                                  plugin: FakePlugin) -> None:
    """The runtime applies the CDI edits of the container's devices to the process: their env wins
    over the spec's (and `$(VAR)` in args knows only the spec's)."""
    client = cluster.client
    assert plugin.registered.wait(10), plugin.registration_error
    name = f"p-{uuid.uuid4().hex[:6]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": sim_nodes[0].name},
        resourceClaims=[PodResourceClaim(name="gpu", resourceClaimTemplateName=plugin.driver)],
        containers=[Container(name="main", image=f"{ECHO_IMAGE}:1", args=["$(FAKE_CLAIM)"],
                              env=[EnvVar(name="FAKE_CLAIM", value="from-the-spec")],
                              resources=ResourceRequirements(claims=[ContainerClaim(name="gpu")]))])))
    uid = eventually("the pod to run", lambda: (p := client.get(Pod, name, namespace="default")).status
                     and p.status.phase == "Running" and p.metadata.uid)
    report = eventually("the process's report", lambda: (f := sim_nodes[0].pod_dir(uid) / "report.json").exists()
                        and json.loads(f.read_text()))
    assert report["env"]["FAKE_CLAIM"].startswith(f"{name}-gpu-")  # the CDI edit's value
    assert report["args"] == ["from-the-spec"]
    client.delete(Pod, name, namespace="default")
    eventually("the pod to be removed", lambda: phase(client, name) == "Gone")
