"""The node's GPUs as DRA devices (nvlfabric/nodeagent/gpus.py), as tests on the simulator and on
the real kubelet use them: the node's GPU slice, a claim and pod holding GPUs, the pod's device
health, the driver's GPU settings."""

from __future__ import annotations

from typing import Any

from lightkube import ApiError, Client
from lightkube.models.core_v1 import Container, EnvVar, PodResourceClaim, PodSpec, ResourceRequirements, Toleration
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from nvlfabric.api import names
from nvlfabric.sim.cluster import eventually


def gpu_slice(client: Client, node: str) -> dict[str, Any] | None:
    """device name → its taints ([(key, value, effect)]) in the node's GPU slice (None: no slice)."""
    try:
        s = client.get(ResourceSlice, names.gpu_slice_name(node))
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    assert s.spec.driver == names.GPU_DRIVER and s.spec.nodeName == node and s.spec.pool.name == node
    return {d.name: [(t.key, t.value, t.effect) for t in d.taints or []] for d in s.spec.devices or []}


def gpu_pod(client: Client, name: str, node: str, count: int, *, image: str = "registry.invalid/train:1",
            command: list[str] | None = None) -> None:
    """A claim for `count` GPUs of the node and a pod holding it, tolerating the node's fabric taint
    (so only the device taints keep it from a sick GPU); `image` and `command` what it runs."""
    client.create(ResourceClaim.from_dict({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": names.GPU_DEVICE_CLASS, "allocationMode": "ExactCount", "count": count}}]}}}))
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node},
        tolerations=[Toleration(key=names.FABRIC_UNHEALTHY_TAINT, operator="Exists", effect="NoSchedule")],
        resourceClaims=[PodResourceClaim(name="gpus", resourceClaimName=name)],
        containers=[Container(name="worker", image=image, command=command,
                              resources=ResourceRequirements(claims=[ContainerClaim(name="gpus")]))])))


def gpu_request_pod(client: Client, name: str, node: str, gpus: int) -> None:
    """A pod asking for `gpus` nvidia.com/gpu, as any GPU workload does: on a node without a device
    plugin the scheduler makes it a claim of the DeviceClass that names the extended resource."""
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node},
        tolerations=[Toleration(key=names.FABRIC_UNHEALTHY_TAINT, operator="Exists", effect="NoSchedule")],
        containers=[Container(name="worker", image="registry.invalid/train:1",
                              resources=ResourceRequirements(limits={names.GPU_RESOURCE: str(gpus)}))])))


def extended_claim(client: Client, pod: str) -> str:
    """The claim the scheduler made for the pod's extended resources."""
    status = client.get(Pod, pod, namespace="default").status
    assert status is not None and status.extendedResourceClaimStatus is not None, status
    return status.extendedResourceClaimStatus.resourceClaimName


def allocated(client: Client, claim: str) -> list[str]:
    status = client.get(ResourceClaim, claim, namespace="default").status
    return sorted(r.device for r in (status.allocation.devices.results if status and status.allocation else []))


def running(client: Client, pod: str) -> bool:
    p = client.get(Pod, pod, namespace="default")
    return p.status.phase == "Running" and p.metadata.deletionTimestamp is None


def gpu_health(client: Client, pod: str) -> dict[str, tuple[str, str | None]]:
    status = client.get(Pod, pod, namespace="default").status
    return {r.resourceID: (r.health, r.message) for cs in status.containerStatuses or []
            for rs in cs.allocatedResourcesStatus or [] for r in rs.resources}


def set_agent_env(client: Client, **env: str) -> None:
    """Driver settings, as NvlfabricDriver(gpu_devices=..., gpu_taint_effect=...) sets them: the
    agents roll; returns once the new agent runs."""
    labels = {"app.kubernetes.io/name": "nvlfabric-agent"}
    old = {p.metadata.uid for p in client.list(Pod, namespace=names.NAMESPACE, labels=labels)}
    ds = client.get(DaemonSet, "nvlfabric-agent", namespace=names.NAMESPACE)
    (agent,) = ds.spec.template.spec.containers
    agent.env = [e for e in agent.env or [] if e.name not in env] + [EnvVar(name=k, value=v) for k, v in env.items()]
    client.replace(ds)
    eventually("the agent to roll with the new settings", lambda: [
        p for p in client.list(Pod, namespace=names.NAMESPACE, labels=labels)
        if p.metadata.uid not in old and p.status.phase == "Running"], timeout=90)
