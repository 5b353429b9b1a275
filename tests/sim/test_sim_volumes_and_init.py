"""What a simulated kubelet gives a container besides its process: the files of its configMap,
secret, downwardAPI and projected volumes as the kubelet writes them, its image's files at their
image paths, and init containers run in order before the pod's containers (a failed one retried,
the pod's containers waiting)."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import (
    ConfigMapVolumeSource,
    Container,
    DownwardAPIVolumeFile,
    DownwardAPIVolumeSource,
    EmptyDirVolumeSource,
    KeyToPath,
    ObjectFieldSelector,
    PodSpec,
    SecretVolumeSource,
    Volume,
    VolumeMount,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Secret

from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.nodes import SimNode, in_pid_namespace
from tests.conftest import Cluster
from tests.support.simkubelet import standalone_kubelet, state_dir

pytestmark = pytest.mark.cluster
RACK = 95
SHELL = "nvlfabric.test/shell"
IMAGED = "nvlfabric.test/imaged"  # a shell image that also holds files (nvlfabric/sim/images.py)
BROKEN = "nvlfabric.test/broken"  # ... one of which is not on this machine


@contextlib.contextmanager
def one_node(cluster: Cluster, rack: int) -> Iterator[tuple[SimNode, subprocess.Popen[str]]]:
    """A simulated kubelet process of one node whose shell image runs `/bin/sh -c <args>`."""
    state = state_dir("nvlv-")
    held = state / "image"  # what IMAGED holds, as a build would have left it on this machine
    (held / "templates").mkdir(parents=True)
    (held / "templates" / "plugin.tmpl").write_text("kind: {{ .Kind }}\n")
    (held / "helper.sh").write_text("#!/bin/sh\necho helper ran as $0\n")
    (held / "helper.sh").chmod(0o755)
    shell = ["/bin/sh", "-c"]
    images = {SHELL: shell,
              IMAGED: {"entrypoint": shell, "files": {"/templates": str(held / "templates"),
                                                      "/usr/local/bin/nvlfabric-helper.sh": str(held / "helper.sh")}},
              BROKEN: {"entrypoint": shell, "files": {"/templates": str(held / "not-built")}}}
    with standalone_kubelet(cluster, state, rack=rack, images=images) as ((n,), proc):
        yield n, proc


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[SimNode]:
    with one_node(cluster, RACK) as (n, _):
        yield n


def _log(node: SimNode, pod: Pod, container: str) -> str:
    assert pod.metadata is not None
    path = node.pod_dir(pod.metadata.uid or "") / f"{container}.log"
    return path.read_text() if path.exists() else ""


def _delete(cluster: Cluster, *objects: tuple[type, str]) -> None:
    for kind, name in objects:
        with contextlib.suppress(ApiError):
            cluster.client.delete(kind, name, namespace="default")


def test_volume_files_are_there_as_the_kubelet_writes_them(cluster: Cluster, node: SimNode) -> None:
    client, suffix = cluster.client, uuid.uuid4().hex[:5]
    cm, secret, pod = f"cfg-{suffix}", f"sec-{suffix}", f"vol-{suffix}"
    client.create(ConfigMap(metadata=ObjectMeta(name=cm, namespace="default"),
                            data={"a.conf": "alpha\n", "b.conf": "beta\n"},
                            binaryData={"blob": base64.b64encode(b"\x00\x01").decode()}))
    client.create(Secret(metadata=ObjectMeta(name=secret, namespace="default"),
                         data={"password": base64.b64encode(b"hunter2").decode()}))
    script = ("ls /cfg; cat /cfg/a.conf /picked/renamed; od -An -tx1 /cfg/blob; cat /sec/password; echo; "
              "stat -c %a /sec/password; cat /info/name; echo; cat /info/labels; echo; "
              "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; sleep 300")
    try:
        client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default", labels={"app": "vol", "tier": "x"}),
                          spec=PodSpec(nodeName=node.name, containers=[Container(
                              name="c", image=SHELL, args=[script], volumeMounts=[
                                  VolumeMount(name="cfg", mountPath="/cfg"),
                                  VolumeMount(name="picked", mountPath="/picked"),
                                  VolumeMount(name="sec", mountPath="/sec"),
                                  VolumeMount(name="info", mountPath="/info")])], volumes=[
                              Volume(name="cfg", configMap=ConfigMapVolumeSource(name=cm)),
                              Volume(name="picked", configMap=ConfigMapVolumeSource(
                                  name=cm, items=[KeyToPath(key="b.conf", path="renamed")])),
                              Volume(name="sec", secret=SecretVolumeSource(secretName=secret, defaultMode=0o400)),
                              Volume(name="info", downwardAPI=DownwardAPIVolumeSource(items=[
                                  DownwardAPIVolumeFile(path="name", fieldRef=ObjectFieldSelector(
                                      fieldPath="metadata.name")),
                                  DownwardAPIVolumeFile(path="labels", fieldRef=ObjectFieldSelector(
                                      fieldPath="metadata.labels"))]))])))
        running = eventually("the pod to run and print its volumes", lambda: (
            p if "default" in _log(node, p := client.get(Pod, pod, namespace="default"), "c") else None), timeout=60)
        out = _log(node, running, "c").split("\n")
        assert out[:4] == ["a.conf", "b.conf", "blob", "alpha"]
        assert out[4] == "beta"
        assert out[5].split() == ["00", "01"]
        assert out[6:8] == ["hunter2", "400"]
        assert out[8:11] == [pod, 'app="vol"', 'tier="x"']
        assert out[11] == "default"  # the service-account volume's namespace file, from its downwardAPI source
    finally:
        _delete(cluster, (Pod, pod), (ConfigMap, cm), (Secret, secret))


def test_an_images_files_are_at_their_image_paths_and_the_machine_keeps_its_own(
        cluster: Cluster, node: SimNode) -> None:
    """An image's files (its binaries, templates, helper scripts) are where the image has them, in
    its containers only; one that is not on this machine is the pod's FailedSync event, naming it."""
    client, suffix = cluster.client, uuid.uuid4().hex[:5]
    pod, broken = f"img-{suffix}", f"imgx-{suffix}"
    script = ("cat /templates/plugin.tmpl; /usr/local/bin/nvlfabric-helper.sh; test -w /templates || echo read-only; "
              "echo done; sleep 300")
    try:
        client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
            nodeName=node.name, containers=[Container(name="c", image=f"{IMAGED}:1.0", args=[script])])))
        client.create(Pod(metadata=ObjectMeta(name=broken, namespace="default"), spec=PodSpec(
            nodeName=node.name, containers=[Container(name="c", image=BROKEN, args=["sleep 300"])])))
        running = eventually("the pod to run its image's files", lambda: (
            p if "done" in _log(node, p := client.get(Pod, pod, namespace="default"), "c") else None), timeout=60)
        assert _log(node, running, "c").split("\n")[:4] == [
            "kind: {{ .Kind }}", "helper ran as /usr/local/bin/nvlfabric-helper.sh", "read-only", "done"]
        assert not Path("/templates").exists() and not Path("/usr/local/bin/nvlfabric-helper.sh").exists()
        event = eventually("a FailedSync event", lambda: next(
            (e for e in client.list(Event, namespace="default", fields={"involvedObject.name": broken})
             if e.reason == "FailedSync"), None), timeout=30)
        assert f"image {BROKEN}: its file /templates is " in (event.message or "")
        assert "not-built on this machine, which does not exist" in (event.message or "")
    finally:
        _delete(cluster, (Pod, pod), (Pod, broken))


