"""The local control plane serves DRA (`resource.k8s.io/v1`) the way a real cluster does.

These run against the real kube-apiserver, kube-scheduler and kube-controller-manager: CRUD of
the DRA objects, and the full allocation path for a pod whose claim comes from a template.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest
from lightkube import ApiError, Client
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import (
    Container,
    NodeCondition,
    NodeSpec,
    NodeStatus,
    PodResourceClaim,
    PodSpec,
    ResourceRequirements,
)
from lightkube.models.core_v1 import (
    ResourceClaim as ContainerClaim,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    CELDeviceSelector,
    Device,
    DeviceAttribute,
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
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

from nvlfabric.sim.cluster import eventually
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster
DRIVER = "gpu.test.nvlfabric.io"



def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def device_class(name: str) -> DeviceClass:
    return DeviceClass(metadata=ObjectMeta(name=name), spec=DeviceClassSpec(selectors=[
        DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{DRIVER}"'))]))


def resource_slice(name: str, node: str, devices: int) -> ResourceSlice:
    return ResourceSlice(
        metadata=ObjectMeta(name=name),
        spec=ResourceSliceSpec(
            driver=DRIVER, nodeName=node,
            pool=ResourcePool(name=node, generation=1, resourceSliceCount=1),
            devices=[Device(name=f"gpu-{i}", attributes={"index": DeviceAttribute(int=i)})
                     for i in range(devices)],
        ),
    )


def claim_template(name: str, klass: str) -> ResourceClaimTemplate:
    return ResourceClaimTemplate(
        metadata=ObjectMeta(name=name, namespace="default"),
        spec=ResourceClaimTemplateSpec(spec=ResourceClaimSpec(devices=DeviceClaim(requests=[
            DeviceRequest(name="gpu", exactly=ExactDeviceRequest(deviceClassName=klass))]))),
    )


@pytest.fixture
def ready_node(cluster: Cluster) -> Iterator[str]:
    """A Node that looks like a healthy kubelet's: Ready with heartbeats via its Lease."""
    client, name = cluster.client, unique("sim-node")
    now = datetime.datetime.now(datetime.UTC)
    client.create(Node(metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
                       spec=NodeSpec()))
    client.patch(Node.Status, name, {"status": NodeStatus(
        capacity={"cpu": "72", "memory": "480Gi", "pods": "110"},
        allocatable={"cpu": "72", "memory": "480Gi", "pods": "110"},
        conditions=[NodeCondition(type="Ready", status="True", reason="KubeletReady",
                                  lastHeartbeatTime=now, lastTransitionTime=now)],
    ).to_dict()})
    client.create(Lease(metadata=ObjectMeta(name=name, namespace="kube-node-lease"),
                        spec=LeaseSpec(holderIdentity=name, leaseDurationSeconds=40, renewTime=now)))
    # TaintNodesByCondition put not-ready:NoSchedule on the new Node; the node-lifecycle
    # controller lifts it once it sees Ready=True, as in a real cluster.
    eventually("the node-lifecycle controller to untaint the Ready node",
               lambda: not (client.get(Node, name).spec.taints or []) or None)
    yield name
    client.delete(Node, name)
    client.delete(Lease, name, namespace="kube-node-lease")


def test_deviceclass_resourceslice_and_claimtemplate_crud(cluster: Cluster) -> None:
    client = cluster.client
    klass, node = unique("dc"), unique("node")

    created = client.create(device_class(klass))
    assert created.spec.selectors[0].cel.expression == f'device.driver == "{DRIVER}"'
    created.spec.selectors.append(DeviceSelector(cel=CELDeviceSelector(
        expression=f'device.attributes["{DRIVER}"].index >= 0')))
    replaced = client.replace(created)
    assert len(replaced.spec.selectors) == 2

    slice_ = client.create(resource_slice(unique("slice"), node, devices=4))
    assert [d.name for d in slice_.spec.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    listed = [s for s in client.list(ResourceSlice, fields={"spec.nodeName": node})]
    assert [s.metadata.name for s in listed] == [slice_.metadata.name]

    tmpl = client.create(claim_template(unique("tmpl"), klass))
    assert tmpl.spec.spec.devices.requests[0].exactly.deviceClassName == klass

    # A ResourceClaimTemplate's spec is immutable: the API server rejects an in-place change.
    tmpl.spec.spec.devices.requests[0].exactly.deviceClassName = "other"
    with pytest.raises(ApiError) as excinfo:
        client.replace(tmpl)
    assert excinfo.value.status.code == 422
    assert "immutable" in (excinfo.value.status.message or "")

    client.delete(ResourceClaimTemplate, tmpl.metadata.name, namespace="default")
    client.delete(ResourceSlice, slice_.metadata.name)
    client.delete(DeviceClass, klass)
    with pytest.raises(ApiError) as gone:
        client.get(DeviceClass, klass)
    assert gone.value.status.code == 404


def test_pod_claim_from_template_is_created_and_allocated_on_the_node(cluster: Cluster, ready_node: str) -> None:
    client: Client = cluster.client
    klass, tmpl, pod = unique("dc"), unique("tmpl"), unique("pod")
    client.create(device_class(klass))
    client.create(resource_slice(unique("slice"), ready_node, devices=2))
    client.create(claim_template(tmpl, klass))
    client.create(Pod(
        metadata=ObjectMeta(name=pod, namespace="default"),
        spec=PodSpec(
            # Only our node has the devices, so the scheduler must choose it by itself.
            resourceClaims=[PodResourceClaim(name="gpu", resourceClaimTemplateName=tmpl)],
            containers=[Container(name="main", image="registry.invalid/noop:1",
                                  resources=ResourceRequirements(claims=[ContainerClaim(name="gpu")]))],
        ),
    ))

    def claim_status() -> ResourceClaim | None:
        statuses = client.get(Pod, pod, namespace="default").status.resourceClaimStatuses or []
        if not statuses or not statuses[0].resourceClaimName:
            return None
        claim = client.get(ResourceClaim, statuses[0].resourceClaimName, namespace="default")
        return claim if claim.status and claim.status.allocation else None

    claim = eventually("the controller manager to create the claim and the scheduler to allocate it",
                       claim_status)
    bound = eventually("the pod to be bound",
                       lambda: client.get(Pod, pod, namespace="default").spec.nodeName)
    assert bound == ready_node
    results = claim.status.allocation.devices.results
    assert len(results) == 1 and results[0].driver == DRIVER and results[0].pool == ready_node
    assert [r.uid for r in claim.status.reservedFor] == [client.get(Pod, pod, namespace="default").metadata.uid]
    assert claim.metadata.ownerReferences[0].name == pod

    client.delete(Pod, pod, namespace="default", grace_period=0)
    client.delete(ResourceClaimTemplate, tmpl, namespace="default")
    client.delete(DeviceClass, klass)
