"""Cluster objects a test or benchmark puts into the API server by hand, standing in for the parts
of a cluster that are not running: the ComputeDomain CRD as an install applies it, Nodes (and their
Leases) as a healthy kubelet leaves them; and `eventually`, the poll every such set-up waits with.

It lives in the simulator room, beside the control plane and the node stand-ins, because the tests
the agent harness (nvlfabric/sim/agenthost.py, channelclaims.py) and the benchmarks all use
it: benchmarks use nvlfabric as a user would and import no test helpers.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import NodeAddress, NodeCondition, NodeSpec, NodeStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from nvlfabric import manifests
from nvlfabric.api import computedomain as cdapi
from nvlfabric.api import names

T = TypeVar("T")

FIELD_MANAGER = "nvlfabric-sim"


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll (every `interval` s) until probe returns something truthy; fail (AssertionError, so a
    test reports it as its failure) naming what was awaited and the last value. The one wait of the
    simulator and the tests: an IMEX daemon's handshakes want a shorter `interval` than a pod does."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def ready_domain_status(client: Client, name: str, namespace: str = "default", timeout: float = 90.0) -> dict[str, Any]:
    """A ComputeDomain's status once the controller reports it Ready (`eventually`'s failure otherwise)."""
    resource = create_namespaced_resource(names.GROUP, cdapi.VERSION, cdapi.KIND, cdapi.PLURAL)

    def ready() -> dict[str, Any] | None:
        status = client.get(resource, name, namespace=namespace).status
        return status if isinstance(status, dict) and status.get("phase") == "Ready" else None

    return eventually(f"ComputeDomain {namespace}/{name} to be Ready", ready, timeout=timeout)


def install_crd(client: Client, crd: dict[str, Any] | None = None) -> None:
    """Apply a CRD (default: the ComputeDomain CRD from nvlfabric.manifests) idempotently and wait
    until it is Established, so its objects can be created right away."""
    crd = crd if crd is not None else yaml.safe_load(manifests.read(manifests.CRD_FILE))
    assert crd is not None
    client.patch(CustomResourceDefinition, crd["metadata"]["name"], crd, patch_type=PatchType.APPLY,
                 field_manager=FIELD_MANAGER, force=True)

    def established() -> bool:
        status = client.get(CustomResourceDefinition, crd["metadata"]["name"]).status
        conditions = (status.conditions if status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    eventually(f"CRD {crd['metadata']['name']} to be Established", established)


def make_ready_nodes(client: Client, labels_by_name: dict[str, dict[str, str]], *,
                     addresses: dict[str, str] | None = None) -> None:
    """Nodes as a healthy kubelet leaves them (Ready, Lease), waited until the node-lifecycle
    controller lifted the not-ready taint, so the scheduler may use them. A node given a clique
    label gets the fabric-ready one too, as its agent labels both at once (the controller counts
    the nodes of a clique by them)."""
    now = datetime.datetime.now(datetime.UTC)
    for name, labels in labels_by_name.items():
        if names.CLIQUE_LABEL in labels:
            labels = {names.FABRIC_READY_LABEL: "true", **labels}
        client.create(Node(metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **labels}),
                           spec=NodeSpec()))
        client.patch(Node.Status, name, {"status": NodeStatus(
            capacity={"cpu": "8", "memory": "8Gi", "pods": "110"},
            allocatable={"cpu": "8", "memory": "8Gi", "pods": "110"},
            conditions=[NodeCondition(type="Ready", status="True", reason="KubeletReady", lastHeartbeatTime=now,
                                      lastTransitionTime=now)],
            addresses=[NodeAddress(type="InternalIP", address=addresses[name])] if addresses else None).to_dict()})
        client.create(Lease(metadata=ObjectMeta(name=name, namespace="kube-node-lease"),
                            spec=LeaseSpec(holderIdentity=name, leaseDurationSeconds=40, renewTime=now)))

    def untainted() -> bool:
        specs = [client.get(Node, n).spec for n in labels_by_name]
        return all(spec is None or not spec.taints for spec in specs)

    eventually("the node-lifecycle controller to untaint the new nodes", untainted)


def delete_nodes(client: Client, names: list[str]) -> None:
    """The Nodes and their Leases, those that exist."""
    for name in names:
        with contextlib.suppress(ApiError):
            client.delete(Node, name)
        with contextlib.suppress(ApiError):
            client.delete(Lease, name, namespace="kube-node-lease")


def job_pods(client: Client, job: str, namespace: str = "default") -> dict[str, Any]:
    """An Indexed Job's live pods by completion index: not failed, not succeeded, not being deleted
    (a replaced pod's successor is the one of its index)."""
    from lightkube.resources.core_v1 import Pod

    out: dict[str, Any] = {}
    for p in client.list(Pod, namespace=namespace, labels={"batch.kubernetes.io/job-name": job}):
        meta, phase = p.metadata, p.status.phase if p.status else None
        if meta is not None and meta.deletionTimestamp is None and phase not in ("Failed", "Succeeded"):
            out[(meta.annotations or {}).get("batch.kubernetes.io/job-completion-index", "")] = p
    return out