def test_a_missing_config_map_fails_the_mount_and_the_pod_waits(cluster: Cluster, node: SimNode) -> None:
    client, pod = cluster.client, f"nomap-{uuid.uuid4().hex[:5]}"
    try:
        client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
            nodeName=node.name, containers=[Container(name="c", image=SHELL, args=["sleep 300"], volumeMounts=[
                VolumeMount(name="cfg", mountPath="/cfg")])],
            volumes=[Volume(name="cfg", configMap=ConfigMapVolumeSource(name="not-there"))])))
        event = eventually("a FailedMount event", lambda: next(
            (e for e in client.list(Event, namespace="default", fields={"involvedObject.name": pod})
             if e.reason == "FailedMount"), None), timeout=30)
        assert 'configmap "not-there" not found' in (event.message or "")
        assert client.get(Pod, pod, namespace="default").status.phase == "Pending"  # type: ignore[union-attr]
    finally:
        _delete(cluster, (Pod, pod))


def test_init_containers_run_in_order_before_the_containers(cluster: Cluster, node: SimNode) -> None:
    client, pod = cluster.client, f"init-{uuid.uuid4().hex[:5]}"
    shared = VolumeMount(name="work", mountPath="/work")
    try:
        client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
            nodeName=node.name, restartPolicy="Always", volumes=[Volume(name="work", emptyDir=EmptyDirVolumeSource())],
            initContainers=[
                Container(name="first", image=SHELL, args=["echo one >> /work/order"], volumeMounts=[shared]),
                # Fails on its first run (no marker yet): retried with back-off, `first` not run again.
                Container(name="second", image=SHELL, args=[
                    "echo two >> /work/order; test -e /work/marker && exit 0; touch /work/marker; exit 3"],
                    volumeMounts=[shared])],
            containers=[Container(name="main", image=SHELL, args=["cat /work/order; sleep 300"],
                                  volumeMounts=[shared])])))
        running = eventually("the pod to run after its init containers", lambda: (
            p if (p := client.get(Pod, pod, namespace="default")).status and p.status.phase == "Running"
            and "two" in _log(node, p, "main") else None), timeout=90)
        assert _log(node, running, "main").split() == ["one", "two", "two"]
        assert running.status is not None
        statuses = {s.name: s for s in running.status.initContainerStatuses or []}
        assert statuses["first"].restartCount == 0 and statuses["second"].restartCount == 1
        assert statuses["second"].state.terminated.reason == "Completed"  # type: ignore[union-attr]
        assert statuses["second"].lastState.terminated.exitCode == 3  # type: ignore[union-attr]
        backoff = [e for e in client.list(Event, namespace="default", fields={"involvedObject.name": pod})
                   if e.reason == "BackOff"]
        assert backoff and "init container second" in (backoff[0].message or "")
    finally:
        _delete(cluster, (Pod, pod))


