"""A node run by the real kubelet (built from the pinned Kubernetes module) beside a simulated one.

One rack of two nodes: rack-241-node-00 is the simulated kubelet's, rack-241-node-01 the real
kubelet's, against nvlfabric's CRI stand-in (nvlfabric/sim/cri). nvlfabric's driver is deployed
unchanged, as on a cluster; a ComputeDomain's pods run on both nodes. What the real kubelet does
here is its own: plugin registration, NodePrepareResources, the CDI device in CreateContainer,
probes, restarts, `allocatedResourcesStatus`, unprepare on delete, `kubectl logs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric import manifests
from nvlfabric.api.names import FABRIC_UNHEALTHY_TAINT, GPU_CDI_KIND
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim import faults, realnode
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import print_simulator_logs
from tests.support.agents import domain_with_pods, pod_gone
from tests.support.gpus import allocated, gpu_health, gpu_pod, gpu_slice, running, set_agent_env

pytestmark = pytest.mark.cluster
RACK = 241
HOST_TUNABLES = {name: Path("/proc/sys", name).read_text() for name in realnode.KERNEL_TUNABLES
                 if Path("/proc/sys", name).exists()}
HOST_HAD_KUBELET_ROOT = Path("/var/lib/kubelet").exists()


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[ControlPlane, Client]]:
    state = Path(tempfile.mkdtemp(prefix="nvlr-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=1, nodes_per_rack=2, first_rack=RACK,
                      real_kubelets=1, progress=lambda m: None)
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="e2e")
    try:
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, field_manager="e2e", force=True)
        yield cp, client
    finally:
        client.close()
        cp.down()
        print_simulator_logs(state)
        for log in sorted(state.glob("nodes/*/real-kubelet/kubelet.log")):
            print(f"--- {log.relative_to(state)}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        shutil.rmtree(state, ignore_errors=True)


def _agent(client: Client, node: str) -> Pod:
    (pod,) = [p for p in client.list(Pod, namespace="nvlfabric-system", labels={"app.kubernetes.io/name":
                                                                                "nvlfabric-agent"})
              if p.spec is not None and p.spec.nodeName == node]
    return pod


def _ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []) if pod.status)


def test_the_real_kubelet_registers_its_node_and_leaves_the_host_as_it_was(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    (real,) = cp.real_nodes()
    node = client.get(Node, real.name)
    assert node.metadata is not None and node.status is not None and node.status.nodeInfo is not None
    assert (node.metadata.labels or {})[realnode.REAL_KUBELET_LABEL] == "real"
    assert node.status.nodeInfo.kubeletVersion == "v1.37.2"  # the real one (the simulated says -nvlfabric-sim)
    assert node.status.nodeInfo.containerRuntimeVersion == "nvlfabric-sim://0.1.0"
    assert (node.status.allocatable or {})["nvidia.com/gpu"] == "4"
    assert [a.address for a in node.status.addresses or [] if a.type == "InternalIP"] == \
        realnode.machine_addresses()[:1]
    # The kernel tunables the kubelet sets went into the node's stand-in files, not the host.
    assert {n: Path("/proc/sys", n).read_text() for n in HOST_TUNABLES} == HOST_TUNABLES
    tunables = real.real_kubelet_dir / "sysctl"
    assert (tunables / "vm.overcommit_memory").read_text().strip() == "1"
    assert (tunables / "kernel.panic").read_text().strip() == "10"
    assert Path("/var/lib/kubelet").exists() == HOST_HAD_KUBELET_ROOT
    assert (real.kubelet_root / "pods").is_dir()  # its /var/lib/kubelet is the node's directory
    assert not list((real.real_kubelet_dir / "scratch").iterdir())  # nothing written where it runs


def test_a_domain_over_a_real_kubelet_node_and_a_simulated_one(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    simulated, real = cp.nodes()
    names = [simulated.name, real.name]
    eventually("both agents to label their Nodes with the clique", lambda: all(
        (client.get(Node, n).metadata.labels or {}).get(pools.CLIQUE_LABEL) for n in names), timeout=120)
    eventually("the agent on the real-kubelet node to be Ready (its probes, run by the real kubelet)",
               lambda: _ready(_agent(client, real.name)), timeout=120)
    name = f"mix-{uuid.uuid4().hex[:5]}"
    domain_with_pods(client, name, names)
    try:
        for i in range(2):
            eventually(f"pod {name}-{i} to run", lambda i=i: (
                client.get(Pod, f"{name}-{i}", namespace="default").status.phase == "Running"), timeout=120)
        claim = client.get(ResourceClaim, f"{name}-channel", namespace="default")
        assert claim.status is not None and claim.status.allocation is not None
        (result,) = claim.status.allocation.devices.results  # type: ignore[union-attr]
        channel = int(result.device.removeprefix("channel-"))
        # The CDI device the agent prepared reached the runtime in CreateContainer, and the runtime
        # applied it, on both kinds of node.
        for node in (simulated, real):
            record = json.loads((node.containers_dir / f"default_{name}-{names.index(node.name)}_worker.json")
                                .read_text())
            cdi_id = f"k8s.channel.nvlfabric.io/claim={claim.metadata.uid}-channel-{channel}"  # type: ignore[union-attr]
            assert record["cdi_device_ids"] == [cdi_id]
            assert record["deviceNodes"] == [{"path": f"/dev/nvidia-caps-imex-channels/channel{channel}", "type": "c",
                                              "major": 507, "minor": channel}]
            assert f"NVLFABRIC_IMEX_CHANNEL={channel}" in record["env"]
        assert json.loads((real.containers_dir / f"default_{name}-1_worker.json").read_text())["runtime"] \
            == "nvlfabric-sim"

        def health(expected: str) -> bool:
            pod = client.get(Pod, f"{name}-1", namespace="default")
            statuses = (pod.status.containerStatuses or []) if pod.status else []
            found = [h.health for s in statuses for r in s.allocatedResourcesStatus or [] for h in r.resources]
            return found == [expected]

        eventually("the real kubelet to report the channel Healthy (the agent's health stream)",
                   lambda: health("Healthy"), timeout=60)
        status = eventually("the domain to be Ready on both nodes", lambda: (
            s if (s := client.get(ComputeDomainResource, name, namespace="default").status or {}).get("phase")
            == "Ready" and s.get("readyNodes") == 2 else None), timeout=90)
        assert status["channel"] == channel

        # `kubectl logs` of the agent on the real-kubelet node: API server → the real kubelet → the
        # CRI-format log our runtime's proxy writes.
        agent = _agent(client, real.name)
        assert agent.metadata is not None and agent.metadata.name is not None
        logs = "\n".join(client.log(agent.metadata.name, namespace="nvlfabric-system"))
        assert "registered with the kubelet" in logs

        # kill -9 the agent: the real kubelet restarts it, it registers again, health comes back,
        # and the running pod is not disturbed.
        before = client.get(Pod, f"{name}-1", namespace="default")
        print(faults.inject(cp.state_dir, real, "agent-killed"))
        eventually("the real kubelet to restart the agent", lambda: (
            (s := _agent(client, real.name).status) is not None
            and [c.restartCount for c in s.containerStatuses or []] == [1] and _ready(_agent(client, real.name))),
            timeout=120)
        eventually("health Healthy again after the restart", lambda: health("Healthy"), timeout=60)
        after = client.get(Pod, f"{name}-1", namespace="default")
        assert after.status is not None and before.status is not None
        assert [c.restartCount for c in after.status.containerStatuses or []] == [0]
        assert after.status.phase == "Running"
    finally:
        for i in range(2):
            with contextlib.suppress(ApiError):
                client.delete(Pod, f"{name}-{i}", namespace="default")
    for i in range(2):
        eventually("the pods to be removed after unprepare", lambda i=i: pod_gone(client, f"{name}-{i}"), timeout=120)
    for node in (simulated, real):
        assert not list((node.dir / "cdi" / "run").glob("k8s.channel.nvlfabric.io-claim_*")), node.name
    claim = client.get(ResourceClaim, f"{name}-channel", namespace="default")
    # no pod holds it any more (only its ComputeDomain does: the channel stays the domain's)
    assert claim.status is not None and not [r for r in claim.status.reservedFor or [] if r.resource == "pods"]


def test_the_real_kubelet_prepares_gpu_claims_and_shows_a_sick_gpu_in_the_pods_status(
        sim: tuple[ControlPlane, Client]) -> None:
    """Issue 51 item 4 on the real kubelet: with gpu_devices DRA the agent's second plugin
    (gpu.nvlfabric.io) registers, its GPU claim is prepared into the CDI device of the GPU, and a
    GPU whose fabric turns unhealthy is tainted in the node's slice and shown Unhealthy in the
    pod's allocatedResourcesStatus by the real kubelet (the plugin's health stream), then Healthy."""
    cp, client = sim
    _, real = cp.nodes()
    name = f"gpu-real-{uuid.uuid4().hex[:5]}"
    try:
        set_agent_env(client, PUBLISH_GPUS="true")
        eventually("the real-kubelet node's agent to publish its GPUs", lambda: gpu_slice(client, real.name) == {
            f"gpu-{i}": [] for i in range(4)}, timeout=120)
        eventually("the agent on the real-kubelet node to be Ready", lambda: _ready(_agent(client, real.name)),
                   timeout=120)
        gpu_pod(client, name, real.name, 2)
        eventually(f"pod {name} to run", lambda: running(client, name), timeout=120)
        assert allocated(client, name) == ["gpu-0", "gpu-1"]
        record = json.loads((real.containers_dir / f"default_{name}_worker.json").read_text())
        assert sorted(record["cdi_device_ids"]) == [f"{GPU_CDI_KIND}=gpu-0", f"{GPU_CDI_KIND}=gpu-1"]
        assert sorted(n["path"] for n in record["deviceNodes"]) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]
        ids = {f"{GPU_CDI_KIND}=gpu-0", f"{GPU_CDI_KIND}=gpu-1"}
        eventually("the real kubelet to report both GPUs Healthy", lambda: {
            k: h for k, (h, _) in gpu_health(client, name).items()} == dict.fromkeys(ids, "Healthy"), timeout=60)
        faults.inject(cp.state_dir, real, "fabric-degraded", gpus=[1])
        try:
            eventually("GPU 1 tainted in the node's slice", lambda: (gpu_slice(client, real.name) or {}).get(
                "gpu-1") == [(FABRIC_UNHEALTHY_TAINT, "FabricDegraded", "NoSchedule")], timeout=10)
            health = eventually("the real kubelet to show GPU 1 Unhealthy", lambda: (
                h if (h := gpu_health(client, name)).get(f"{GPU_CDI_KIND}=gpu-1", ("",))[0] == "Unhealthy" else None),
                timeout=30)
            assert health[f"{GPU_CDI_KIND}=gpu-0"][0] == "Healthy"
            assert "bandwidth degraded" in (health[f"{GPU_CDI_KIND}=gpu-1"][1] or "")
            assert running(client, name)  # NoSchedule: told, not evicted
        finally:
            faults.inject(cp.state_dir, real, "clear")
        eventually("GPU 1 Healthy again", lambda: {k: h for k, (h, _) in gpu_health(client, name).items()}
                   == dict.fromkeys(ids, "Healthy"), timeout=30)
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Pod, name, namespace="default")
        eventually("the GPU pod to be removed after unprepare", lambda: pod_gone(client, name), timeout=120)
        with contextlib.suppress(ApiError):
            client.delete(ResourceClaim, name, namespace="default")
        set_agent_env(client, PUBLISH_GPUS="false")


def test_down_stops_the_real_kubelet_node_and_everything_it_ran() -> None:
    """A machine of its own: `down` leaves no kubelet, runtime, container or namespace behind."""
    state = Path(tempfile.mkdtemp(prefix="nvlr-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=1, nodes_per_rack=1, first_rack=RACK + 1,
                      real_kubelets=1, progress=lambda m: None)
    try:
        cp.up()
        (real,) = cp.real_nodes()
        init = int(real.machine_pid_file.read_text())
        ns = os.readlink(f"/proc/{init}/ns/pid")
        in_machine = [p for p in os.listdir("/proc") if p.isdigit() and _pid_ns(p) == ns]
        assert len(in_machine) >= 3  # its init, the runtime, the kubelet
    finally:
        cp.down()
        shutil.rmtree(state, ignore_errors=True)
    # The kernel ends the namespace's processes once its first one is killed; they go within moments.
    eventually("nothing left in the node's PID namespace", lambda: not [
        p for p in os.listdir("/proc") if p.isdigit() and _pid_ns(p) == ns], timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.kill(init, 0)
        pytest.fail(f"the machine's first process {init} outlived `down`")


def _pid_ns(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
