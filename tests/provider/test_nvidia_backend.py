"""The ComputeDomain provider's `nvidia` backend: NVIDIA's ComputeDomain, on the real API server.

`check` and `diff` are pure. Everything else runs against the real kube-apiserver holding NVIDIA's
CRD as its chart installs it (tests/fixtures/nvidia/, written from NVIDIA's published v0.4.0
schema). NVIDIA's controller and daemons do not run here; what they write (the finalizer, the
workload ResourceClaimTemplate, the status) is written by `tests/support/nvidia_standin.py`, the way they
write it, and only where a test says so.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaimTemplate
from lightkube.types import PatchType
from pulumi.dynamic import ConfigureRequest
from pulumi.dynamic.dynamic import Config
from pulumi.runtime.rpc import UNKNOWN

from nvlfabric.api import nvidia as nv
from nvlfabric.provider import errors
from nvlfabric.provider.await_ import Poll
from nvlfabric.provider.computedomain import ComputeDomainProvider
from nvlfabric.provider.nvidiadomain import CONTROLLER_HINT, NVIDIA_CD, check_inputs, compute_diff
from nvlfabric.sim.cluster import install_crd
from tests.conftest import Cluster
from tests.support.nvidia_standin import FINALIZER, NvidiaStandIn, nvidia_controller

NS = "default"
CRD_FILE = Path(__file__).parents[1] / "fixtures" / "nvidia" / f"{nv.CRD_NAME}.yaml"
CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"


def inputs(name: str = "train", **kw: Any) -> dict[str, Any]:
    result = check_inputs({"name": name, "namespace": NS, "backend": "nvidia", **kw})
    assert not result.failures, [(f.property, f.reason) for f in result.failures]
    return dict(result.inputs)


# -- check and diff (pure) -----------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "prop", "words"), [
    pytest.param({"imexMode": "Dedicated"}, "spec.imexMode", "means nothing on backend 'nvidia'", id="imexMode"),
    pytest.param({"placement": {"scope": "MultiClique", "cliques": 2}}, "spec.placement",
                 "NVIDIA's driver places nothing", id="placement"),
    pytest.param({"numNodes": -1}, "spec.numNodes", "greater than or equal to 0", id="numNodes"),
    pytest.param({"channelAllocationMode": "Some"}, "spec.channelAllocationMode", "Single", id="allocationMode"),
    pytest.param({"numnodes": 2}, "spec.numnodes", "allowed here: numNodes, channelAllocationMode, channelClaim",
                 id="typo"),
])
def test_check_refuses_what_nvidias_driver_cannot_mean_naming_the_field(spec: dict[str, Any], prop: str,
                                                                        words: str) -> None:
    failures = ComputeDomainProvider().check({}, {"name": "t", "backend": "nvidia", "spec": spec}).failures
    assert [f.property for f in failures] == [prop], [(f.property, f.reason) for f in failures]
    assert words in failures[0].reason, failures[0].reason


def test_check_normalises_and_takes_more_than_one_clique_of_nodes() -> None:
    assert inputs(spec={"numNodes": 36})["spec"] == {"numNodes": 36, "channelAllocationMode": "Single"}
    assert inputs(spec={"channelAllocationMode": "All"})["spec"]["channelAllocationMode"] == "All"  # no imexMode rule


def test_an_unknown_backend_is_named_with_the_two_there_are() -> None:
    failures = ComputeDomainProvider().check({}, {"name": "t", "backend": "nvdia"}).failures
    assert [f.property for f in failures] == ["backend"]
    assert "unknown backend 'nvdia'" in failures[0].reason and "'nvidia'" in failures[0].reason


def state(**kw: Any) -> dict[str, Any]:
    return {**inputs(**kw), "uid": "u1", "claim_name": f"{kw.get('name', 'train')}-channel", "phase": "Pending"}


@pytest.mark.parametrize(("olds", "news", "changes", "replaces", "dbr"), [
    pytest.param(state(), inputs(), False, [], None, id="no-change"),
    pytest.param(state(), inputs(labels={"team": "a"}), True, [], None, id="labels-update"),
    pytest.param(state(), inputs(timeout_s=30), True, [], None, id="settings-update"),
    pytest.param(state(), inputs(spec={"numNodes": 2}), True, ["spec.numNodes"], True, id="numNodes-is-a-replace"),
    pytest.param(state(), inputs(spec={"channelAllocationMode": "All"}), True, ["spec.channelAllocationMode"], True,
                 id="allocationMode"),
    pytest.param(state(), inputs(name="train2"), True, ["name"], False, id="rename-creates-first"),
    pytest.param(state(), {**inputs(), "spec": {"numNodes": UNKNOWN}}, True, ["spec.numNodes"], True,
                 id="unknown-numNodes"),
])
def test_diff_replaces_on_any_spec_change_naming_the_field(olds: dict[str, Any], news: dict[str, Any],
                                                           changes: bool, replaces: list[str],
                                                           dbr: bool | None) -> None:
    diff = compute_diff(olds, news)
    assert diff.changes is changes
    assert (diff.replaces or []) == replaces
    assert diff.delete_before_replace is dbr


@pytest.mark.parametrize(("old", "new"), [("nvlfabric", "nvidia"), ("nvidia", "nvlfabric"), (None, "nvidia")])
def test_a_backend_change_replaces_creating_the_new_domain_first(old: str | None, new: str) -> None:
    olds = {"name": "t", "namespace": NS, **({"backend": old} if old else {})}  # no backend: state from before
    diff = ComputeDomainProvider().diff("default/t", olds, {"name": "t", "namespace": NS, "backend": new})
    assert diff.changes and diff.replaces == ["backend"] and diff.delete_before_replace is False


# -- on the real API server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Cluster:
    """NVIDIA's CRD installed, as its chart does, and Established."""
    install_crd(cluster.client, yaml.safe_load(CRD_FILE.read_text()))
    return cluster


