"""What a node's kubelet does beyond DRA, on a simulated node: container logs and probes.

`kubectl logs` against simulated pods, asked as kubectl asks (the pod's log subresource): the API
server reaches the simulated kubelet's API on the node's address, each side checking the other's
certificate against the cluster CA.

Before, `kubectl logs` of any simulated pod failed (`dial tcp: lookup rack-1-node-02 ... no such
host`). The pure part (which bytes a query selects) is a property test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from lightkube import ApiError
from lightkube.models.admissionregistration_v1 import (
    MatchResources,
    NamedRuleWithOperations,
    ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec,
    Validation,
)
from lightkube.models.core_v1 import (
    Container,
    EmptyDirVolumeSource,
    EnvVar,
    EnvVarSource,
    ExecAction,
    HostPathVolumeSource,
    ObjectFieldSelector,
    PodSpec,
    TCPSocketAction,
    Volume,
    VolumeMount,
)
from lightkube.models.core_v1 import Probe as ProbeSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Event, Pod

from nvlfabric.sim import hardware
from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.kubelet import probes
from nvlfabric.sim.kubelet.logs import select
from nvlfabric.sim.nodes import SimNode
from tests.conftest import Cluster
from tests.support.agents import pod_gone
from tests.support.policies import policy_in_effect
from tests.support.simkubelet import standalone_kubelet, state_dir

RACK = 207  # a rack number of its own
PRINTER = ("import sys, time\nfor i in range(1, 4): print(f'line {i}', flush=True)\ntime.sleep(1.5)\n"
           "print('line 4', flush=True)\ntime.sleep(3600)\n")


# -- which bytes a query selects (pure) ---------------------------------------------------------------


@given(st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=12),
       st.one_of(st.none(), st.integers(-2, 15)), st.one_of(st.none(), st.integers(0, 200)))
def test_select_takes_the_last_lines_then_at_most_the_bytes(lines: list[bytes], tail: int | None,
                                                            limit: int | None) -> None:
    data = b"".join(lines)
    out = select(data, tail_lines=tail, limit_bytes=limit)
    wanted = lines if tail is None else (lines[-tail:] if tail > 0 else [])
    assert out == b"".join(wanted)[:limit] if limit is not None else out == b"".join(wanted)
    assert data.endswith(select(data, tail_lines=tail))  # a tail is the log's end


def test_select_counts_an_unterminated_last_line() -> None:
    assert select(b"a\nb\npartial", tail_lines=1) == b"partial"
    assert select(b"a\nb\n", tail_lines=1) == b"b\n"


# -- through the API server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[SimNode]:
    with standalone_kubelet(cluster, state_dir("nvll-"), rack=RACK,
                            images={"registry.invalid/printer": [sys.executable, "-c", PRINTER]},
                            args=["--pki-dir", str(cluster.controlplane.state_dir / "pki")]) as ((n,), _):
        yield n
        client = cluster.client
        for pod in client.list(Pod, namespace="default", fields={"spec.nodeName": n.name}):
            with contextlib.suppress(ApiError):
                client.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)


@pytest.mark.cluster
def test_kubectl_logs_shows_a_pods_output_its_tail_and_follows_it(cluster: Cluster, node: SimNode) -> None:
    client = cluster.client
    pod = f"logs-{uuid.uuid4().hex[:5]}"
    client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        containers=[Container(name="main", image="registry.invalid/printer:1"),
                    Container(name="sidecar", image="registry.invalid/log:1")])))
    eventually("the pod to run", lambda: (p := client.get(Pod, pod, namespace="default")).status is not None
               and p.status.phase == "Running", timeout=30)
    eventually("the first three lines", lambda: "".join(client.log(pod, namespace="default", container="main"))
               .startswith("line 1\nline 2\nline 3\n"), timeout=10)

    # As `kubectl logs` asks the API server (GET pods/<pod>/log), with its options.
    def logs(**kw: Any) -> str:
        return "".join(client.log(pod, namespace="default", **kw))

    def raw(container: str, **params: str) -> tuple[int, str]:
        """The log subresource with the parameters lightkube's `log` does not take."""
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        ctx = ssl.create_default_context(cafile=str(cluster.controlplane.state_dir / "pki" / "ca.crt"))
        query = urllib.parse.urlencode({"container": container, **params})
        req = urllib.request.Request(f"{config['clusters'][0]['cluster']['server']}/api/v1/namespaces/default/"
                                     f"pods/{pod}/log?{query}")
        req.add_header("Authorization", f"Bearer {config['users'][0]['user']['token']}")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert logs(container="main", tail_lines=1) in ("line 3\n", "line 4\n")
    followed = client.log(pod, namespace="default", container="main", follow=True)
    assert [next(followed) for _ in range(4)] == ["line 1\n", "line 2\n", "line 3\n", "line 4\n"]

    # A container that runs nothing says so, and where its record is.
    side = logs(container="sidecar")
    assert f"container sidecar (image registry.invalid/log:1) is simulated on node {node.name}" in side, side
    assert f"default_{pod}_sidecar.json" in side
    # A previous instance there was not, or a container the pod does not have: the error says which.
    assert raw("main", limitBytes="4") == (200, "line")
    code, body = raw("main", previous="true")
    assert code == 400 and "previous terminated container" in body, (code, body)
    with pytest.raises(ApiError) as wrong:
        logs(container="nope")
    assert "nope" in str(wrong.value.status.message)
    client.delete(Pod, pod, namespace="default")


