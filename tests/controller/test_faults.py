"""Faults the controller must ride out with nothing lost, on the real control plane with real
controller processes (`python -m nvlfabric controller`, the Deployment's container):

- kill -9 of the leader in the middle of a 72-pod Job's reservation: the standby takes the Lease
  within 15 s, every pod is ungated within 10 s of that, and the channel claim's `reservedFor`
  holds each pod once and no pod that does not exist;
- the pod watch denied by RBAC: a WARNING naming the watch and the 403 at the default log level,
  and `nvlfabric_controller_watch_failures_total{watch="Pod"}` counting it.

The controllers run with their default leader-election timings (lease 10 s, renew 3 s, deadline
7 s, retry 2 s), the ones the Deployment runs with: the 15 s is a claim about those."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.core_v1 import Container, PodResourceClaim, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.batch_v1 import Job
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding, Role, RoleBinding
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim
from lightkube.types import CascadeType, PatchType
from prometheus_client.parser import text_string_to_metric_families

from nvlfabric import manifests
from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.components.workload import BoundJobArgs, job_manifest
from nvlfabric.controller import lostpods, pools
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes
from nvlfabric.sim.paths import REPO
from tests.conftest import Cluster
from tests.support.http import free_port, get

pytestmark = pytest.mark.cluster

TAKEOVER_S = 15.0  # docs/architecture.md, "Controller failover": the most a gated job may wait
UNGATED_S = 10.0
PODS = 72  # one rack's GPUs, one per pod: the biggest Job one channel claim serves in a clique


@contextlib.contextmanager
def controllers(kubeconfig: Path, logs: Path, lease: str, who: list[str]) -> Iterator[dict[str, tuple[
        subprocess.Popen[bytes], int]]]:
    """Controller processes `ctl-<who>` on one Lease (in `default`), each with its health port;
    stopped afterwards and their logs' tails printed (pytest shows them when a test failed)."""
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    for w in who:
        port = free_port()
        with open(logs / f"{w}.log", "wb") as out:  # the child keeps its own descriptor
            procs[w] = (subprocess.Popen(
                [sys.executable, "-m", "nvlfabric", "controller", "--kubeconfig", str(kubeconfig),
                 "--identity", f"ctl-{w}", "--lease-name", lease, "--lease-namespace", "default",
                 "--health-port", str(port), "--listen-address", "127.0.0.1", "--channels-per-clique", "4"],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT), port)
    try:
        yield procs
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, _ in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for w in procs:
            print(f"--- controller {w}\n" + "\n".join((logs / f"{w}.log").read_text().splitlines()[-40:]))


def holder(client: Client, lease: str) -> str | None:
    try:
        spec = client.get(Lease, lease, namespace="default").spec
    except ApiError:
        return None
    return spec.holderIdentity if spec else None