@pytest.fixture
def prov(api: Cluster) -> ComputeDomainProvider:
    p = ComputeDomainProvider()
    p.configure(ConfigureRequest(Config({"kubernetes:kubeconfig": str(api.kubeconfig)}, "test")))
    p.poll = Poll(initial_s=0.05, max_s=0.2)
    p.on_progress = lambda _: None
    return p


@pytest.fixture
def name(api: Cluster) -> Iterator[str]:
    n = f"nv-{uuid.uuid4().hex[:8]}"
    yield n
    client = api.client
    for pod in client.list(Pod, namespace=NS, labels={"test-nv": n}):
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod.metadata.name, namespace=NS, grace_period=0)
    for res, obj in ((NVIDIA_CD, n), (ResourceClaimTemplate, f"{n}-channel")):
        with contextlib.suppress(ApiError):
            client.patch(res, obj, {"metadata": {"finalizers": None}}, namespace=NS, patch_type=PatchType.MERGE)
            client.delete(res, obj, namespace=NS)


def _live(api: Cluster, name: str) -> dict[str, Any] | None:
    try:
        obj = api.client.get(NVIDIA_CD, name, namespace=NS)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    return dict(obj)


@pytest.mark.cluster
def test_the_crd_is_nvidias_immutable_spec_with_its_defaults(api: Cluster, name: str) -> None:
    client = api.client
    obj = client.create(NVIDIA_CD.from_dict({"apiVersion": nv.API_VERSION, "kind": nv.KIND, "metadata": {
        "name": name, "namespace": NS}, "spec": {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}}))
    assert obj["spec"] == {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"},
                                                      "allocationMode": "Single"}}
    with pytest.raises(ApiError) as exc:
        client.patch(NVIDIA_CD, name, {"spec": {"numNodes": 2}}, namespace=NS, patch_type=PatchType.MERGE)
    assert nv.IMMUTABLE_MESSAGE in str(exc.value.status.message)


@pytest.mark.cluster
def test_create_awaits_nvidias_template_reads_drift_and_deletes(prov: ComputeDomainProvider, api: Cluster,
                                                                 name: str) -> None:
    with nvidia_controller(api.client, NS):
        created = prov.create(inputs(name, spec={"numNodes": 2}, labels={"team": "a"}, timeout_s=20))
        outs = created.outs
        assert created.id == f"{NS}/{name}"
        assert outs["claim_name"] == f"{name}-channel" and outs["channel"] == 0 and outs["uid"]
        assert outs["backend"] == "nvidia" and outs["phase"] == "Pending" and outs["total_nodes"] == 0
        live = _live(api, name)
        assert live is not None and live["spec"] == {
            "numNodes": 2, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"},
                                       "allocationMode": "Single"}}
        assert live["metadata"]["labels"] == {"team": "a"} and FINALIZER in live["metadata"]["finalizers"]
        rct = api.client.get(ResourceClaimTemplate, f"{name}-channel", namespace=NS)
        assert rct.metadata.labels[nv.DOMAIN_LABEL] == outs["uid"]

        # A label changed behind the stack's back shows on refresh (read), as inputs and outputs.
        api.client.patch(NVIDIA_CD, name, {"metadata": {"labels": {"team": "b"}}}, namespace=NS,
                         patch_type=PatchType.MERGE)
        read = prov.read(created.id, outs)
        assert read.inputs is not None and read.inputs["labels"] == {"team": "b"}
        assert read.inputs["spec"] == {"numNodes": 2, "channelAllocationMode": "Single"}
        diff = compute_diff(read.outs, inputs(name, spec={"numNodes": 2}, labels={"team": "a"}, timeout_s=20))
        assert diff.changes and not diff.replaces  # `up` sets the label back, in place
        prov.update(created.id, read.outs, inputs(name, spec={"numNodes": 2}, labels={"team": "a"}, timeout_s=20))
        assert (_live(api, name) or {})["metadata"]["labels"] == {"team": "a"}

        prov.delete(created.id, outs)
        assert _live(api, name) is None  # NVIDIA's controller lifted its finalizer
        assert prov.read(created.id, outs).id is None