# -- probes ---------------------------------------------------------------------------------------


def test_a_counter_turns_after_its_thresholds() -> None:
    probe = probes.Probe("readiness", ProbeSpec(successThreshold=2, failureThreshold=3))
    c = probes.Counter(passing=False)
    assert [c.observe(ok, probe) for ok in (True, False, True, True, True)] == [None, None, None, True, None]
    assert [c.observe(ok, probe) for ok in (False, False, True, False, False, False)] == \
        [None, None, None, None, None, False]


def _pod(client: Any, node: SimNode, **container: Any) -> str:
    name = f"probe-{uuid.uuid4().hex[:5]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        containers=[Container(name="main", image="registry.invalid/printer:1", **container)])))
    return name


def _status(client: Any, pod: str) -> Any:
    return client.get(Pod, pod, namespace="default").status


def _events(client: Any, pod: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in client.list(Event, namespace="default",
                                                       fields={"involvedObject.name": pod})]


@pytest.mark.cluster
def test_a_pod_is_ready_only_once_its_readiness_probe_passes(cluster: Cluster, node: SimNode) -> None:
    client = cluster.client
    pod = _pod(client, node, readinessProbe=ProbeSpec(
        exec=ExecAction(command=["sh", "-c", "test -f ready || { echo not ready yet; exit 1; }"]), periodSeconds=1,
        failureThreshold=1))
    eventually("the pod to run", lambda: (s := _status(client, pod)) is not None and s.phase == "Running", timeout=30)
    # The event says what the probe printed, as the kubelet's does.
    eventually("a failed readiness probe", lambda: ("Unhealthy", "Readiness probe failed: not ready yet")
               in _events(client, pod), timeout=15)
    status = _status(client, pod)
    assert not status.containerStatuses[0].ready
    assert {c.type: c.status for c in status.conditions}["Ready"] == "False"
    uid = client.get(Pod, pod, namespace="default").metadata.uid
    (node.pod_dir(uid) / "ready").touch()  # the probe runs in the container's working directory
    eventually("the pod to be Ready", lambda: {c.type: c.status for c in _status(client, pod).conditions}.get(
        "Ready") == "True", timeout=15)
    client.delete(Pod, pod, namespace="default")


@pytest.mark.cluster
def test_an_exec_probes_command_expands_the_containers_plain_variables_as_the_kubelet_does(
        cluster: Cluster, node: SimNode) -> None:
    """`$(LEVEL)` (a plain value) is expanded; `$(NODE)` (from the downward API) is not, as the
    kubelet's prober expands only static values; `$$` is a literal `$`."""
    client = cluster.client
    pod = _pod(client, node, env=[EnvVar(name="LEVEL", value="3"),
                                  EnvVar(name="NODE", valueFrom=EnvVarSource(fieldRef=ObjectFieldSelector(
                                      fieldPath="spec.nodeName")))],
               readinessProbe=ProbeSpec(exec=ExecAction(command=["test", "$(LEVEL)|$(NODE)", "=", "3|$$(NODE)"]),
                                        periodSeconds=1, failureThreshold=1))
    eventually("the pod to be Ready", lambda: (s := _status(client, pod)) is not None and {
        c.type: c.status for c in s.conditions or []}.get("Ready") == "True", timeout=30)
    assert not [m for r, m in _events(client, pod) if r == "Unhealthy"]
    client.delete(Pod, pod, namespace="default")


