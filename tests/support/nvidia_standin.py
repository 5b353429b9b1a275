"""A stand-in for NVIDIA's compute-domain controller and daemons, for the tests of the `nvidia` backend.

NVIDIA's driver does not run here, so this writes what its controller and its IMEX daemons would,
and only that, the way they write it (../shared/reference/anchor-nvidia-driver.md, sections 3.2
to 3.4 and 5): for each ComputeDomain of the namespace its finalizer, the workload
ResourceClaimTemplate named by `spec.channel.resourceClaimTemplate.name` (NVIDIA's labels and
finalizer, one `channel` request of the default-channel DeviceClass with the opaque
ComputeDomainChannelConfig), the global `status.status` as `calculateGlobalStatus` computes it,
and on deletion the template removed and the finalizer lifted. What a node's IMEX daemon reports
(`status.nodes[]`) is written by `join`, since no daemon runs. It is test code: nothing of
nvlfabric imports it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.resource_v1 import ResourceClaimTemplate
from lightkube.types import PatchType

from nvlfabric.api import nvidia as nv
from nvlfabric.provider.nvidiadomain import NVIDIA_CD

FINALIZER = "resource.nvidia.com/computeDomain"
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"


def _global_status(spec: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    """NVIDIA's rule: NotReady while fewer than numNodes daemons are listed or any is NotReady."""
    if len(nodes) < int(spec.get("numNodes") or 0) or any(n.get("status") != nv.READY for n in nodes):
        return "NotReady"
    return nv.READY


class NvidiaStandIn:
    def __init__(self, client: Client, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.joined: dict[str, dict[str, dict[str, Any]]] = {}  # domain → node → its daemon's entry
        self._lock = threading.Lock()

    def reconcile(self) -> None:
        with self._lock:
            for obj in self.client.list(NVIDIA_CD, namespace=self.namespace):
                cd = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
                try:
                    self._one(cd)
                except ApiError as exc:
                    if exc.status.code not in (404, 409):  # gone meanwhile, or a stale read: next pass
                        raise

    def _one(self, cd: dict[str, Any]) -> None:
        meta, spec = cd["metadata"], cd.get("spec") or {}
        name, uid = meta["name"], meta["uid"]
        template = spec["channel"]["resourceClaimTemplate"]["name"]
        if meta.get("deletionTimestamp"):
            with contextlib.suppress(ApiError):
                self.client.patch(ResourceClaimTemplate, template, {"metadata": {"finalizers": None}},
                                  namespace=self.namespace, patch_type=PatchType.MERGE)
                self.client.delete(ResourceClaimTemplate, template, namespace=self.namespace)
            self.client.patch(NVIDIA_CD, name, {"metadata": {"finalizers": None}}, namespace=self.namespace,
                              patch_type=PatchType.MERGE)
            self.joined.pop(name, None)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            self.client.patch(NVIDIA_CD, name, {"metadata": {"finalizers": [FINALIZER]}}, namespace=self.namespace,
                              patch_type=PatchType.MERGE)
        try:
            self.client.get(ResourceClaimTemplate, template, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            self.client.create(ResourceClaimTemplate.from_dict(self._template(template, uid, spec)))
        nodes = list(self.joined.get(name, {}).values())
        status = {"status": _global_status(spec, nodes), "nodes": nodes}
        if (cd.get("status") or {}) != status:
            self.client.patch(NVIDIA_CD.Status, name, {"status": status}, namespace=self.namespace,
                              patch_type=PatchType.MERGE)

    def _template(self, name: str, uid: str, spec: dict[str, Any]) -> dict[str, Any]:
        config = {"apiVersion": nv.API_VERSION, "kind": "ComputeDomainChannelConfig", "domainID": uid,
                  "allocationMode": spec["channel"].get("allocationMode") or "Single"}
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {
            "name": name, "namespace": self.namespace, "finalizers": [FINALIZER],
            "labels": {nv.DOMAIN_LABEL: uid, TARGET_LABEL: "Workload"}},
            "spec": {"spec": {"devices": {
                "requests": [{"name": nv.CHANNEL_REQUEST, "exactly": {"deviceClassName": nv.CHANNEL_DEVICE_CLASS}}],
                "config": [{"requests": [nv.CHANNEL_REQUEST],
                            "opaque": {"driver": nv.DRIVER, "parameters": config}}]}}}}

    def join(self, domain: str, nodes: dict[str, str], *, ready: bool = True) -> None:
        """The IMEX daemons of `nodes` (node → clique ID) report in, as NVIDIA's daemons do (an
        index per clique, the daemon pod's IP), Ready or not."""
        with self._lock:
            entries = self.joined.setdefault(domain, {})
            for i, (node, clique) in enumerate(sorted(nodes.items())):
                entries[node] = {"name": node, "ipAddress": f"10.244.0.{i + 10}", "cliqueID": clique, "index": i,
                                 "status": nv.READY if ready else "NotReady"}
        self.reconcile()


@contextlib.contextmanager
def nvidia_controller(client: Client, namespace: str, *, period_s: float = 0.2) -> Iterator[NvidiaStandIn]:
    """The stand-in, reconciling every `period_s` in a thread for as long as the block runs."""
    standin = NvidiaStandIn(client, namespace)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(period_s):
            with contextlib.suppress(Exception):  # a test's own assertions report what went wrong
                standin.reconcile()

    thread = threading.Thread(target=run, name="nvidia-standin", daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        stop.set()
        thread.join(timeout=5)
        standin.reconcile()  # a last pass: deletions the test started are finished