@pytest.mark.cluster
def test_await_ready_is_nvidias_status_with_numnodes_daemons(prov: ComputeDomainProvider, api: Cluster,
                                                              name: str) -> None:
    import threading

    with nvidia_controller(api.client, NS) as standin:
        def daemons_join() -> None:
            time.sleep(0.5)
            standin.join(name, {"rack-1-node-00": CLIQUE}, ready=False)
            time.sleep(0.5)
            standin.join(name, {"rack-1-node-00": CLIQUE, "rack-1-node-01": CLIQUE})

        joiner = threading.Thread(target=daemons_join)
        joiner.start()
        outs = prov.create(inputs(name, spec={"numNodes": 2}, await_for="Ready", timeout_s=30)).outs
        joiner.join()
        assert outs["phase"] == "Ready" and outs["clique"] == CLIQUE and outs["ready_nodes"] == 2
        assert [n["name"] for n in outs["nodes"]] == ["rack-1-node-00", "rack-1-node-01"]
        prov.delete(f"{NS}/{name}", outs)


@pytest.mark.cluster
def test_without_nvidias_controller_create_times_out_saying_so_and_rolls_back(prov: ComputeDomainProvider,
                                                                               api: Cluster, name: str) -> None:
    with pytest.raises(errors.AwaitTimeout) as exc:
        prov.create(inputs(name, timeout_s=1.5))
    message = str(exc.value)
    assert f"NVIDIA's compute-domain controller has not taken ComputeDomain {NS}/{name}" in message
    assert CONTROLLER_HINT in message
    assert any(f"rolled back: deleted ComputeDomain {NS}/{name}" in n for n in exc.value.__notes__)
    assert _live(api, name) is None


@pytest.mark.cluster
def test_without_nvidias_controller_deployment_create_fails_within_seconds_naming_it(
        prov: ComputeDomainProvider, api: Cluster, name: str) -> None:
    """Not at the 600 s timeout: once the grace passes without NVIDIA's finalizer, the provider
    looks for the controller's Deployment, finds none, and says so (then rolls back)."""
    prov.controller_grace_s = 0.5
    t0 = time.monotonic()
    with pytest.raises(errors.AwaitFailed) as exc:
        prov.create(inputs(name, timeout_s=60))
    assert time.monotonic() - t0 < 20
    message = str(exc.value)
    assert f"has not taken ComputeDomain {NS}/{name} (no finalizer resource.nvidia.com/computeDomain)" in message
    assert "no Deployment in the cluster runs NVIDIA's compute-domain controller" in message
    assert "resources.computeDomains.enabled=true" in message
    assert any(f"rolled back: deleted ComputeDomain {NS}/{name}" in n for n in exc.value.__notes__)
    assert _live(api, name) is None


def test_the_controller_is_found_by_its_container_whatever_the_release_name() -> None:
    from nvlfabric.provider.nvidiadomain import controller_state

    def deployment(name: str, container: str, available: int) -> dict[str, Any]:
        return {"metadata": {"namespace": "nvidia-dra", "name": name},
                "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": container}]}}},
                "status": {"availableReplicas": available}}

    assert "no Deployment in the cluster runs" in str(controller_state([deployment("web", "nginx", 1)]))
    assert controller_state([deployment("my-release-controller", "compute-domain", 1)]) is None
    down = controller_state([deployment("my-release-controller", "compute-domain", 0)])
    assert down == ("its Deployment nvidia-dra/my-release-controller has 0 of 1 replicas available "
                    "(kubectl -n nvidia-dra describe deployment my-release-controller)")


