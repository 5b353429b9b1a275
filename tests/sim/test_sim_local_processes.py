"""A DaemonSet whose image maps to a local command runs as a process on each simulated node,
seeing what a pod sees: downward-API env, host paths mapped to that node's directories, a
service-account token bound to the pod (with the node-name claim), the node's NVML identity.
Killing it makes the kubelet restart it and count the restart; a downed node stops heartbeats."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.models.apps_v1 import DaemonSetSpec
from lightkube.models.core_v1 import (
    Container,
    EnvVar,
    EnvVarSource,
    HostPathVolumeSource,
    ObjectFieldSelector,
    PodSpec,
    PodTemplateSpec,
    Volume,
    VolumeMount,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod, ServiceAccount

from nvlfabric.sim import faults
from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.nodes import SimNode
from tests.conftest import Cluster
from tests.support.simkubelet import standalone_kubelet, state_dir

pytestmark = pytest.mark.cluster
RACK = 91
IMAGE = "nvlfabric.test/echo-agent"
ECHO = Path(__file__).with_name("echo_agent.py")


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> Iterator[list[SimNode]]:
    with standalone_kubelet(cluster, state_dir("nvlp-"), rack=RACK, nodes=2,
                            images={IMAGE: [sys.executable, str(ECHO)]}) as (sim, _):
        yield sim


def daemonset(name: str) -> DaemonSet:
    labels = {"app": name}
    field = lambda path: EnvVarSource(fieldRef=ObjectFieldSelector(fieldPath=path))  # noqa: E731
    return DaemonSet(metadata=ObjectMeta(name=name, namespace="default"), spec=DaemonSetSpec(
        selector=LabelSelector(matchLabels=labels),
        template=PodTemplateSpec(metadata=ObjectMeta(labels=labels), spec=PodSpec(
            serviceAccountName="echo-agent", nodeSelector={"nvlfabric.io/rack": f"rack-{RACK}"},
            containers=[Container(
                name="agent", image=f"{IMAGE}:0.1",
                args=["--cdi-root", "/var/run/cdi", "--plain", "value"],
                env=[EnvVar(name="NODE_NAME", valueFrom=field("spec.nodeName")),
                     EnvVar(name="POD_UID", valueFrom=field("metadata.uid")),
                     EnvVar(name="KUBELET_ROOT", value="/var/lib/kubelet/plugins"),
                     EnvVar(name="SA_DIR", value="/var/run/secrets/kubernetes.io/serviceaccount")],
                volumeMounts=[VolumeMount(name="kubelet", mountPath="/var/lib/kubelet"),
                              VolumeMount(name="cdi", mountPath="/var/run/cdi")])],
            volumes=[Volume(name="kubelet", hostPath=HostPathVolumeSource(path="/var/lib/kubelet")),
                     Volume(name="cdi", hostPath=HostPathVolumeSource(path="/var/run/cdi"))],
        ))))


def report(node: SimNode, uid: str) -> dict[str, object] | None:
    path = node.pod_dir(uid) / "report.json"
    return json.loads(path.read_text()) if path.exists() else None


def jwt_claims(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_daemonset_pods_run_as_local_processes_that_see_a_pod_environment(cluster: Cluster,
                                                                         nodes: list[SimNode]) -> None:
    client = cluster.client
    with contextlib.suppress(ApiError):
        client.create(ServiceAccount(metadata=ObjectMeta(name="echo-agent", namespace="default")))
    client.create(daemonset("echo-agent"))
    try:
        pods = eventually("one running agent pod per node", lambda: (
            ps if len(ps := [p for p in client.list(Pod, namespace="default", labels={"app": "echo-agent"})
                             if p.status and p.status.phase == "Running"]) == 2 else None))
        by_node = {p.spec.nodeName: p for p in pods}
        assert set(by_node) == {n.name for n in nodes}
        for node in nodes:
            pod = by_node[node.name]
            rep = eventually(f"the agent on {node.name} to report",
                             lambda node=node, uid=pod.metadata.uid: report(node, uid))
            env = rep["env"]
            assert env["NODE_NAME"] == node.name and env["POD_UID"] == pod.metadata.uid
            # Nothing rewritten: the volumes are at their mount paths in the container's own view.
            assert env["KUBELET_ROOT"] == "/var/lib/kubelet/plugins"
            assert rep["args"] == ["--cdi-root", "/var/run/cdi", "--plain", "value"]
            assert rep["kubelet_root"] == sorted(p.name for p in node.kubelet_root.iterdir())
            assert f"{node.address}\t{pod.metadata.name}\n" in rep["hosts"]
            assert env["NVLFABRIC_NVML_NODE"] == node.name
            assert env["KUBERNETES_SERVICE_PORT"] == str(cluster.controlplane.ports.apiserver)
            assert rep["namespace"] == "default" and rep["ca"] is True
            claims = jwt_claims(str(rep["token"]))
            assert claims["sub"] == "system:serviceaccount:default:echo-agent"
            assert claims["kubernetes.io"]["node"]["name"] == node.name  # type: ignore[index]
            assert claims["kubernetes.io"]["pod"]["uid"] == pod.metadata.uid  # type: ignore[index]

        # Kill one: the kubelet restarts it and counts the restart in the pod status.
        victim = nodes[0]
        pod = by_node[victim.name]
        first = report(victim, pod.metadata.uid)["instance"]  # type: ignore[index]
        assert "killed pid" in faults.inject(victim.dir.parent.parent, victim, "agent-killed")
        restarted = eventually("the killed agent to be restarted", lambda: (
            r if (r := report(victim, pod.metadata.uid)) and r["instance"] != first else None))
        assert restarted["env"]["NODE_NAME"] == victim.name
        status = eventually("restartCount 1", lambda: (
            s if (s := client.get(Pod, pod.metadata.name, namespace="default").status.containerStatuses[0])
            .restartCount == 1 else None))
        assert status.lastState.terminated.exitCode == 137
    finally:
        client.delete(DaemonSet, "echo-agent", namespace="default")
    eventually("the agent pods to be gone", lambda: not list(
        client.list(Pod, namespace="default", labels={"app": "echo-agent"})), timeout=60)


def test_a_downed_node_stops_renewing_its_lease(cluster: Cluster, nodes: list[SimNode]) -> None:
    node = nodes[1]
    faults.inject(node.dir.parent.parent, node, "node-down")
    try:
        time.sleep(1)
        before = cluster.client.get(Lease, node.name, namespace="kube-node-lease").spec.renewTime
        time.sleep(12)  # longer than one renew interval (10 s)
        assert cluster.client.get(Lease, node.name, namespace="kube-node-lease").spec.renewTime == before
    finally:
        faults.inject(node.dir.parent.parent, node, "node-up")
    eventually("heartbeats to resume", lambda: cluster.client.get(
        Lease, node.name, namespace="kube-node-lease").spec.renewTime != before, timeout=15)