def ensure_device_class(client: Client) -> None:
    with contextlib.suppress(ApiError):  # another test made it already
        client.create(DeviceClass(metadata=ObjectMeta(name=names.DEVICE_CLASS), spec=DeviceClassSpec(
            selectors=[DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{names.DRIVER}"'))])))


@pytest.fixture
def rack(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Two Ready nodes of a clique of their own (labelled `ctl-test=<run>`); (clique, run)."""
    cluster_uuid = uuid.uuid4()
    run, clique = cluster_uuid.hex[:5], f"{cluster_uuid}.32766"
    nodes = [f"flt-{run}-{i}" for i in range(2)]
    install_crd(cluster.client)
    ensure_device_class(cluster.client)
    make_ready_nodes(cluster.client, {n: {names.CLIQUE_LABEL: clique, "ctl-test": run} for n in nodes})
    yield clique, run
    delete_nodes(cluster.client, nodes)
    pools.withdraw(cluster.client, clique)


def gated(pod: Pod) -> bool:
    return bool(pod.spec and any(g.name == names.RESERVATION_GATE for g in pod.spec.schedulingGates or []))


def reserved_for(client: Client, claim: str) -> list[tuple[str, str]]:
    """The pods the claim is reserved for (its domain's hold aside)."""
    st = client.get(ResourceClaim, claim, namespace="default").status
    return [(r.name, r.uid) for r in (st.reservedFor or []) if r.resource == "pods"] if st else []


def remove_job(client: Client, job: str, domain: str, claim: str) -> None:
    with contextlib.suppress(ApiError):
        client.delete(Job, job, namespace="default", cascade=CascadeType.BACKGROUND)
    for pod in client.list(Pod, namespace="default", labels={"batch.kubernetes.io/job-name": job}):
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod.metadata.name, namespace="default", grace_period=0)
    with contextlib.suppress(AssertionError):  # the Job controller drops its tracking finalizers first
        eventually("the Job's pods to be gone", lambda: not list(
            client.list(Pod, namespace="default", labels={"batch.kubernetes.io/job-name": job})), timeout=30)
    for res, name in ((ComputeDomainResource, domain), (ResourceClaim, claim)):
        with contextlib.suppress(ApiError):
            client.delete(res, name, namespace="default")


@pytest.mark.timeout(180)
def test_kill_9_of_the_leader_mid_reservation_loses_no_pod_and_leaves_no_stale_reservation(
        cluster: Cluster, rack: tuple[str, str], tmp_path: Path) -> None:
    client, (_, run) = cluster.client, rack
    lease, domain, job = f"flt-lease-{run}", f"flt-{run}", f"flt-{run}-train"
    cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=domain, namespace="default"), spec={}))
    body = channel_claim(domain, "default", cd.metadata.uid, api.ComputeDomainSpec())
    claim = str(body["metadata"]["name"])
    client.create(ResourceClaim.from_dict(body))
    # The Job exactly as BoundJob makes it (gated pods naming the domain's claim), without GPU
    # limits: these stand-in Nodes have no GPUs and no kubelet; binding is what is awaited here.
    manifest = job_manifest(BoundJobArgs(name=job, parallelism=PODS, gpus_per_pod=0, gpu_resource=None,
                                         pod_template={"spec": {
                                             "nodeSelector": {"ctl-test": run}, "terminationGracePeriodSeconds": 0,
                                             "containers": [{"name": "w", "image": "registry.invalid/w:1"}]}}),
                            namespace="default", claim_name=claim, domain=domain)
    members = {"batch.kubernetes.io/job-name": job}
    try:
        with controllers(cluster.kubeconfig, tmp_path, lease, ["a", "b"]) as procs:
            first = eventually("one controller to take the Lease", lambda: holder(client, lease), timeout=30)
            leader, standby = ("a", "b") if first == "ctl-a" else ("b", "a")
            eventually("the standby to read the Lease", lambda: get(procs[standby][1], "/readyz") == (
                200, "standby\n"), timeout=20)
            eventually("the leader to publish the clique's pool", lambda: pools.existing_slices(client, rack[0]),
                       timeout=20)

            client.create(Job.from_dict(manifest))
            # Kill the leader as soon as it has reserved the claim for pods beyond the first (the
            # pioneer, which the scheduler reserves itself) and lifted one of their gates: the rest
            # of the Job's pods are then still being created, reserved or ungated.
            ungated: set[str] = set()
            for _, pod in client.watch(Pod, namespace="default", labels=members, server_timeout=60):
                if not gated(pod):
                    ungated.add(pod.metadata.name)
                if len(ungated) >= 2:
                    break
            procs[leader][0].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            procs[leader][0].wait(timeout=10)
            pods = list(client.list(Pod, namespace="default", labels=members))
            left = PODS - sum(1 for p in pods if not gated(p))
            print(f"at the kill: {len(pods)} pods created, {len(reserved_for(client, claim))} reserved, "
                  f"{left} gated or not created yet")
            assert left > 0, "the leader finished the reservation before it was killed: nothing was left to take over"

            eventually("the standby to take the Lease over", lambda: holder(client, lease) == f"ctl-{standby}",
                       timeout=TAKEOVER_S + 5)
            took = time.monotonic()
            print(f"takeover {took - killed:.1f} s after the kill")
            assert took - killed < TAKEOVER_S
            assert get(procs[standby][1], "/readyz") == (200, "leader\n")

            def all_ungated() -> list[Pod] | None:
                pods = list(client.list(Pod, namespace="default", labels=members))
                return pods if len(pods) == PODS and not any(gated(p) for p in pods) else None

            eventually(f"all {PODS} pods to be ungated", all_ungated, timeout=UNGATED_S + 10)
            print(f"no pod gated {time.monotonic() - took:.1f} s after the takeover")
            assert time.monotonic() - took < UNGATED_S

            def all_bound() -> list[Pod] | None:
                pods = list(client.list(Pod, namespace="default", labels=members))
                return pods if len(pods) == PODS and all(p.spec.nodeName for p in pods) else None

            pods = eventually(f"all {PODS} pods to be bound", all_bound, timeout=60)
            live = {(p.metadata.name, p.metadata.uid) for p in pods}
            entries = reserved_for(client, claim)
            assert len(entries) == len(set(entries)), f"a pod reserved twice: {sorted(entries)}"
            assert set(entries) == live, (f"stale: {sorted(set(entries) - live)}; "
                                          f"missing: {sorted(live - set(entries))}")
    finally:
        remove_job(client, job, domain, claim)
        with contextlib.suppress(ApiError):
            client.delete(Lease, lease, namespace="default")


# -- the pod watch denied ------------------------------------------------------------------------

def token_kubeconfig(admin: Client, cluster: Cluster, account: str, path: Path) -> Path:
    """A kubeconfig for ServiceAccount default/<account>, with a TokenRequest token signed by the
    control plane's service-account key (what a projected token in the pod would hold)."""
    admin.create(ServiceAccount(metadata=ObjectMeta(name=account, namespace="default")))
    resp = admin.create(ServiceAccount.Token(metadata=ObjectMeta(name=account, namespace="default"),
                                             spec=TokenRequestSpec(audiences=[], expirationSeconds=3600)),
                        account, namespace="default")
    assert resp.status is not None
    ca = (cluster.controlplane.state_dir / "pki" / "ca.crt").read_bytes()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "sim", "cluster": {"server": cluster.controlplane.server,
                                                 "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": account, "user": {"token": resp.status.token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sim", "user": account, "namespace": "default"}}]}))
    return path


def controller_rules_without_pod_watch() -> list[PolicyRule]:
    """The controller's ClusterRole from the driver manifest, with `watch` taken off pods."""
    (role,) = [o for o in yaml.safe_load_all(manifests.read(manifests.DRIVER_FILE))
               if o and o["kind"] == "ClusterRole" and o["metadata"]["name"] == "nvlfabric-controller"]
    pods = [r for r in role["rules"] if r["resources"] == ["pods"] and r["apiGroups"] == [""]]
    assert pods and all("watch" in r["verbs"] for r in pods), "the controller no longer watches pods?"
    return [PolicyRule(apiGroups=r["apiGroups"], resources=r["resources"],
                       verbs=[v for v in r["verbs"] if v != "watch" or r not in pods]) for r in role["rules"]]


def watch_failures(port: int) -> dict[str, float]:
    code, text = get(port, "/metrics")
    assert code == 200, (code, text)
    return {s.labels["watch"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "nvlfabric_controller_watch_failures" for s in f.samples if s.name.endswith("_total")}


@pytest.mark.timeout(120)
def test_a_denied_pod_watch_is_a_warning_and_a_metric(cluster: Cluster, tmp_path: Path) -> None:
    admin, run = cluster.client, uuid.uuid4().hex[:5]
    install_crd(admin)
    ensure_device_class(admin)
    account, lease = f"flt-ctl-{run}", f"flt-lease-{run}"
    made: list[tuple[Any, str, str | None]] = []
    try:
        admin.create(ClusterRole(metadata=ObjectMeta(name=account), rules=controller_rules_without_pod_watch()))
        made.append((ClusterRole, account, None))
        admin.create(ClusterRoleBinding(metadata=ObjectMeta(name=account), roleRef=RoleRef(
            apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=account),
            subjects=[Subject(kind="ServiceAccount", name=account, namespace="default")]))
        made.append((ClusterRoleBinding, account, None))
        # Its Lease, as the driver's Role grants it (create; get and update of that name only).
        admin.create(Role(metadata=ObjectMeta(name=account, namespace="default"), rules=[
            PolicyRule(apiGroups=["coordination.k8s.io"], resources=["leases"], verbs=["create"]),
            PolicyRule(apiGroups=["coordination.k8s.io"], resources=["leases"], resourceNames=[lease],
                       verbs=["get", "update"])]))
        made.append((Role, account, "default"))
        admin.create(RoleBinding(metadata=ObjectMeta(name=account, namespace="default"), roleRef=RoleRef(
            apiGroup="rbac.authorization.k8s.io", kind="Role", name=account),
            subjects=[Subject(kind="ServiceAccount", name=account, namespace="default")]))
        made.append((RoleBinding, account, "default"))
        made.append((ServiceAccount, account, "default"))
        kubeconfig = token_kubeconfig(admin, cluster, account, tmp_path / "kubeconfig")

        with controllers(kubeconfig, tmp_path, lease, ["rbac"]) as procs:
            proc, port = procs["rbac"]
            eventually("the controller to lead (its Lease is allowed)", lambda: holder(admin, lease) == "ctl-rbac",
                       timeout=30)

            def warnings() -> list[dict[str, Any]]:
                lines = [json.loads(line) for line in (tmp_path / "rbac.log").read_text().splitlines()
                         if line.startswith("{")]
                return [r for r in lines if r["level"] == "warning" and "watch of Pod" in r["msg"]]

            (first, *_) = eventually("a WARNING about the pod watch", warnings, timeout=30)
            assert proc.poll() is None, "a denied watch must not end the controller"
            # The API server's own words: who may not do what, and the code (not httpx's "Client
            # error ... for url" with a link to MDN, which a refused watch used to log).
            msg = first["msg"]
            assert f'User "system:serviceaccount:default:{account}" cannot watch resource "pods"' in msg, msg
            assert "(403 Forbidden)" in msg and "\n" not in msg, msg
            # Both pod watches (all pods and bound pods) fail on their own clocks: the first WARNING
            # may be either one's, so the other's count is awaited, not read once.
            failures = eventually("three failures of each pod watch counted", lambda: (
                f if (f := watch_failures(port)).get("Pod", 0) >= 3 and f.get("Pod (bound)", 0) >= 3 else None),
                timeout=15)
            # Only the denied watch keeps failing: the claim and domain watches work (one failure of
            # the domain watch may come from the CRD made just before, not served for a moment yet).
            later = eventually("the pod watch's next failure counted", lambda: (
                f if (f := watch_failures(port)).get("Pod", 0) > failures["Pod"] else None), timeout=15)
            assert all(later.get(kind, 0) == failures.get(kind, 0) for kind in ("ResourceClaim", "ComputeDomain")), (
                failures, later)
            assert get(port, "/readyz") == (200, "leader\n")
    finally:
        for res, name, ns in reversed(made):
            with contextlib.suppress(ApiError):
                admin.delete(res, name, **({"namespace": ns} if ns else {}))
        with contextlib.suppress(ApiError):
            admin.delete(Lease, lease, namespace="default")



def test_a_lost_nodes_pod_whose_delete_failed_is_deleted_at_the_next_try(cluster: Cluster) -> None:
    """controller/lostpods.py: a pod failed for a lost node (phase Failed, DisruptionTarget
    DeletionByNvlfabric) whose delete failed (the API server away, a restart between the two
    writes) is deleted when the node's pods are acted on again; a pod that ended by itself
    (Failed for its own reasons) is left to its workload."""
    client, suffix = cluster.client, uuid.uuid4().hex[:5]
    node, claim = f"gone-{suffix}", f"lp-{suffix}-channel"  # a Node that does not exist: lost, deleted
    ours, own = f"lp-ours-{suffix}", f"lp-own-{suffix}"
    for name, reason in ((ours, names.DISRUPTION_REASON), (own, "")):
        client.create(Pod(metadata=ObjectMeta(name=name, namespace="default"), spec=PodSpec(
            nodeName=node, resourceClaims=[PodResourceClaim(name="channel", resourceClaimName=claim)],
            containers=[Container(name="c", image="registry.invalid/c")])))
        conditions = [{"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "node lost",
                       "lastTransitionTime": "2026-12-07T01:00:00Z"}] if reason else []
        client.patch(Pod.Status, name, {"status": {"phase": "Failed", "conditions": conditions}},
                     namespace="default", patch_type=PatchType.STRATEGIC)
    lost = api.LostNode(name=node, reason=api.LostReason.NODE_DELETED, lostAt="2026-12-07T01:00:00Z")
    try:
        assert lostpods.fail_pods(client, "default", lost, [claim], "node gone") == [ours]
        names_left = {p.metadata.name for p in client.list(Pod, namespace="default", fields={"spec.nodeName": node})}
        assert names_left == {own}
    finally:
        for name in (ours, own):
            with contextlib.suppress(ApiError):
                client.delete(Pod, name, namespace="default", grace_period=0)
