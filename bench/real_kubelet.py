"""Real-kubelet node benchmark → bench/results/real_kubelet.json.

One rack of two nodes, `nvlfabric-sim up --real-kubelets 1 --runtime containerd`: rack-<r>-node-00
run by the simulated kubelet and its stand-in runtime, rack-<r>-node-01 by the real kubelet with
containerd and runc, running the node image built from deploy/Dockerfile (testbed/nodeimages.py).
nvlfabric's driver is applied as its manifests are (agent DaemonSet, IMEX keeper, controller),
then a ComputeDomain's channel claim and one pod per node (the busybox workload image).
`--runtime standin` runs the real kubelet against nvlfabric's CRI stand-in instead.

Figures:
- node_image_mb                  the node image's size (its archive: uncompressed layers)
- real_up_s                      `up` until both nodes are Ready (control plane and image import included)
- real_node_ready_s              of that: from the machine's start to its Node Ready
- real_agent_ready_s             from applying the driver until the agent on the real-kubelet
                                 node is Ready (its startup and readiness probes, run by the kubelet)
- sim_agent_ready_s              the same on the simulated node, for comparison
- containerd_first_pod_running_s from creating the domain's objects until the pod on the containerd
                                 node is Running (scheduling, prepare, CDI, sandbox and CNI, the container)
- standin_first_pod_running_s    the same for the simulated node's pod (stand-in runtime), same run
- agent_container_memory_mb, keeper_container_memory_mb   the agent's and the IMEX keeper's
                                 containers as their memory cgroups count them (memory.usage_in_bytes
                                 on cgroup v1, memory.current on v2), the domain running
- real_agent_restart_s           kill -9 of the agent until the kubelet has it Ready again
- real_kubelet_rss_mb, real_runtime_rss_mb   the real kubelet's and its runtime's RSS (containerd,
                                 or the CRI stand-in)
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lightkube import Client, codecs  # noqa: E402
from lightkube.config.kubeconfig import KubeConfig  # noqa: E402
from lightkube.generic_resource import create_namespaced_resource  # noqa: E402
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec, ResourceRequirements  # noqa: E402
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim  # noqa: E402
from lightkube.models.meta_v1 import ObjectMeta  # noqa: E402
from lightkube.resources.core_v1 import Node, Pod  # noqa: E402

from nvlfabric import manifests  # noqa: E402
from nvlfabric.api import computedomain, names  # noqa: E402
from nvlfabric.provider.computedomain import channel_claim  # noqa: E402
from nvlfabric.sim import faults  # noqa: E402
from nvlfabric.sim.cluster import eventually, install_crd  # noqa: E402
from nvlfabric.sim.nodes import SimNode  # noqa: E402
from nvlfabric.testbed import nodeimages  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane, free_ports  # noqa: E402

RESULTS = REPO / "bench" / "results" / "real_kubelet.json"
RACK = 243
ComputeDomain = create_namespaced_resource(names.GROUP, computedomain.VERSION, computedomain.KIND,
                                           computedomain.PLURAL)


def say(msg: str) -> None:
    print(f"[bench real_kubelet] {msg}", flush=True)


def ready(pod: Pod | None) -> bool:
    return pod is not None and pod.status is not None and any(c.type == "Ready" and c.status == "True"
                                          for c in pod.status.conditions or [])


def agent(client: Client, node: str) -> Pod | None:
    return next((p for p in client.list(Pod, namespace="nvlfabric-system",
                                        labels={"app.kubernetes.io/name": "nvlfabric-agent"})
                 if p.spec is not None and p.spec.nodeName == node), None)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def machine_pids(cp: ControlPlane, name: str) -> dict[str, int]:
    """Host pids of the real kubelet and the runtime in the node's machine."""
    (real,) = cp.real_nodes()
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"/kubelet") and f"--hostname-override={real.name}".encode() in argv:
            out["kubelet"] = int(proc.name)
        elif b"nvlfabric.sim.cri.machine" in argv and str(real.real_kubelet_dir).encode() in b" ".join(argv):
            out.setdefault("runtime", int(proc.name))
        elif argv[0].endswith(b"/containerd") and str(real.real_kubelet_dir).encode() in b" ".join(argv):
            out["runtime"] = int(proc.name)
    return out


def container_memory_mb(node: SimNode, argv: list[bytes]) -> float:
    """What the memory cgroup of the node's container running `argv` counts."""
    (pid,) = [p for p in faults.processes_running(argv) if node.runs(p)]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            usage = Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.usage_in_bytes")
            return round(int(usage.read_text()) / 2**20, 1)
        if controllers == "":  # cgroup v2
            return round(int(Path("/sys/fs/cgroup", path.lstrip("/"), "memory.current").read_text()) / 2**20, 1)
    raise SystemExit(f"no memory cgroup for pid {pid}")