@pytest.mark.cluster
def test_an_exec_probe_runs_inside_the_container(cluster: Cluster, node: SimNode) -> None:
    """It sees the container's own mounts (an emptyDir at /probe-data, a path the machine lacks),
    as the kubelet's ExecSync does, not the machine's (nor the container runtime's shim's)."""
    client = cluster.client
    name = f"probe-{uuid.uuid4().hex[:5]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        volumes=[Volume(name="data", emptyDir=EmptyDirVolumeSource())],
        containers=[Container(name="main", image="registry.invalid/printer:1", command=["sh", "-c"],
                              args=["touch /probe-data/ready; sleep 3600"],
                              volumeMounts=[VolumeMount(name="data", mountPath="/probe-data")],
                              readinessProbe=ProbeSpec(exec=ExecAction(command=["test", "-f", "/probe-data/ready"]),
                                                       periodSeconds=1, failureThreshold=1))])))
    assert not Path("/probe-data").exists()
    eventually("the pod to be Ready", lambda: (s := _status(client, name)) is not None and {
        c.type: c.status for c in s.conditions or []}.get("Ready") == "True", timeout=30)
    client.delete(Pod, name, namespace="default")


@pytest.mark.cluster
def test_a_failing_liveness_probe_restarts_the_container(cluster: Cluster, node: SimNode) -> None:
    client = cluster.client
    pod = _pod(client, node, livenessProbe=ProbeSpec(tcpSocket=TCPSocketAction(port=1), periodSeconds=1,
                                                       failureThreshold=2))
    eventually("the container to be restarted", lambda: (s := _status(client, pod)) is not None
               and s.containerStatuses and s.containerStatuses[0].restartCount >= 1, timeout=40)
    events = _events(client, pod)
    assert ("Killing", "Container main failed liveness probe, will be restarted") in events, events
    assert any(r == "Unhealthy" and m.startswith("Liveness probe failed") for r, m in events), events
    client.delete(Pod, pod, namespace="default")


@pytest.mark.cluster
def test_a_startup_probe_holds_readiness_and_liveness_back(cluster: Cluster, node: SimNode) -> None:
    client = cluster.client
    # Liveness would fail at once (nothing listens on port 1); it never runs while startup waits.
    pod = _pod(client, node, startupProbe=ProbeSpec(exec=ExecAction(command=["sh", "-c", "test -f started"]),
                                                     periodSeconds=1, failureThreshold=60),
               livenessProbe=ProbeSpec(tcpSocket=TCPSocketAction(port=1), periodSeconds=1, failureThreshold=1))
    eventually("the pod to run", lambda: (s := _status(client, pod)) is not None and s.phase == "Running", timeout=30)
    time.sleep(3)
    status = _status(client, pod)
    assert status.containerStatuses[0].restartCount == 0 and not status.containerStatuses[0].ready
    uid = client.get(Pod, pod, namespace="default").metadata.uid
    (node.pod_dir(uid) / "started").touch()
    eventually("the liveness probe, now running, to restart it", lambda: _status(client, pod).containerStatuses[0]
               .restartCount >= 1, timeout=30)
    client.delete(Pod, pod, namespace="default")


@pytest.mark.cluster
def test_a_crashing_container_waits_in_crash_loop_back_off_and_is_never_ready(cluster: Cluster,
                                                                             node: SimNode) -> None:
    """What `kubectl get pods` shows of a plugin that exits at start: restarted at once the first
    time, then `waiting` CrashLoopBackOff (not Running, not ready) with its exit as lastState; its
    startup probe never passed, so it is never ready, even in the moment it exits."""
    client = cluster.client
    pod = _pod(client, node, command=["sh", "-c"], args=["echo starting; sleep 0.3; exit 3"],
               startupProbe=ProbeSpec(tcpSocket=TCPSocketAction(port=1), periodSeconds=1, failureThreshold=600))
    seen_ready: list[int] = []

    def backing_off() -> object:
        cs = (s.containerStatuses or [None])[0] if (s := _status(client, pod)) is not None else None
        if cs is not None and cs.ready:
            seen_ready.append(cs.restartCount)
        waiting = cs.state.waiting if cs is not None and cs.state is not None else None
        return cs if waiting is not None and waiting.reason == "CrashLoopBackOff" else None

    cs = eventually("the container to wait in CrashLoopBackOff", backing_off, timeout=40, interval=0.1)
    assert cs.restartCount >= 1 and not cs.ready and not cs.started, cs
    assert cs.lastState.terminated.exitCode == 3, cs.lastState
    assert "back-off" in cs.state.waiting.message and "restarting failed container=main" in cs.state.waiting.message
    ready = next(c for c in _status(client, pod).conditions if c.type == "Ready")
    assert ready.status == "False"
    assert not seen_ready, f"the container was reported ready at restart(s) {seen_ready}"
    client.delete(Pod, pod, namespace="default")


