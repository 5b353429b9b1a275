"""A node real but for its GPUs, beside a simulated one (issue 52): the real kubelet, containerd
and runc, all built from their pinned Go modules, running nvlfabric's node image built from
deploy/Dockerfile.

One rack of two nodes: rack-241-node-00 is the simulated kubelet's, rack-241-node-01 the real
kubelet's with containerd (`nvlfabric-sim up --real-kubelets 1 --runtime containerd`). nvlfabric's
driver is deployed unchanged, as on a cluster: its DaemonSets run the agent and the IMEX keeper as
containers of the image; a ComputeDomain's pods run on both nodes. What the real parts do here is
their own: plugin registration, NodePrepareResources, CDI injection by containerd, probes,
restarts, `allocatedResourcesStatus`, unprepare on delete, `kubectl logs`, a rolling update.
Only NVML, the IMEX daemon and the GPU device nodes are simulated.
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
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import CascadeType

from nvlfabric import manifests
from nvlfabric.api.names import FABRIC_UNHEALTHY_TAINT, GPU_CDI_KIND
from nvlfabric.api.release import __version__
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.controller import pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim import faults, realnode
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed import nodeimages
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import print_simulator_logs
from tests.support.agents import domain_with_pods, imex_daemon, pod_gone
from tests.support.gpus import allocated, gpu_health, gpu_pod, gpu_slice, running, set_agent_env
from tests.support.onsim import single_clique_domain

pytestmark = pytest.mark.cluster
RACK = 241
HOST_TUNABLES = {name: Path("/proc/sys", name).read_text() for name in realnode.KERNEL_TUNABLES
                 if Path("/proc/sys", name).exists()}
HOST_HAD_KUBELET_ROOT = Path("/var/lib/kubelet").exists()


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[ControlPlane, Client]]:
    state = Path(tempfile.mkdtemp(prefix="nvlr-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=1, nodes_per_rack=2, first_rack=RACK,
                      real_kubelets=1, runtime="containerd", progress=print)
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
        for log in sorted([*state.glob("nodes/*/real-kubelet/kubelet.log"),
                           *state.glob("nodes/*/real-kubelet/containerd/containerd.log")]):
            print(f"--- {log.relative_to(state)}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        shutil.rmtree(state, ignore_errors=True)


#: What a workload container shows of itself in its log: its IMEX channels and GPUs as device
#: nodes, and its environment; it ends at once on SIGTERM (a shell as PID 1 ignores it otherwise).
SHOW = ["sh", "-c", "trap 'exit 0' TERM; ls -l /dev/nvidia-caps-imex-channels/ /dev/; env | sort; "
        "echo shown; while :; do sleep 1; done"]


def _agent(client: Client, node: str, app: str = "nvlfabric-agent") -> Pod:
    (pod,) = [p for p in client.list(Pod, namespace="nvlfabric-system", labels={"app.kubernetes.io/name": app})
              if p.spec is not None and p.spec.nodeName == node and p.metadata is not None
              and p.metadata.deletionTimestamp is None]
    return pod


def _shown(client: Client, pod: str) -> list[str]:
    """The lines a SHOW container printed (`kubectl logs`), once it has printed them all."""
    def printed() -> list[str] | None:
        lines = [ln.rstrip("\n") for ln in client.log(pod, namespace="default")]
        return lines if "shown" in lines else None

    return eventually(f"pod {pod} to show its devices and environment", printed, timeout=90)


def _container(client: Client, pod: str, namespace: str = "default") -> tuple[str, int]:
    """(container id, restart count) of a pod's one container."""
    status = client.get(Pod, pod, namespace=namespace).status
    assert status is not None
    (c,) = status.containerStatuses or []
    return str(c.containerID), c.restartCount


def _ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []) if pod.status)