def domain_objects(client: Client, name: str, nodes: list[str]) -> None:
    cd = client.create(ComputeDomain(metadata=ObjectMeta(name=name, namespace="default"), spec={}))
    assert cd.metadata is not None
    # The claim as the provider makes it (owned and configured: the driver's admission policy admits no other).
    client.create(codecs.from_dict(channel_claim(name, "default", cd.metadata.uid, computedomain.ComputeDomainSpec())))
    for i, node in enumerate(nodes):
        client.create(Pod(metadata=ObjectMeta(name=f"{name}-{i}", namespace="default"), spec=PodSpec(
            nodeSelector={"kubernetes.io/hostname": node},
            resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=f"{name}-channel")],
            containers=[Container(name="worker", image=nodeimages.WORKLOAD_IMAGE, command=["sleep", "1000000"],
                                  resources=ResourceRequirements(claims=[ContainerClaim(name="channel")]))])))


def main() -> int:
    runtime = "standin" if "--runtime=standin" in sys.argv[1:] else "containerd"
    results: dict[str, float] = {}
    state = Path(tempfile.mkdtemp(prefix="nvlb-", dir="/tmp"))
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=1, nodes_per_rack=2, first_rack=RACK,
                      real_kubelets=1, runtime=runtime, progress=say)
    t0 = time.monotonic()
    cp.up()
    results["real_up_s"] = round(time.monotonic() - t0, 2)
    saved = cp.load_state()
    if saved is not None and saved.nodes_ready_s is not None and saved.ready_s is not None:
        results["real_node_ready_s"] = round(saved.nodes_ready_s - saved.ready_s, 2)
    say(f"simulator with a real-kubelet node up in {results['real_up_s']:.1f}s")
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="bench")
    simulated, real = (n.name for n in cp.nodes())
    try:
        install_crd(client)
        t0 = time.monotonic()
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, field_manager="bench", force=True)
        for key, node in (("real", real), ("sim", simulated)):
            eventually(f"the agent on {node} to be Ready", lambda n=node: ready(agent(client, n)),  # type: ignore[misc]
                       timeout=180)
            results[f"{key}_agent_ready_s"] = round(time.monotonic() - t0, 2)
        eventually("both nodes to carry the clique label", lambda: all(
            ((client.get(Node, n).metadata or ObjectMeta()).labels or {}).get(names.CLIQUE_LABEL)
            for n in (simulated, real)), timeout=120)
        name = f"b-{uuid.uuid4().hex[:5]}"
        t0 = time.monotonic()
        domain_objects(client, name, [simulated, real])
        pending = {0: "standin_first", 1: "containerd_first" if runtime == "containerd" else "real"}
        while pending and time.monotonic() - t0 < 120:
            for i, key in list(pending.items()):
                pod = client.get(Pod, f"{name}-{i}", namespace="default")
                if pod.status is not None and pod.status.phase == "Running":
                    results[f"{key}_pod_running_s"] = round(time.monotonic() - t0, 2)
                    del pending[i]
            time.sleep(0.05)
        if pending:
            raise SystemExit(f"pods {sorted(pending)} did not run within 120 s")
        pids = machine_pids(cp, real)
        results["real_kubelet_rss_mb"] = rss_mb(pids["kubelet"])
        results["real_runtime_rss_mb"] = rss_mb(pids["runtime"])
        (real_node,) = cp.real_nodes()
        if runtime == "containerd":
            results["node_image_mb"] = nodeimages.node_image(say).size_mb
            eventually("the domain to be Ready", lambda: (client.get(ComputeDomain, name, namespace="default").status
                                                          or {}).get("phase") == "Ready", timeout=120)
            results["agent_container_memory_mb"] = container_memory_mb(real_node, faults.AGENT_COMMAND)
            results["keeper_container_memory_mb"] = container_memory_mb(real_node, [b"nvlfabric-imex-keeper"])
        t0 = time.monotonic()
        say(faults.inject(state, real_node, "agent-killed"))
        eventually("the agent to be restarted and Ready", lambda: (
            (p := agent(client, real)) is not None and p.status is not None
            and [c.restartCount for c in p.status.containerStatuses or []] == [1] and ready(p)), timeout=180)
        results["real_agent_restart_s"] = round(time.monotonic() - t0, 2)
    finally:
        client.close()
        cp.down()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    for key, value in sorted(results.items()):
        print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