@pytest.mark.cluster
def test_a_containers_command_replaces_its_images_entrypoint_with_variables_expanded(cluster: Cluster,
                                                                                      node: SimNode) -> None:
    client = cluster.client
    pod = _pod(client, node, command=["sh", "-c"], args=["echo $(GREETING) from the command; sleep 3600"],
               env=[EnvVar(name="GREETING", value="hello")])
    eventually("the pod to run", lambda: (s := _status(client, pod)) is not None and s.phase == "Running", timeout=30)
    eventually("its output", lambda: "".join(client.log(pod, namespace="default", container="main")) ==
               "hello from the command\n", timeout=30)
    client.delete(Pod, pod, namespace="default")


@pytest.mark.cluster
def test_a_container_sees_the_nodes_driver_as_on_a_gpu_node(cluster: Cluster, node: SimNode) -> None:
    """`/proc/driver/nvidia` and `/proc/devices` are the node's (what the kernel module shows:
    NVIDIA's plugin reads the IMEX channel major there), `/proc/driver/nvidia` is no mount point
    of its own (NVIDIA's plugin unmounts everything mounted below it), and a hostPath of the driver root's
    parent (`/run/nvidia`, as NVIDIA's chart mounts it) holds the driver root."""
    hardware.install_driver_root(node, hardware.build_standins())
    hardware.install_host_files(node, [0, 1, 2, 3])
    client = cluster.client
    name = f"drv-{uuid.uuid4().hex[:5]}"
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        volumes=[Volume(name="run-nvidia", hostPath=HostPathVolumeSource(path="/run/nvidia"))],
        containers=[Container(name="main", image="registry.invalid/printer:1", command=["sh", "-c"], args=[
            "head -c 12 /proc/driver/nvidia/version; echo; grep imex /proc/devices;"
            " stat -c %d /proc/driver /proc/driver/nvidia | uniq | wc -l;"
            " ls /run/nvidia/driver/usr/bin; sleep 3600"],
            volumeMounts=[VolumeMount(name="run-nvidia", mountPath="/run/nvidia")])])))
    out = eventually("its output", lambda: (o if "nvidia-smi" in (o := "".join(client.log(
        name, namespace="default", container="main"))) else None) if (s := _status(client, name)) is not None
        and s.phase == "Running" else None, timeout=30)
    assert out.splitlines()[0] == "NVRM version", out
    assert out.splitlines()[1].split()[1] == "nvidia-caps-imex-channels", out
    assert out.splitlines()[2] == "1", f"/proc/driver/nvidia is a mount point of its own (on a node it is none): {out}"
    assert {"nvidia-imex", "nvidia-imex-ctl", "nvidia-smi"} <= set(out.split()), out
    client.delete(Pod, name, namespace="default")


@pytest.mark.cluster
def test_every_container_of_a_pod_runs_and_restarts_on_its_own(cluster: Cluster, node: SimNode) -> None:
    client = cluster.client
    pod = f"two-{uuid.uuid4().hex[:5]}"
    client.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        containers=[Container(name="main", image="registry.invalid/printer:1"),
                    Container(name="side", image="registry.invalid/printer:1",
                              command=["sh", "-c", "echo side car; exec sleep 3600"])])))
    eventually("the pod to run", lambda: (s := _status(client, pod)) is not None and s.phase == "Running", timeout=30)
    eventually("both containers' output", lambda: "".join(client.log(pod, namespace="default", container="side"))
               == "side car\n" and "line 1" in "".join(client.log(pod, namespace="default", container="main")),
               timeout=15)
    uid = client.get(Pod, pod, namespace="default").metadata.uid
    os.kill(int((node.pod_dir(uid) / "side.pid").read_text()), signal.SIGKILL)
    restarts = eventually("the sidecar alone to be restarted", lambda: (
        r if (r := {c.name: c.restartCount for c in _status(client, pod).containerStatuses})["side"] == 1 else None),
        timeout=30)
    assert restarts["main"] == 0
    side = next(c for c in _status(client, pod).containerStatuses if c.name == "side")
    assert side.lastState.terminated.exitCode == 137
    client.delete(Pod, pod, namespace="default")


# -- stopping pods ------------------------------------------------------------------------------------