def test_the_real_kubelet_registers_its_node_and_leaves_the_host_as_it_was(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    (real,) = cp.real_nodes()
    node = client.get(Node, real.name)
    assert node.metadata is not None and node.status is not None and node.status.nodeInfo is not None
    assert (node.metadata.labels or {})[realnode.REAL_KUBELET_LABEL] == "real"
    assert node.status.nodeInfo.kubeletVersion == "v1.37.2"  # the real one (the simulated says -nvlfabric-sim)
    assert node.status.nodeInfo.containerRuntimeVersion == "containerd://2.4.2"  # the real one, built by tools
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


def test_a_domain_over_a_containerd_node_and_a_simulated_one(sim: tuple[ControlPlane, Client]) -> None:
    cp, client = sim
    simulated, real = cp.nodes()
    names = [simulated.name, real.name]
    eventually("both agents to label their Nodes with the clique", lambda: all(
        (client.get(Node, n).metadata.labels or {}).get(pools.CLIQUE_LABEL) for n in names), timeout=180)
    eventually("the agent on the containerd node to be Ready (its probes, run by the real kubelet)",
               lambda: _ready(_agent(client, real.name)), timeout=120)
    # The driver's DaemonSets, unchanged, run containers of the image built from deploy/Dockerfile.
    for app in ("nvlfabric-agent", "nvlfabric-imex"):
        status = _agent(client, real.name, app).status
        assert status is not None
        (c,) = status.containerStatuses or []
        assert c.image == f"docker.io/nvlfabric/node-agent:{__version__}", c.image
        assert str(c.containerID).startswith("containerd://"), c.containerID
    name = f"mix-{uuid.uuid4().hex[:5]}"
    domain_with_pods(client, name, names, image=nodeimages.WORKLOAD_IMAGE, command=SHOW)
    try:
        for i in range(2):
            eventually(f"pod {name}-{i} to run", lambda i=i: (
                client.get(Pod, f"{name}-{i}", namespace="default").status.phase == "Running"), timeout=120)
        claim = client.get(ResourceClaim, f"{name}-channel", namespace="default")
        assert claim.status is not None and claim.status.allocation is not None
        (result,) = claim.status.allocation.devices.results  # type: ignore[union-attr]
        channel = int(result.device.removeprefix("channel-"))
        # On the containerd node containerd injected the CDI device the agent prepared: the
        # container sees the channel's device node and the spec's environment.
        shown = _shown(client, f"{name}-1")
        devices = [ln.split() for ln in shown if ln.startswith("c") and ln.endswith(f" channel{channel}")]
        assert len(devices) == 1 and devices[0][4:6] == ["507,", str(channel)], shown
        assert f"NVLFABRIC_IMEX_CHANNEL={channel}" in shown, shown
        # The simulated node's stand-in runtime applied the same edits.
        record = json.loads((simulated.containers_dir / f"default_{name}-0_worker.json").read_text())
        assert record["cdi_device_ids"] == [
            f"k8s.channel.nvlfabric.io/claim={claim.metadata.uid}-channel-{channel}"]  # type: ignore[union-attr]

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

        # `kubectl logs` of the agent on the containerd node: API server → the real kubelet → the
        # CRI log containerd's shim writes.
        agent = _agent(client, real.name)
        assert agent.metadata is not None and agent.metadata.name is not None
        logs = "\n".join(client.log(agent.metadata.name, namespace="nvlfabric-system"))
        assert "registered with the kubelet" in logs

        # kill -9 the agent's container process: the kubelet restarts the container, the agent
        # registers again, health comes back; the IMEX daemon and the running pod are kept.
        clique = (client.get(Node, real.name).metadata.labels or {})[pools.CLIQUE_LABEL]  # type: ignore[union-attr]
        daemons, _ = imex_daemon(real, clique)
        assert daemons, "no IMEX daemon of the clique on the containerd node"
        worker = _container(client, f"{name}-1")
        print(faults.inject(cp.state_dir, real, "agent-killed"))
        eventually("the real kubelet to restart the agent", lambda: (
            (s := _agent(client, real.name).status) is not None
            and [c.restartCount for c in s.containerStatuses or []] == [1] and _ready(_agent(client, real.name))),
            timeout=120)
        eventually("health Healthy again after the restart", lambda: health("Healthy"), timeout=60)
        assert _container(client, f"{name}-1") == worker
        assert imex_daemon(real, clique)[0] == daemons

        # A rolling update of the agent DaemonSet (a new pod template): each node's agent pod is
        # replaced, one at a time, under the running pod, which keeps its container and channel.
        before = {n: _agent(client, n).metadata.uid for n in names}  # type: ignore[union-attr]
        client.patch(DaemonSet, "nvlfabric-agent", {"spec": {"template": {"metadata": {"annotations": {
            "nvlfabric.io/rolled": name}}}}}, namespace="nvlfabric-system")
        def replaced(node: str) -> bool:  # the old pod goes before the new one is made (maxUnavailable 1)
            pods = [p for p in client.list(Pod, namespace="nvlfabric-system",
                                           labels={"app.kubernetes.io/name": "nvlfabric-agent"})
                    if p.spec is not None and p.spec.nodeName == node]
            return len(pods) == 1 and pods[0].metadata.uid != before[node] and _ready(pods[0])  # type: ignore[union-attr]

        eventually("both agents replaced and Ready", lambda: all(replaced(n) for n in names), timeout=180)
        eventually("health Healthy under the new agent", lambda: health("Healthy"), timeout=60)
        assert _container(client, f"{name}-1") == worker
        assert imex_daemon(real, clique)[0] == daemons
        assert client.get(Pod, f"{name}-1", namespace="default").status.phase == "Running"  # type: ignore[union-attr]
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


def test_a_bound_jobs_pod_on_the_containerd_node_sees_its_launcher_environment_and_finds_rank_0(
        sim: tuple[ControlPlane, Client]) -> None:
    """The Job a BoundJob makes (as `pulumi up` applies it), one pod per node: on the containerd
    node the real kubelet fills the rank from the pod's annotation (downward API), the container
    holds its channel and the launcher's environment, and resolves rank 0's name through the
    cluster DNS (`clusterDNS`) to rank 0's pod address."""
    cp, client = sim
    _, real = cp.nodes()
    name = f"job-{uuid.uuid4().hex[:5]}"
    single_clique_domain(client, name)
    master = f"{name}-0.{name}.default.svc.cluster.local"
    # Rank 0's name resolves once its pod has an address in the headless Service's endpoints: as a
    # launcher's rendezvous does, ask again until it answers (60 s at most).
    show = ["sh", "-c", "trap 'exit 0' TERM; ls -l /dev/nvidia-caps-imex-channels/; env | sort; "
            f"for i in $(seq 60); do out=$(nslookup {master} 2>&1); case \"$out\" in *Name:*) break;; esac; "
            "sleep 1; done; echo \"$out\"; echo shown; while :; do sleep 1; done"]
    args = BoundJobArgs(name=name, parallelism=2, gpus_per_pod=4, pod_template={"spec": {"containers": [
        {"name": "worker", "image": nodeimages.WORKLOAD_IMAGE, "command": show}]}})
    try:
        for obj in workload_manifests(args, namespace="default", claim_name=f"{name}-channel", domain=name):
            client.create(codecs.from_dict(obj))
        pods = eventually("the Job's pods to run, one per node", lambda: (
            ps if len(ps := [p for p in client.list(Pod, namespace="default",
                                                    labels={"batch.kubernetes.io/job-name": name})
                             if p.status and p.status.phase == "Running"]) == 2 else None), timeout=180)
        (here,) = [p for p in pods if p.spec is not None and p.spec.nodeName == real.name]
        (rank0,) = [p for p in pods if p.spec is not None and p.spec.hostname == f"{name}-0"]
        shown = _shown(client, here.metadata.name)  # type: ignore[union-attr,arg-type]
        rank = here.metadata.annotations["batch.kubernetes.io/job-completion-index"]  # type: ignore[union-attr,index]
        env = dict(ln.split("=", 1) for ln in shown if "=" in ln and not ln.startswith(("Name", "Address")))
        assert {k: env.get(k) for k in ("NVLFABRIC_RANK", "RANK", "NVLFABRIC_WORLD_SIZE", "WORLD_SIZE",
                                        "NVLFABRIC_MASTER_ADDR", "NVLFABRIC_MASTER_PORT")} == {
            "NVLFABRIC_RANK": rank, "RANK": rank, "NVLFABRIC_WORLD_SIZE": "2", "WORLD_SIZE": "2",
            "NVLFABRIC_MASTER_ADDR": f"{name}-0.{name}.default.svc", "NVLFABRIC_MASTER_PORT": "29500"}, shown
        channel = env["NVLFABRIC_IMEX_CHANNEL"]
        assert any(ln.startswith("c") and ln.endswith(f" channel{channel}") for ln in shown), shown
        answers = [ln.split()[-1] for ln in shown[shown.index(next(ln for ln in shown if ln.startswith("Name:"))):]
                   if ln.startswith("Address")]
        assert rank0.status is not None and answers == [rank0.status.podIP], shown
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Job, name, namespace="default", cascade=CascadeType.FOREGROUND)
        eventually("the Job's pods to go", lambda: not list(client.list(
            Pod, namespace="default", labels={"batch.kubernetes.io/job-name": name})), timeout=120)


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
        gpu_pod(client, name, real.name, 2, image=nodeimages.WORKLOAD_IMAGE, command=SHOW)
        eventually(f"pod {name} to run", lambda: running(client, name), timeout=120)
        assert allocated(client, name) == ["gpu-0", "gpu-1"]
        # containerd injected the two GPUs' CDI devices: their device nodes, and no other GPU's.
        shown = _shown(client, name)
        gpus = sorted(ln.split()[-1] for ln in shown if ln.startswith("c") and ln.split()[-1].startswith("nvidia")
                      and not ln.split()[-1].startswith("nvidia-"))
        assert gpus == ["nvidia0", "nvidia1", "nvidiactl"], shown
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