@pytest.mark.cluster
def test_adopt_takes_a_matching_domain_and_refuses_another_spec_naming_the_field(
        prov: ComputeDomainProvider, api: Cluster, name: str) -> None:
    api.client.create(NVIDIA_CD.from_dict(nv.domain_object(name, NS, {}, nv.NvidiaDomainSpec(numNodes=1))))
    with pytest.raises(errors.ObjectExists) as refused:
        prov.create(inputs(name, timeout_s=5))
    assert "adopt=True" in str(refused.value)
    with pytest.raises(errors.ObjectExists) as other:
        prov.create(inputs(name, spec={"numNodes": 3}, adopt=True, timeout_s=5))
    assert "spec.numNodes (live 1, declared 3)" in str(other.value) and "immutable" in str(other.value)
    with nvidia_controller(api.client, NS):
        outs = prov.create(inputs(name, spec={"numNodes": 1}, adopt=True, labels={"team": "x"}, timeout_s=20)).outs
    assert outs["spec"]["numNodes"] == 1 and (_live(api, name) or {})["metadata"]["labels"] == {"team": "x"}
    assert _live(api, name) is not None  # adopted, not rolled back


@pytest.mark.cluster
def test_delete_refuses_while_pods_of_the_template_run_unless_forced(prov: ComputeDomainProvider, api: Cluster,
                                                                      name: str) -> None:
    with nvidia_controller(api.client, NS):
        outs = prov.create(inputs(name, timeout_s=20)).outs
        api.client.create(Pod.from_dict({"metadata": {"name": f"{name}-w0", "namespace": NS,
                                                      "labels": {"test-nv": name}},
                                         "spec": {"nodeName": "no-such-node",  # stays Pending: a user all the same
                                                  "containers": [{"name": "w", "image": "busybox",
                                                                  "resources": {"claims": [{"name": "channel"}]}}],
                                                  "resourceClaims": [{"name": "channel", "resourceClaimTemplateName":
                                                                      f"{name}-channel"}]}}))
        prov.clock = _FastClock()
        with pytest.raises(errors.InUse) as exc:
            prov.delete(f"{NS}/{name}", outs)
        assert f"ComputeDomain {NS}/{name} is still in use: 1 pod uses its channel ResourceClaimTemplate " \
               f"{NS}/{name}-channel: {NS}/{name}-w0" in str(exc.value)
        assert _live(api, name) is not None
        prov.delete(f"{NS}/{name}", {**outs, "force_delete": True})
        assert _live(api, name) is None


@pytest.mark.cluster
def test_delete_waits_for_nvidias_imex_daemon_pods_not_only_the_domain(prov: ComputeDomainProvider, api: Cluster,
                                                                      name: str) -> None:
    """NVIDIA's controller lifts its finalizer once it has deleted the daemons' DaemonSet; their pods
    still stop, and NVIDIA's kubelet plugin unprepares their claims. A destroy that went on to
    uninstall the driver then left them Terminating for good (18-node domain, NVIDIA's chart)."""
    import threading

    daemon = f"computedomain-daemon-{name}"
    with nvidia_controller(api.client, NS):
        outs = prov.create(inputs(name, timeout_s=20)).outs
        # A daemon pod in the driver's namespace, stopping (its finalizer: a pod whose claims are
        # still being unprepared).
        api.client.create(Pod.from_dict({
            "metadata": {"name": daemon, "namespace": "kube-system", "labels": {nv.DOMAIN_LABEL: outs["uid"]},
                         "finalizers": ["nvlfabric.test/unpreparing"]},
            "spec": {"containers": [{"name": "imex", "image": "registry.invalid/nvidia:1"}]}}))
        api.client.delete(Pod, daemon, namespace="kube-system")
        deleting = threading.Thread(target=prov.delete, args=(f"{NS}/{name}", {**outs, "timeout_s": 30}))
        deleting.start()
        try:
            deadline = time.monotonic() + 15
            while _live(api, name) is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _live(api, name) is None  # the domain is gone,
            time.sleep(2)
            assert deleting.is_alive(), "delete returned while the domain's IMEX daemon pod was still stopping"
        finally:
            api.client.patch(Pod, daemon, {"metadata": {"finalizers": None}}, namespace="kube-system",
                             patch_type=PatchType.MERGE)
        deleting.join(timeout=15)
        assert not deleting.is_alive(), "delete did not return once the daemon pod was gone"


class _FastClock:
    """Real time, ten times as fast: the departing-users settle (10 s) passes in 1 s."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def monotonic(self) -> float:
        return self.start + (time.monotonic() - self.start) * 10

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / 10)


def test_the_standin_computes_nvidias_global_status() -> None:
    from tests.support.nvidia_standin import _global_status

    assert _global_status({"numNodes": 0}, []) == "Ready"  # NVIDIA: Ready with no daemon listed at all
    assert _global_status({"numNodes": 2}, [{"status": "Ready"}]) == "NotReady"
    assert _global_status({}, [{"status": "Ready"}, {"status": "NotReady"}]) == "NotReady"
    assert NvidiaStandIn  # (used above through nvidia_controller)