@pytest.mark.cluster
def test_a_pod_taking_its_grace_to_stop_holds_up_no_other_pod(cluster: Cluster, node: SimNode) -> None:
    """A container that ignores SIGTERM is killed at the end of its grace; meanwhile the node goes
    on: another pod starts. (Stopping a pod held the whole simulated kubelet while it waited, so
    a teardown of 36 pods stalled every node's heartbeats for minutes and nodes went NotReady.)"""
    client = cluster.client
    stubborn, other = f"stub-{uuid.uuid4().hex[:5]}", f"next-{uuid.uuid4().hex[:5]}"
    client.create(Pod(metadata=ObjectMeta(name=stubborn, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        containers=[Container(name="main", image="registry.invalid/printer:1",
                              command=["sh", "-c", "trap '' TERM; echo up; exec sleep 3600"])])))
    eventually("it to run", lambda: "".join(client.log(stubborn, namespace="default", container="main")) == "up\n"
               if (s := _status(client, stubborn)) is not None and s.phase == "Running" else False, timeout=30)
    client.delete(Pod, stubborn, namespace="default")
    _pod_named(client, node, other)
    eventually("the other pod to run", lambda: (s := _status(client, other)) is not None and s.phase == "Running",
               timeout=30)
    assert not pod_gone(client, stubborn), "the other pod started only once the stubborn one was stopped"
    eventually("the stubborn pod to be killed and gone", lambda: pod_gone(client, stubborn), timeout=30)
    client.delete(Pod, other, namespace="default")


@pytest.mark.cluster
def test_a_refused_final_delete_is_retried_until_it_lands(cluster: Cluster, node: SimNode) -> None:
    """The kubelet's last word on a stopped pod (its grace-0 delete) is retried until the API server
    takes it. An admission policy refuses every delete of a pod already Terminating, as an API
    server that drops or refuses the request would: the pod stays, the node says why (FailedSync),
    and once the refusal ends the pod goes. (A pod whose final delete was dropped was marked done
    before it and stayed Terminating for good: two of 36 on the destroy of an 18-node domain.)"""
    admin, label = cluster.client, {"nvlfabric.test/refuse-final-delete": uuid.uuid4().hex[:8]}
    policy = f"refuse-final-delete-{label['nvlfabric.test/refuse-final-delete']}"
    pod, probe = f"last-{uuid.uuid4().hex[:5]}", f"probe-{uuid.uuid4().hex[:5]}"
    _pod_named(admin, node, pod, labels=label)
    eventually("the pod to run", lambda: (s := _status(admin, pod)) is not None and s.phase == "Running", timeout=30)
    # The policy's probe: a pod on no node, Terminating for good (its finalizer) before the policy
    # exists, so only a dry-run delete of it says when the policy is in effect.
    admin.create(Pod(metadata=ObjectMeta(name=probe, namespace="default", labels=label,
                                         finalizers=["nvlfabric.test/hold"]),
                     spec=PodSpec(containers=[Container(name="main", image="registry.invalid/none:1")])))
    admin.delete(Pod, probe, namespace="default")
    admin.create(ValidatingAdmissionPolicy(metadata=ObjectMeta(name=policy), spec=ValidatingAdmissionPolicySpec(
        failurePolicy="Fail",
        matchConstraints=MatchResources(objectSelector=LabelSelector(matchLabels=label), resourceRules=[
            NamedRuleWithOperations(apiGroups=[""], apiVersions=["v1"], operations=["DELETE"], resources=["pods"])]),
        validations=[Validation(expression="!has(oldObject.metadata.deletionTimestamp)",
                                message="this test refuses the final delete", reason="Forbidden")])))
    admin.create(ValidatingAdmissionPolicyBinding(metadata=ObjectMeta(name=policy), spec=(
        ValidatingAdmissionPolicyBindingSpec(policyName=policy, validationActions=["Deny"]))))
    try:
        policy_in_effect(lambda: admin.delete(Pod, probe, namespace="default", dry_run=True))
        admin.delete(Pod, pod, namespace="default")
        eventually("the node to say its delete was refused", lambda: any(
            reason == "FailedSync" and "this test refuses the final delete" in (message or "")
            for reason, message in _events(admin, pod)), timeout=30)
        assert not pod_gone(admin, pod)
    finally:
        admin.delete(ValidatingAdmissionPolicyBinding, policy)
        admin.delete(ValidatingAdmissionPolicy, policy)
        admin.patch(Pod, probe, namespace="default", obj={"metadata": {"finalizers": None}})
    eventually("the pod to go once its delete is taken", lambda: pod_gone(admin, pod), timeout=30)


def _pod_named(client: Any, node: SimNode, name: str, labels: dict[str, str] | None = None) -> None:
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default", labels=labels), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": node.name},
        containers=[Container(name="main", image="registry.invalid/printer:1")])))
