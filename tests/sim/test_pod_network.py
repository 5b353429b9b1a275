"""Pods that are not hostNetwork get a network of their own, as a CNI plugin gives them on a node:
two pods on one node both listen on port 8080, each at an address of its node's block; the
kubelet probes them there; other pods and the machine reach them there; they reach the API
server through their service-account environment. A hostNetwork pod keeps its node's address.
A deleted pod's namespace and address are gone, and a sandbox made again at an address handed
out again is whole (issue 52).

Pods resolve cluster names through the simulator's cluster DNS and fail others at once; the
same kubelet's containers keep their processes to themselves (issue 52): what a container
leaves running ends with it (a PID namespace of its own, or its pod's), and orphans are reaped
by their namespace's first process, the node's too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import (
    Container,
    EnvVar,
    EnvVarSource,
    HTTPGetAction,
    ObjectFieldSelector,
    PodSpec,
    Probe,
    ServiceSpec,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, Service, ServiceAccount

from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.kubelet.sandbox import IP_FILE
from nvlfabric.sim.nodes import SimNode
from nvlfabric.sim.podnetwork import PodNetwork
from tests.conftest import Cluster
from tests.support.simkubelet import standalone_kubelet, state_dir

pytestmark = pytest.mark.cluster
RACK = 97
IMAGE = "nvlfabric.test/pod-server"
SERVER = Path(__file__).with_name("pod_server.py")
LEAVER_IMAGE = "nvlfabric.test/leaver"
LEAVER = Path(__file__).with_name("leaver.py")
NS = "default"


@pytest.fixture(scope="module")
def network(cluster: Cluster) -> PodNetwork:
    index = cluster.controlplane.load_state().pod_network
    assert index is not None, "the test cluster was brought up with --pod-network host; run `make sim-down` first"
    return PodNetwork(index)


@pytest.fixture(scope="module")
def nodes(cluster: Cluster, network: PodNetwork) -> Iterator[list[SimNode]]:
    with contextlib.suppress(ApiError):
        cluster.client.create(ServiceAccount(metadata=ObjectMeta(name="pod-server", namespace=NS)))
    with standalone_kubelet(cluster, state_dir("nvln-"), rack=RACK, nodes=2,
                            images={IMAGE: [sys.executable, str(SERVER)],
                                    LEAVER_IMAGE: [sys.executable, str(LEAVER)]},
                            args=["--pod-network", str(network.index)]) as (sim, _):
        yield sim


def server(name: str, node: SimNode, *, host_network: bool = False) -> Pod:
    field = lambda path: EnvVarSource(fieldRef=ObjectFieldSelector(fieldPath=path))  # noqa: E731
    env = [EnvVar(name="POD_NAME", valueFrom=field("metadata.name")), EnvVar(name="PORT", value="8080")]
    if host_network:  # on the node's own address: the machine's port 8080 may be anyone's
        env += [EnvVar(name="BIND", valueFrom=field("status.podIP")), EnvVar(name="PORT", value="18097")]
    port = 18097 if host_network else 8080
    return Pod(metadata=ObjectMeta(name=name, namespace=NS, labels={"app": "pod-server"}), spec=PodSpec(
        nodeName=node.name, serviceAccountName="pod-server", hostNetwork=host_network or None,
        containers=[Container(name="server", image=f"{IMAGE}:1", env=env, readinessProbe=Probe(
            httpGet=HTTPGetAction(path="/", port=port), periodSeconds=1))]))


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def ready(client, name: str) -> Pod | None:  # type: ignore[no-untyped-def]
    pod = client.get(Pod, name, namespace=NS)
    conds = {c.type: c.status for c in (pod.status.conditions or [])} if pod.status else {}
    return pod if pod.status.phase == "Running" and conds.get("Ready") == "True" else None


def test_pods_have_their_own_addresses_and_ports(cluster: Cluster, network: PodNetwork,
                                                 nodes: list[SimNode]) -> None:
    client = cluster.client
    placed = {"a0": nodes[0], "b0": nodes[0], "a1": nodes[1]}
    for name, node in placed.items():
        client.create(server(name, node))
    client.create(server("h0", nodes[0], host_network=True))
    try:
        pods = {n: eventually(f"pod {n} running and ready", lambda n=n: ready(client, n), timeout=60)
                for n in [*placed, "h0"]}
        ips = {n: p.status.podIP for n, p in pods.items()}
        assert len({ips[n] for n in placed}) == 3, ips
        for name, node in placed.items():
            pod = pods[name]
            assert ips[name] in network.node_addresses(RACK, node.index)
            assert pod.status.hostIP == node.address and [i.ip for i in pod.status.podIPs] == [ips[name]]
            # Both pods of node 0 listen on 8080; each answers as itself.
            assert get(f"http://{ips[name]}:8080/") == name
            # ... and reaches the API server with what its environment says.
            assert get(f"http://{ips[name]}:8080/api") == "200"
            assert (node.pod_dir(pod.metadata.uid) / IP_FILE).read_text() == ips[name]
            assert network.namespace_path(ips[name]).exists()
        host = pods["h0"]
        assert ips["h0"] == nodes[0].address == host.status.hostIP
        assert get(f"http://{nodes[0].address}:18097/") == "h0"
    finally:
        for name in [*placed, "h0"]:
            with contextlib.suppress(ApiError):
                client.delete(Pod, name, namespace=NS)
    eventually("the server pods to be gone", lambda: not list(
        client.list(Pod, namespace=NS, labels={"app": "pod-server"})), timeout=60)
    for name, node in placed.items():
        assert not network.namespace_path(ips[name]).exists(), f"{name}'s network namespace outlived it"
        assert not (node.pod_dir(pods[name].metadata.uid) / IP_FILE).exists()


def _addresses_of_eth0(network: PodNetwork, ip: str) -> str:
    return subprocess.run(["ip", "-n", network.namespace(ip), "-o", "-4", "addr", "show", "dev", "eth0"],
                          capture_output=True, text=True, timeout=30).stdout


def test_a_sandbox_is_made_whole_again_at_an_address_handed_out_again(network: PodNetwork) -> None:
    """A pod's namespace whose name is gone lives on while a process still holds it (a container's
    leftover), and its veth pair with it: the next sandbox at that address still gets its eth0.
    A namespace left half made (no eth0) is made again, not taken as it is."""
    ip = network.node_addresses(RACK + 1, 0)[0]  # a block no node of this module's uses
    asyncio.run(network.sandbox(ip))
    holder = subprocess.Popen(["ip", "netns", "exec", network.namespace(ip), "sleep", "120"])
    try:
        eventually("the leftover to hold the namespace", lambda: os.path.exists(f"/proc/{holder.pid}"))
        asyncio.run(network.remove(ip))
        assert not network.namespace_path(ip).exists()
        asyncio.run(network.sandbox(ip))  # (named after the address, its host end already existed)
        assert f" {ip}/" in _addresses_of_eth0(network, ip)
        asyncio.run(network.remove(ip))
        subprocess.run(["ip", "netns", "add", network.namespace(ip)], check=True, timeout=30)  # half made
        asyncio.run(network.sandbox(ip))
        assert f" {ip}/" in _addresses_of_eth0(network, ip)
    finally:
        holder.kill()
        holder.wait()
        asyncio.run(network.remove(ip))


def _sleepers(node: SimNode, tag: int) -> list[int]:
    """Host pids of the `sleep <3000 + tag>` processes running on `node`."""
    want = [b"sleep", str(3000 + tag).encode()]
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(entry.path, "cmdline").read_bytes().split(b"\0")[:2] == want and node.runs(int(entry.name)):
                    out.append(int(entry.name))
    return out


def _zombies(node: SimNode) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state == "Z" and node.runs(int(entry.name)):
                    out.append(int(entry.name))
    return out


def test_what_a_container_leaves_running_ends_with_it_and_orphans_are_reaped(cluster: Cluster,
                                                                             nodes: list[SimNode]) -> None:
    """Three pods leave a sleeper in a session of its own and an orphan that exits: a plain pod (a
    PID namespace per container), one sharing its process namespace (one per pod) and a hostPID
    one (the node's). No zombie stays on the node; deleting the first two ends their sleepers, as
    the kernel ends a PID namespace with its first process; the hostPID pod's is the node's, and
    runs on, as on a node."""
    client, node = cluster.client, nodes[1]
    tags = {"plain": 11, "shared": 12, "host": 13}
    for name, tag in tags.items():
        client.create(Pod(metadata=ObjectMeta(name=f"leaver-{name}", namespace=NS), spec=PodSpec(
            nodeName=node.name, hostPID=name == "host" or None, shareProcessNamespace=name == "shared" or None,
            terminationGracePeriodSeconds=2,
            containers=[Container(name="leaver", image=f"{LEAVER_IMAGE}:1",
                                  env=[EnvVar(name="TAG", value=str(tag))])])))
    host_sleepers: list[int] = []
    try:
        for name, tag in tags.items():
            eventually(f"pod leaver-{name}'s sleeper", lambda t=tag: _sleepers(node, t), timeout=60)
        time.sleep(1.5)  # the orphans have exited
        assert eventually("no zombie on the node", lambda: not _zombies(node) or None, timeout=10)
        host_sleepers = _sleepers(node, tags["host"])
        for name in tags:
            client.delete(Pod, f"leaver-{name}", namespace=NS)
        eventually("the pods to be gone", lambda: not [p for p in client.list(Pod, namespace=NS)
                                                       if (p.metadata.name or "").startswith("leaver-")], timeout=60)
        assert _sleepers(node, tags["plain"]) == [] and _sleepers(node, tags["shared"]) == []
        assert _sleepers(node, tags["host"]) == host_sleepers  # the node's process: it stays, as on a node
    finally:
        for name in tags:
            with contextlib.suppress(ApiError):
                client.delete(Pod, f"leaver-{name}", namespace=NS)
        for pid in host_sleepers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_pods_resolve_cluster_names_through_the_cluster_dns_and_others_fail_at_once(
        cluster: Cluster, nodes: list[SimNode]) -> None:
    """A pod's resolv.conf names the simulator's cluster DNS (sim/clusterdns.py) with the search
    path of `dnsPolicy: ClusterFirst`: its own name under a headless Service (as an Indexed Job's
    rank 0 is found), the Service's name and a pod-IP name resolve; a name the cluster does not
    have fails at once (the machine's nameserver, unreachable from a pod's network, cost 10 s)."""
    client = cluster.client
    client.create(Service(metadata=ObjectMeta(name="dns-svc", namespace=NS), spec=ServiceSpec(
        clusterIP="None", selector={"app": "dns-test"}, publishNotReadyAddresses=True)))
    pod = server("dns-a", nodes[0])
    assert pod.metadata is not None and pod.spec is not None
    pod.metadata.labels = {"app": "dns-test"}
    pod.spec.hostname, pod.spec.subdomain = "rank0", "dns-svc"
    client.create(pod)
    try:
        ip = eventually("pod dns-a running and ready", lambda: ready(client, "dns-a"), timeout=60).status.podIP

        def ask(name: str) -> tuple[float, str]:
            seconds, found = get(f"http://{ip}:8080/resolve/{name}").split(" ", 1)
            return float(seconds), found

        eventually("rank 0's name to resolve", lambda: ask("rank0.dns-svc")[1] == ip or None, timeout=30)
        assert ask(f"dns-svc.{NS}.svc.cluster.local")[1] == ip
        assert ask(f"{ip.replace('.', '-')}.{NS}.pod.cluster.local")[1] == ip
        seconds, found = ask("nowhere.example.invalid")
        assert found.startswith("error") and seconds < 1.0, (seconds, found)
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Pod, "dns-a", namespace=NS)
        with contextlib.suppress(ApiError):
            client.delete(Service, "dns-svc", namespace=NS)