def test_a_failed_init_container_fails_a_pod_that_never_restarts(cluster: Cluster, node: SimNode) -> None:
    client, pod = cluster.client, f"initfail-{uuid.uuid4().hex[:5]}"
    try:
        client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
            nodeName=node.name, restartPolicy="Never",
            initContainers=[Container(name="check", image=SHELL, args=["echo nope; exit 2"])],
            containers=[Container(name="main", image=SHELL, args=["sleep 300"])])))
        failed = eventually("the pod to fail", lambda: (
            p if (p := client.get(Pod, pod, namespace="default")).status and p.status.phase == "Failed" else None),
            timeout=60)
        assert failed.status is not None
        (check,) = failed.status.initContainerStatuses or []
        assert check.state.terminated.exitCode == 2  # type: ignore[union-attr]
        assert not _log(node, failed, "main")  # the pod's container never ran
    finally:
        _delete(cluster, (Pod, pod))


def test_a_killed_kubelet_takes_its_nodes_and_their_containers_with_it(cluster: Cluster) -> None:
    """kill -9 of the simulated kubelet process: each node's PID namespace (setpriv --pdeathsig)
    and every container running in it go too, so nothing of a crashed simulator runs on."""
    pod = f"orphan-{uuid.uuid4().hex[:5]}"
    with one_node(cluster, RACK + 1) as (n, proc):
        try:
            cluster.client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
                nodeName=n.name, containers=[Container(name="c", image=SHELL, args=["echo up; sleep 600"])])))
            eventually("the container to run", lambda: "up" in _log(node=n, pod=cluster.client.get(
                Pod, pod, namespace="default"), container="c"), timeout=60)
            # The machine's first process, the container's init, its shell and its sleep (in a
            # namespace of the container's own, inside the node's).
            ns = os.stat(f"/proc/{int(n.machine_pid_file.read_text())}/ns/pid")
            assert len(_in_or_under(ns)) >= 4
            proc.kill()
            proc.wait(timeout=10)
            eventually("nothing left in the node's PID namespace", lambda: not _in_or_under(ns), timeout=15)
        finally:
            with contextlib.suppress(ApiError):  # no kubelet left to finish a graceful delete
                cluster.client.delete(Pod, pod, namespace="default", grace_period=0)


def _in_or_under(ns: os.stat_result) -> list[int]:
    """Processes in PID namespace `ns` or one inside it."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and in_pid_namespace(int(p), ns)]