def test_down_stops_the_containerd_node_and_everything_it_ran(sim: tuple[ControlPlane, Client]) -> None:
    """Last of this module: `down` of its cluster with a pod running on the containerd node leaves
    no kubelet, containerd, shim or container process, no cgroup, network namespace or address."""
    cp, client = sim
    _, real = cp.nodes()
    name = f"last-{uuid.uuid4().hex[:5]}"
    netns_before = set(Path("/run/netns").glob("cni-*"))
    client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
        nodeSelector={"kubernetes.io/hostname": real.name},
        containers=[Container(name="worker", image=nodeimages.WORKLOAD_IMAGE, command=SHOW)])))
    eventually(f"pod {name} to run", lambda: running(client, name), timeout=120)
    _shown(client, name)
    pod_ip = client.get(Pod, name, namespace="default").status.podIP  # type: ignore[union-attr]
    assert pod_ip and (real.real_kubelet_dir / "containerd" / "ipam" / "nvlfabric-sim" / pod_ip).exists()
    netns = set(Path("/run/netns").glob("cni-*")) - netns_before
    assert netns, "containerd made no network namespace for the pod"
    init = int(real.machine_pid_file.read_text())
    ns = os.readlink(f"/proc/{init}/ns/pid")
    in_machine = [p for p in os.listdir("/proc") if p.isdigit() and _pid_ns(p).startswith("pid:")
                  and real.runs(int(p))]
    shell = next(p for p in in_machine if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sh\0-c\0trap"))
    cgroups = [Path("/sys/fs/cgroup", line.split(":", 2)[1].split(",")[0], line.split(":", 2)[2].lstrip("/"))
               for line in Path(f"/proc/{shell}/cgroup").read_text().splitlines()
               if line.split(":", 2)[1] in ("memory", "pids") and line.split(":", 2)[2] != "/"]
    assert cgroups and all(c.is_dir() for c in cgroups), cgroups
    cp.down()
    # The kernel ends the namespace's processes once its first one is killed; they go within moments.
    eventually("nothing left in the node's PID namespace", lambda: not [
        p for p in os.listdir("/proc") if p.isdigit() and _pid_ns(p) == ns], timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.kill(init, 0)
        pytest.fail(f"the machine's first process {init} outlived `down`")
    assert not [c for c in cgroups if c.exists()], "the container's cgroups outlived it"
    assert not [n for n in netns if n.exists()], "the pod's network namespace outlived it"
    assert not (real.real_kubelet_dir / "containerd" / "ipam" / "nvlfabric-sim" / pod_ip).exists()


def test_the_stand_in_runtime_still_runs_a_real_kubelet_node_and_down_ends_it() -> None:
    """The default runtime of real-kubelet nodes (nvlfabric's CRI stand-in, `--runtime standin`):
    the node registers with it, and `down` leaves no kubelet, runtime, container or namespace."""
    state = Path(tempfile.mkdtemp(prefix="nvlr-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=1, nodes_per_rack=1, first_rack=RACK + 1,
                      real_kubelets=1, progress=lambda m: None)
    try:
        cp.up()
        (real,) = cp.real_nodes()
        client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)))
        info = client.get(Node, real.name).status.nodeInfo  # type: ignore[union-attr]
        client.close()
        assert info is not None and info.containerRuntimeVersion == "nvlfabric-sim://0.1.0"
        assert info.kubeletVersion == "v1.37.2"
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


def _pid_ns(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""
