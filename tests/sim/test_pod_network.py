"""Pods that are not hostNetwork get a network of their own, as a CNI plugin gives them on a node:
two pods on one node both listen on port 8080, each at an address of its node's block; the
kubelet probes them there; other pods and the machine reach them there; they reach the API
server through their service-account environment. A hostNetwork pod keeps its node's address.
A deleted pod's namespace and address are gone, and a sandbox made again at an address handed
out again is whole (issue 52)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
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
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, ServiceAccount

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
                            images={IMAGE: [sys.executable, str(SERVER)]},
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
