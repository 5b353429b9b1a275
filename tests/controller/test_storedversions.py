"""The path from `v1alpha1` to the next ComputeDomain version (docs/compatibility.md, "API versions"),
walked once on a real API server of its own: its etcd is read to see which version each object is
stored in.

A stand-in next version, `v1alpha2`, with a compatible schema change (an optional field, added to
both versions: with conversion `None` an object is stored in one version's schema and served in the
other's, so both must hold it):
1. release N serves both and stores v1alpha1; objects written through either read through both,
   and the provider reads them;
2. release N+1 stores v1alpha2; `nvlfabric.controller.storedversions.migrate` rewrites every object
   and sets `status.storedVersions` to v1alpha2 alone (before that the API server refuses to drop
   v1alpha1 from the CRD);
3. release N+2 may stop serving v1alpha1.
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import ApiError, Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.codegen import crdgen
from nvlfabric.controller import storedversions
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import ComputeDomainProvider, check_inputs
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.testbed.controlplane import ControlPlane, free_ports

pytestmark = pytest.mark.cluster
NS = "default"
NEXT = create_namespaced_resource(names.GROUP, "v1alpha2", api.KIND, api.PLURAL)


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    state = Path(tempfile.mkdtemp(prefix="nvlver-", dir="/tmp"))
    plane = ControlPlane(state_dir=state, ports=free_ports(), progress=lambda m: None)
    plane.up()
    try:
        yield plane
    finally:
        plane.down()
        shutil.rmtree(state, ignore_errors=True)


def stored_as(cp: ControlPlane, name: str) -> str:
    """The apiVersion an object is encoded in in etcd (custom resources are stored as JSON)."""
    key = base64.b64encode(f"/registry/nvlfabric.io/{api.PLURAL}/{NS}/{name}".encode()).decode()
    req = urllib.request.Request(f"http://127.0.0.1:{cp.ports.etcd_client}/v3/kv/range",
                                 data=json.dumps({"key": key}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        (kv,) = json.loads(resp.read())["kvs"]
    return str(json.loads(base64.b64decode(kv["value"]))["apiVersion"])


def versions(*, storage: str, served_old: bool = True, old: bool = True) -> dict[str, Any]:
    """The CRD with v1alpha1 (unless `old` is False) and v1alpha2, the optional `spec.note` in both."""
    crd = crdgen.build()
    (v1,) = crd["spec"]["versions"]
    spec = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["note"] = {"type": "string", "maxLength": 256, "description": "a stand-in new field"}
    v2 = copy.deepcopy(v1)
    v2["name"] = "v1alpha2"
    v1.update(served=served_old, storage=storage == "v1alpha1")
    v2.update(served=True, storage=storage == "v1alpha2")
    crd["spec"]["versions"] = [v1, v2] if old else [v2]
    return crd


def apply(client: Client, cp: ControlPlane, crd: dict[str, Any]) -> None:
    """Apply a CRD change and wait until the API server acts on it: a CRD is Established at once,
    while its handlers (served versions, storage version) follow a moment later."""
    install_crd(client, crd)
    storage = next(v["name"] for v in crd["spec"]["versions"] if v["storage"])
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    probe = create_namespaced_resource(names.GROUP, served[-1], api.KIND, api.PLURAL)

    def in_effect() -> bool:
        name = f"probe-{uuid.uuid4().hex[:6]}"
        try:
            client.create(probe(metadata=ObjectMeta(name=name, namespace=NS), spec={}))
        except httpx2.HTTPStatusError:
            return False  # the version is not served yet
        try:
            return stored_as(cp, name) == f"{names.GROUP}/{storage}"
        finally:
            client.delete(probe, name, namespace=NS)

    eventually(f"the API server to serve {served} and store {storage}", in_effect, timeout=30)


def stored_versions(client: Client) -> list[str]:
    status = client.get(CustomResourceDefinition, api.CRD_NAME).status
    return list((status.storedVersions if status else None) or [])


def test_a_next_version_is_served_stored_and_migrated_while_the_provider_reads_on(cp: ControlPlane) -> None:
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="versions-test")
    prov = ComputeDomainProvider()
    prov.kubeconfig = str(cp.kubeconfig)
    install_crd(client)
    created = prov.create(dict(check_inputs({"name": "before", "namespace": NS, "spec": {"numNodes": 2},
                                             "await_for": "None"}).inputs))
    assert stored_as(cp, "before") == api.API_VERSION

    # Release N: v1alpha2 served beside v1alpha1, which stays the storage version.
    apply(client, cp, versions(storage="v1alpha1"))
    client.create(NEXT(metadata=ObjectMeta(name="during", namespace=NS), spec={"numNodes": 1, "note": "x"}))
    assert stored_as(cp, "during") == api.API_VERSION
    assert client.get(NEXT, "before", namespace=NS).spec["numNodes"] == 2
    assert client.get(ComputeDomainResource, "during", namespace=NS).spec["note"] == "x"
    assert prov.read(created.id, created.outs).outs["uid"] == created.outs["uid"]

    # Release N+1: v1alpha2 stored. Objects of v1alpha1 remain until rewritten, so the API server
    # refuses to drop v1alpha1 while storedVersions names it.
    apply(client, cp, versions(storage="v1alpha2"))
    client.create(NEXT(metadata=ObjectMeta(name="after", namespace=NS), spec={"numNodes": 3}))
    assert stored_as(cp, "after") == "nvlfabric.io/v1alpha2"
    assert stored_as(cp, "before") == api.API_VERSION
    assert stored_versions(client) == ["v1alpha1", "v1alpha2"]
    with pytest.raises(ApiError) as refused:
        client.patch(CustomResourceDefinition, api.CRD_NAME, versions(storage="v1alpha2", old=False),
                     patch_type=PatchType.APPLY, field_manager="versions-test", force=True)
    message = refused.value.status.message or ""
    assert "must remain in spec.versions until a storage migration" in message, message

    done = storedversions.migrate(client)
    assert done == storedversions.Migrated("v1alpha2", 3, ("v1alpha1",))
    assert {n: stored_as(cp, n) for n in ("before", "during", "after")} == dict.fromkeys(
        ("before", "during", "after"), "nvlfabric.io/v1alpha2")
    assert stored_versions(client) == ["v1alpha2"]
    assert storedversions.migrate(client) == storedversions.Migrated("v1alpha2", 0, ())
    after = prov.read(created.id, created.outs).outs
    assert (after["uid"], after["spec"]["numNodes"]) == (created.outs["uid"], 2)

    # Release N+2 may stop serving v1alpha1 (and, a release later, drop it).
    apply(client, cp, versions(storage="v1alpha2", served_old=False))
    with pytest.raises(httpx2.HTTPStatusError) as gone:  # a bare 404: the version is not served
        eventually("v1alpha1 to stop being served", lambda: client.get(ComputeDomainResource, "before", namespace=NS)
                   and None, timeout=30)
    assert gone.value.response.status_code == 404
    assert client.get(NEXT, "before", namespace=NS).spec["numNodes"] == 2
    apply(client, cp, versions(storage="v1alpha2", old=False))
    assert [v.name for v in client.get(CustomResourceDefinition, api.CRD_NAME).spec.versions] == ["v1alpha2"]
    client.close()
