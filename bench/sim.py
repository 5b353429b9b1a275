"""Simulator scale benchmark → bench/results/sim.json.

Figures:
- racks2_up_s           `nvlfabric-sim up --racks 2` (control plane + 36 nodes Ready and schedulable)
- mem_per_node_mb       RSS of the simulated-kubelet process divided by its nodes (2 racks)
- pods500_start_s       500 pods, each with a claim from a template, created at once on the 36
                        nodes: until every pod is Running (scheduled, claims allocated, prepared
                        over DRA gRPC, CDI resolved)
- racks8_up_s           the same `up` with 8 racks (144 nodes)
- mem_per_node_mb_144   kubelet RSS per node at 144 nodes
- racks8_soak_s         how long the 144 nodes were watched (NVLFABRIC_BENCH_SOAK_S, default 600)
- racks8_min_ready      the fewest Ready nodes seen during the soak (goal: 144)

The DRA driver on the nodes is a small stand-in plugin (the node agent is benchmarked in
bench/nodeagent.py); it speaks the real registration and DRA v1 gRPC and writes CDI specs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lightkube import Client  # noqa: E402
from lightkube.config.kubeconfig import KubeConfig  # noqa: E402
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec, ResourceRequirements  # noqa: E402
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim  # noqa: E402
from lightkube.models.meta_v1 import ObjectMeta  # noqa: E402
from lightkube.models.resource_v1 import (  # noqa: E402
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
from lightkube.resources.core_v1 import Node, Pod  # noqa: E402
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaimTemplate, ResourceSlice  # noqa: E402

from nvlfabric.sim.kubelet.fakeplugin import FakePlugin  # noqa: E402
from nvlfabric.sim.nodes import rack_nodes  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane, Ports  # noqa: E402

DRIVER = "bench.nvlfabric.io"
PORTS = Ports(etcd_client=53790, etcd_peer=53800, apiserver=56443, scheduler=50259)
RESULTS = REPO / "bench" / "results" / "sim.json"


def say(msg: str) -> None:
    print(f"[bench sim {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def kubelet_pid(cp: ControlPlane) -> int:
    state = cp.load_state()
    assert state is not None
    return next(p.pid for p in state.processes if p.name == "sim-kubelet")


def up(state_dir: Path, racks: int) -> tuple[ControlPlane, float]:
    cp = ControlPlane(state_dir=state_dir, ports=PORTS, racks=racks, progress=lambda m: None)
    t0 = time.monotonic()
    cp.up()
    return cp, time.monotonic() - t0


def pods500(cp: ControlPlane, state_dir: Path) -> float:
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="bench")
    nodes = rack_nodes(state_dir, cp.racks, cp.nodes_per_rack)
    plugins = []
    for n in nodes:
        p = FakePlugin(driver=DRIVER, registry_dir=n.registry_dir, plugin_dir=n.kubelet_root / "plugins" / DRIVER,
                       cdi_dir=n.cdi_dirs[1])
        p.start()
        plugins.append(p)
        client.create(ResourceSlice(metadata=ObjectMeta(name=f"{n.name}-bench"), spec=ResourceSliceSpec(
            driver=DRIVER, nodeName=n.name, pool=ResourcePool(name=n.name, generation=1, resourceSliceCount=1),
            devices=[Device(name=f"dev-{i}") for i in range(32)])))
    client.create(DeviceClass(metadata=ObjectMeta(name=DRIVER), spec=DeviceClassSpec(selectors=[
        DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{DRIVER}"'))])))
    client.create(ResourceClaimTemplate(metadata=ObjectMeta(name="bench", namespace="default"),
                                        spec=ResourceClaimTemplateSpec(spec=ResourceClaimSpec(devices=DeviceClaim(
                                            requests=[DeviceRequest(name="gpu", exactly=ExactDeviceRequest(
                                                deviceClassName=DRIVER))])))))
    deadline = time.monotonic() + 60
    while not all(p.registered.is_set() for p in plugins):
        if time.monotonic() > deadline:
            raise SystemExit("bench: stand-in plugins did not all register within 60 s")
        time.sleep(0.2)

    def make(i: int) -> None:
        client.create(Pod(metadata=ObjectMeta(name=f"bench-{i:03d}", namespace="default"), spec=PodSpec(
            resourceClaims=[PodResourceClaim(name="gpu", resourceClaimTemplateName="bench")],
            containers=[Container(name="main", image="registry.invalid/bench:1",
                                  resources=ResourceRequirements(claims=[ContainerClaim(name="gpu")]))])))

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(500)))
    say(f"500 pods created in {time.monotonic() - t0:.1f}s")
    last = -1
    while True:
        running = sum(1 for p in client.list(Pod, namespace="default") if p.status and p.status.phase == "Running")
        if running != last:
            say(f"{running}/500 Running")
            last = running
        if running == 500:
            break
        if time.monotonic() - t0 > 600:
            raise SystemExit(f"bench: only {running}/500 pods Running after 600 s")
        time.sleep(1)
    elapsed = time.monotonic() - t0
    for p in plugins:
        p.stop()
    client.close()
    return elapsed


def soak(cp: ControlPlane, seconds: float) -> int:
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)))
    fewest = 10**9
    t0 = time.monotonic()
    while True:
        ready = sum(1 for n in client.list(Node, labels={"nvlfabric.io/simulated": "true"})
                    if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])))
        fewest = min(fewest, ready)
        elapsed = time.monotonic() - t0
        if elapsed >= seconds:
            break
        say(f"soak {elapsed:.0f}/{seconds:.0f}s: {ready} nodes Ready")
        time.sleep(min(30.0, seconds - elapsed))
    client.close()
    return fewest


def main() -> int:
    soak_s = float(os.environ.get("NVLFABRIC_BENCH_SOAK_S", "600"))
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="nvlb-", dir="/tmp") as tmp:
        state = Path(tmp) / "s2"
        cp, results["racks2_up_s"] = up(state, 2)
        try:
            say(f"2 racks up in {results['racks2_up_s']:.1f}s")
            results["mem_per_node_mb"] = round(rss_mb(kubelet_pid(cp)) / 36, 2)
            results["pods500_start_s"] = round(pods500(cp, state), 1)
        finally:
            cp.down()
        state8 = Path(tmp) / "s8"
        cp8, results["racks8_up_s"] = up(state8, 8)
        try:
            say(f"8 racks up in {results['racks8_up_s']:.1f}s; soaking {soak_s:.0f}s")
            results["mem_per_node_mb_144"] = round(rss_mb(kubelet_pid(cp8)) / 144, 2)
            results["racks8_min_ready"] = soak(cp8, soak_s)
            results["racks8_soak_s"] = soak_s
        finally:
            cp8.down()
    results = {k: round(v, 2) for k, v in results.items()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for k, v in results.items():
        print(f"{k:24} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
