"""A BoundJob's pods know what a distributed launcher needs, end to end on a simulated rack: the
Job the component makes (applied as `pulumi up` would apply it), run by the real Job controller
and scheduler and the simulated kubelet, gives its four pods the ranks 0..3, one world size and
one rank-0 address, a torchrun line expanded with them, and DNS names under the headless Service
that the address names."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod, Service

from nvlfabric import manifests
from nvlfabric.components.workload import BoundJobArgs, workload_manifests
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane
from tests.conftest import free_ports, simulated_rack
from tests.support.onsim import single_clique_domain

pytestmark = pytest.mark.cluster
PORTS = free_ports()  # a control plane of its own; free ports so sessions never clash
RACK = 178  # addresses 127.10.178.x: a rack number no other test uses
TORCHRUN = ["torchrun", "--nnodes=$(NVLFABRIC_WORLD_SIZE)", "--node-rank=$(NVLFABRIC_RANK)",
            "--master-addr=$(NVLFABRIC_MASTER_ADDR)", "--master-port=$(NVLFABRIC_MASTER_PORT)",
            "--nproc-per-node=2", "train.py"]


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=PORTS, first_rack=RACK, nodes=2, field_manager="launcher-test",
                        prefix="nvllaunch-") as (cp, client):
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, force=True)
        yield cp, client


def test_a_jobs_pods_get_distinct_ranks_one_world_size_and_rank_0s_address(
        rack: tuple[ControlPlane, Client]) -> None:
    cp, client = rack
    name = f"train-{uuid.uuid4().hex[:5]}"
    single_clique_domain(client, name)
    args = BoundJobArgs(name=name, parallelism=4, gpus_per_pod=2, pod_template={"spec": {"containers": [
        {"name": "worker", "image": "registry.invalid/train:1", "command": TORCHRUN}]}})
    for obj in workload_manifests(args, namespace="default", claim_name=f"{name}-channel", domain=name):
        client.create(codecs.from_dict(obj))

    pods = eventually("the Job's four pods to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default", labels={"batch.kubernetes.io/job-name": name})
                         if p.status and p.status.phase == "Running"]) == 4 else None), timeout=180)
    envs: dict[str, dict[str, Any]] = {}
    for pod in pods:
        rec = json.loads((cp.state_dir / "nodes" / pod.spec.nodeName / "containers"
                          / f"default_{pod.metadata.name}_worker.json").read_text())
        envs[pod.metadata.name] = rec
    master = f"{name}-0.{name}.default.svc"
    ranks = sorted(int(r["containerEnv"]["NVLFABRIC_RANK"]) for r in envs.values())
    assert ranks == [0, 1, 2, 3]
    for pod in pods:
        rec = envs[pod.metadata.name]
        env, rank = rec["containerEnv"], rec["containerEnv"]["NVLFABRIC_RANK"]
        # the rank is the pod's own index, the one its hostname carries
        assert rank == pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        assert pod.spec.hostname == f"{name}-{rank}" and pod.spec.subdomain == name
        assert {k: env[k] for k in ("NVLFABRIC_WORLD_SIZE", "WORLD_SIZE", "NVLFABRIC_MASTER_ADDR", "MASTER_ADDR",
                                    "NVLFABRIC_MASTER_PORT", "MASTER_PORT")} == {
            "NVLFABRIC_WORLD_SIZE": "4", "WORLD_SIZE": "4", "NVLFABRIC_MASTER_ADDR": master, "MASTER_ADDR": master,
            "NVLFABRIC_MASTER_PORT": "29500", "MASTER_PORT": "29500"}
        assert env["RANK"] == env["NODE_RANK"] == rank
        assert rec["command"] == ["torchrun", "--nnodes=4", f"--node-rank={rank}", f"--master-addr={master}",
                                  "--master-port=29500", "--nproc-per-node=2", "train.py"]

    # The DNS names: cluster DNS serves <hostname>.<subdomain>.<namespace>.svc for the pods a
    # headless Service of the subdomain's name selects. (The simulator's pod IPs are loopback
    # addresses, which EndpointSlices refuse, so the endpoints themselves cannot be checked here.)
    svc = client.get(Service, name, namespace="default")
    assert svc.spec.clusterIP == "None" and svc.spec.publishNotReadyAddresses is True
    selected = client.list(Pod, namespace="default", labels=svc.spec.selector)
    assert {(p.spec.hostname, p.spec.subdomain) for p in selected} == {(f"{name}-{i}", name) for i in range(4)}
