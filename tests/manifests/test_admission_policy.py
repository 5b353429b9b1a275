"""The driver's admission policies on a real API server (`--authorization-mode=Node,RBAC`).

RBAC lets the agent's service account patch any Node and the status of any ComputeDomain; the
ValidatingAdmissionPolicy in nvlfabric/manifests/driver/driver.yaml narrows that to the agent's own node, taken
from its pod-bound token (`authentication.kubernetes.io/node-name`): the `nvlfabric.io/` labels and
the `NVLinkFabricReady` condition of its own Node, its own `status.nodes[name=<node>]` entry of
ComputeDomains and its own node's GPU slice, nothing else. A second policy keeps the controller's
ResourceSlices to clique pools of our driver; its role lets it reserve channel claims for pods.

The tests act with real service-account tokens: one bound to a pod on node-a (as the kubelet gives
the agent's DaemonSet pod), one not bound to any pod, and one of the controller.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from lightkube import ApiError, Client, codecs
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import (
    Container,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodResourceClaim,
    PodSchedulingGate,
    PodSpec,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.models.resource_v1 import (
    Device,
    DeviceTaint,
    ResourcePool,
    ResourceSliceSpec,
)
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
)
from lightkube.resources.certificates_v1 import CertificateSigningRequest
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from nvlfabric import manifests
from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.names import RESERVATION_GATE
from nvlfabric.api.nodereports import node_report, node_reports
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.controller.reservationplan import PendingPod, pioneer_patch, reservation_patch
from nvlfabric.provider.computedomain import channel_claim
from nvlfabric.sim.cluster import delete_nodes, eventually, make_ready_nodes
from tests.conftest import Cluster
from tests.support.policies import (
    POLICIES,
    POLICY_EFFECTIVE_S,
    denied,
    eventually_denied,
    install_driver_objects,
    policy_in_effect,
    remove_policies,
)
from tests.support.tenants import token_client

pytestmark = pytest.mark.cluster
NAMESPACE = names.NAMESPACE
AGENT, CONTROLLER = "nvlfabric-agent", "nvlfabric-controller"
DRIVER = names.DRIVER
FABRIC = "NVLinkFabricReady"  # the Node condition the agent owns
CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"


@dataclass(frozen=True)
class Env:
    admin: Client
    agent: Client  # token bound to a pod on node_a
    node_a: str
    node_b: str
    server: str
    ca_data: str
    suffix: str

    def token_client(self, service_account: str, *, bound_pod: Pod | None = None, manager: str) -> Client:
        return token_client(self.admin, self.server, self.ca_data, service_account, bound_pod=bound_pod,
                            manager=manager)


@contextlib.contextmanager
def granted(env: Env, what: str, *rules: PolicyRule) -> Iterator[None]:
    """Temporarily grant the agent's service account more than its ClusterRole does."""
    name = f"test-agent-{what}-{env.suffix}"
    env.admin.create(ClusterRole(metadata=ObjectMeta(name=name), rules=list(rules)))
    env.admin.create(ClusterRoleBinding(metadata=ObjectMeta(name=name), roleRef=RoleRef(
        apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
        subjects=[Subject(kind="ServiceAccount", name=AGENT, namespace=NAMESPACE)]))
    try:
        yield
    finally:
        env.admin.delete(ClusterRoleBinding, name)
        env.admin.delete(ClusterRole, name)


def label(client: Client, node: str, labels: dict[str, str | None]) -> Any:
    return client.patch(Node, node, {"metadata": {"labels": labels}})


@pytest.fixture(scope="module")
def env(cluster: Cluster) -> Iterator[Env]:
    admin = cluster.client
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    sim = kubeconfig["clusters"][0]["cluster"]
    server, ca_data = sim["server"], sim["certificate-authority-data"]
    suffix = uuid.uuid4().hex[:5]
    node_a, node_b = f"node-a-{suffix}", f"node-b-{suffix}"
    pod_name = f"agent-{suffix}"
    clients: list[Client] = []
    try:
        install_driver_objects(admin)
        make_ready_nodes(admin, {node_a: {}, node_b: {}})
        # The agent's DaemonSet pod on node-a, as the kubelet would run it (nothing runs it here).
        pod = admin.create(Pod(metadata=ObjectMeta(name=pod_name, namespace=NAMESPACE), spec=PodSpec(
            nodeName=node_a, serviceAccountName=AGENT,
            containers=[Container(name="agent", image="registry.invalid/nvlfabric/node-agent:test")])))
        agent = token_client(admin, server, ca_data, AGENT, bound_pod=pod, manager=f"nvlfabric-agent-{node_a}")
        clients.append(agent)

        def policy_denies() -> str | None:
            # Until the policy (and the RBAC binding) is in effect this succeeds or RBAC refuses it.
            try:
                label(agent, node_b, {"nvlfabric.io/probe": "x"})
            except ApiError as exc:
                if "ValidatingAdmissionPolicy" in (exc.status.message or ""):
                    return str(exc.status.message)
            return None

        eventually("the agent policy to deny labelling another node", policy_denies, timeout=POLICY_EFFECTIVE_S)
        yield Env(admin=admin, agent=agent, node_a=node_a, node_b=node_b, server=server, ca_data=ca_data,
                  suffix=suffix)
    finally:
        for c in clients:
            c.close()
        with contextlib.suppress(ApiError):
            admin.delete(Pod, pod_name, namespace=NAMESPACE, grace_period=0)
        delete_nodes(admin, [node_a, node_b])
        remove_policies(admin)


# -- Nodes ---------------------------------------------------------------------------------------


def test_agent_labels_its_own_node(env: Env) -> None:
    label(env.agent, env.node_a, {"nvlfabric.io/clique": CLIQUE, "nvlfabric.io/fabric-ready": "true"})
    labels = env.admin.get(Node, env.node_a).metadata.labels
    assert labels["nvlfabric.io/clique"] == CLIQUE and labels["nvlfabric.io/fabric-ready"] == "true"
    label(env.agent, env.node_a, {"nvlfabric.io/clique": None})  # the fabric went away: label removed
    assert "nvlfabric.io/clique" not in env.admin.get(Node, env.node_a).metadata.labels


def test_agent_may_not_label_another_node(env: Env) -> None:
    msg = denied(lambda: label(env.agent, env.node_b, {"nvlfabric.io/clique": CLIQUE}))
    assert f"nvlfabric-agent on node {env.node_a} may only modify its own Node {env.node_a}" in msg
    assert f"not Node {env.node_b}" in msg
    assert "nvlfabric.io/clique" not in (env.admin.get(Node, env.node_b).metadata.labels or {})


@pytest.mark.parametrize(("what", "patch", "named"), [
    ("taint", {"spec": {"taints": [{"key": "example.com/evil", "effect": "NoSchedule"}]}}, "spec"),
    ("cordon", {"spec": {"unschedulable": True}}, "spec"),
    ("foreign label", {"metadata": {"labels": {"example.com/gpu": "yes"}}}, "labels example.com/gpu"),
    ("foreign label removed", {"metadata": {"labels": {"kubernetes.io/hostname": None}}},
     "labels kubernetes.io/hostname"),
    ("lookalike label", {"metadata": {"labels": {"nvlfabric.io.example.com/x": "1"}}}, "labels nvlfabric.io.example"),
    ("annotation", {"metadata": {"annotations": {"nvlfabric.io/clique": CLIQUE}}}, "annotations"),
    ("own label with a foreign one", {"metadata": {"labels": {"nvlfabric.io/clique": CLIQUE, "zone": "a"}}},
     "labels zone"),
])
def test_agent_may_only_change_nvlfabric_labels_of_its_node(env: Env, what: str, patch: dict[str, Any],
                                                             named: str) -> None:
    before = env.admin.get(Node, env.node_a)
    msg = denied(lambda: env.agent.patch(Node, env.node_a, patch))
    assert f"labels under nvlfabric.io/, its nvlfabric.io/cd-* report annotations and the {FABRIC} condition of its " \
           f"Node {env.node_a}" in msg, what
    assert f"this request also changes {named}" in msg, (what, msg)
    after = env.admin.get(Node, env.node_a)
    assert after.metadata.labels == before.metadata.labels and after.metadata.annotations == before.metadata.annotations


def condition(type_: str, status: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"type": type_, "status": status, "reason": "Test", "message": "set by the test", "lastHeartbeatTime": now,
            "lastTransitionTime": now}


def conditions_of(env: Env, node: str) -> dict[str, str]:
    return {c.type: c.status for c in env.admin.get(Node, node).status.conditions or []}


def test_agent_reports_the_fabric_condition_of_its_own_node_only(env: Env) -> None:
    # As nvlfabric/nodeagent/fabrichealth.py does: a strategic merge patch of the one condition (merge key type).
    env.agent.patch(Node.Status, env.node_a, {"status": {"conditions": [condition(FABRIC, "False")]}})
    assert conditions_of(env, env.node_a)[FABRIC] == "False"
    env.agent.patch(Node.Status, env.node_a, {"status": {"conditions": [condition(FABRIC, "True")]}})
    assert conditions_of(env, env.node_a) == {"Ready": "True", FABRIC: "True"}

    msg = denied(lambda: env.agent.patch(Node.Status, env.node_b, {"status": {"conditions": [
        condition(FABRIC, "True")]}}))
    assert f"may only modify its own Node {env.node_a}" in msg and f"not Node {env.node_b}" in msg
    msg = denied(lambda: env.agent.patch(Node.Status, env.node_a, {"status": {"conditions": [
        condition(FABRIC, "True"), condition("Ready", "False")]}}))
    assert f"the {FABRIC} condition of its Node {env.node_a}; this request also changes status.conditions Ready" \
        in msg
    msg = denied(lambda: env.agent.patch(Node.Status, env.node_a, {"status": {"capacity": {"cpu": "1000"}}}))
    assert "this request also changes status.capacity" in msg
    msg = denied(lambda: env.agent.patch(Node.Status, env.node_a, {"metadata": {"labels": {"zone": "a"}}}))
    assert "this request also changes labels zone" in msg
    node = env.admin.get(Node, env.node_a)
    assert node.status.capacity["cpu"] == "8" and conditions_of(env, env.node_a) == {"Ready": "True", FABRIC: "True"}
    assert "zone" not in node.metadata.labels


def test_agent_taints_its_own_node_only_to_keep_new_pods_off(env: Env) -> None:
    """As nvlfabric/nodeagent/fabrichealth.py does: a merge patch of the whole taint list with the
    resourceVersion read. Only its own key, only NoSchedule (never evicting), only its own Node."""
    taint = {"key": names.FABRIC_UNHEALTHY_TAINT, "value": "FabricDegraded", "effect": "NoSchedule"}
    other = {"key": "example.com/rack", "value": "r1", "effect": "NoSchedule"}
    env.admin.patch(Node, env.node_a, {"spec": {"taints": [other]}})

    def taints(node: str) -> list[dict[str, Any]]:
        return [t.to_dict() for t in env.admin.get(Node, node).spec.taints or []]

    def set_taints(node: str, new: list[dict[str, Any]]) -> Any:
        rv = env.admin.get(Node, node).metadata.resourceVersion
        return env.agent.patch(Node, node, {"metadata": {"resourceVersion": rv}, "spec": {"taints": new}},
                               patch_type=PatchType.MERGE)

    try:
        set_taints(env.node_a, [other, taint])
        assert taints(env.node_a) == [other, taint]
        msg = denied(lambda: set_taints(env.node_a, [other, {**taint, "effect": "NoExecute"}]))
        assert f"this request also changes spec.taints {names.FABRIC_UNHEALTHY_TAINT} with an effect other than " \
               "NoSchedule" in msg
        msg = denied(lambda: set_taints(env.node_a, [taint]))
        assert f"this request also changes spec.taints other than {names.FABRIC_UNHEALTHY_TAINT}" in msg
        msg = denied(lambda: set_taints(env.node_b, [taint]))
        assert f"may only modify its own Node {env.node_a}" in msg
        set_taints(env.node_a, [other])
        assert taints(env.node_a) == [other]
    finally:
        env.admin.patch(Node, env.node_a, {"spec": {"taints": None}})


def test_agent_may_not_create_or_delete_nodes(env: Env) -> None:
    # RBAC gives the agent neither; the policy refuses them even when someone does.
    with granted(env, "nodes", PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["create", "delete"])):
        msg = eventually_denied(lambda: env.agent.delete(Node, env.node_a))
        assert f"the {FABRIC} condition of its Node {env.node_a}, not DELETE the Node" in msg
        msg = eventually_denied(lambda: env.agent.create(Node(metadata=ObjectMeta(name=f"node-x-{env.suffix}"))))
        assert f"may only modify its own Node {env.node_a}" in msg and f"not Node node-x-{env.suffix}" in msg
    assert env.admin.get(Node, env.node_a).metadata.name == env.node_a


# -- ComputeDomain status ------------------------------------------------------------------------


@pytest.fixture
def domain(env: Env) -> Iterator[str]:
    """A ComputeDomain as the controller and node-b's agent left it: a phase and node-b's entry."""
    name = f"cd-{uuid.uuid4().hex[:6]}"
    env.admin.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec={}))
    env.admin.patch(ComputeDomainResource.Status, name, {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": "default"},
        "status": {"phase": "Allocating", "clique": CLIQUE, "channel": 7, "totalNodes": 1, "readyNodes": 1}},
        namespace="default", patch_type=PatchType.APPLY, field_manager="nvlfabric-controller", force=True)
    apply_entry(env.admin, name, api.NodeStatus(name=env.node_b, address="10.0.0.2", clique=CLIQUE, ready=True),
                manager=f"nvlfabric-agent-{env.node_b}")
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            env.admin.delete(ComputeDomainResource, name, namespace="default")


def apply_entry(client: Client, cd: str, entry: api.NodeStatus, *, manager: str) -> Any:
    return apply_status(client, cd, api.node_status_apply(cd, "default", entry)["status"], manager=manager)


def apply_status(client: Client, cd: str, status: dict[str, Any], *, manager: str) -> Any:
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": cd, "namespace": "default"},
            "status": status}
    return client.patch(ComputeDomainResource.Status, cd, body, namespace="default", patch_type=PatchType.APPLY,
                        field_manager=manager, force=True)


def status_of(env: Env, cd: str) -> dict[str, Any]:
    return dict(env.admin.get(ComputeDomainResource, cd, namespace="default").status or {})


def test_agent_writes_and_withdraws_its_own_status_entry(env: Env, domain: str) -> None:
    manager = f"nvlfabric-agent-{env.node_a}"
    apply_entry(env.agent, domain, api.NodeStatus(name=env.node_a, address="10.0.0.1", clique=CLIQUE, ready=False,
                                                  message="IMEX daemon starting"), manager=manager)
    apply_entry(env.agent, domain, api.NodeStatus(name=env.node_a, address="10.0.0.1", clique=CLIQUE, ready=True),
                manager=manager)
    status = status_of(env, domain)
    entries = {e["name"]: e for e in status["nodes"]}
    assert set(entries) == {env.node_a, env.node_b} and entries[env.node_a]["ready"] is True
    assert "message" not in entries[env.node_a]  # the agent's own apply dropped its own field
    assert (status["phase"], status["channel"]) == ("Allocating", 7)
    # Unprepare of the domain's last claim on the node: the agent applies no entry (nodes: []).
    apply_status(env.agent, domain, {"nodes": []}, manager=manager)
    status = status_of(env, domain)
    assert [e["name"] for e in status["nodes"]] == [env.node_b] and status["phase"] == "Allocating"


def test_agent_may_not_write_other_nodes_entries(env: Env, domain: str) -> None:
    manager = f"nvlfabric-agent-{env.node_a}"
    before = status_of(env, domain)
    # node-b's entry, changed (the apply also carries the agent's own entry).
    msg = denied(lambda: apply_status(env.agent, domain, {"nodes": [
        {"name": env.node_a, "address": "10.0.0.1", "ready": True},
        {"name": env.node_b, "address": "10.0.0.2", "clique": CLIQUE, "ready": False}]}, manager=manager))
    assert f"nvlfabric-agent on node {env.node_a} may only write its own entry status.nodes[name={env.node_a}]" in msg
    assert f"ComputeDomain default/{domain}" in msg and f"not the entries of node(s) {env.node_b}" in msg
    # An entry for a node that is not the agent's (a forged member).
    msg = denied(lambda: apply_entry(env.agent, domain, api.NodeStatus(name="node-c", address="10.0.0.3", ready=True),
                                     manager=manager))
    assert "not the entries of node(s) node-c" in msg
    # Removing node-b's entry (a JSON merge patch replaces the whole list).
    msg = denied(lambda: env.agent.patch(ComputeDomainResource.Status, domain, {"status": {"nodes": []}},
                                         namespace="default", patch_type=PatchType.MERGE))
    assert f"not the entries of node(s) {env.node_b}" in msg
    assert status_of(env, domain) == before


@pytest.mark.parametrize(("field", "value"), [
    ("phase", "Ready"), ("channel", 8), ("readyNodes", 2), ("observedGeneration", 3),
    ("conditions", [{"type": "Ready", "status": "True", "reason": "AllMembersReady", "message": "forged",
                     "lastTransitionTime": "2030-01-01T00:00:00Z"}]),
])
def test_agent_may_not_write_the_controllers_status_fields(env: Env, domain: str, field: str, value: Any) -> None:
    before = status_of(env, domain)
    msg = denied(lambda: apply_status(env.agent, domain, {
        "nodes": [{"name": env.node_a, "address": "10.0.0.1", "ready": True}], field: value},
        manager=f"nvlfabric-agent-{env.node_a}"))
    assert f"may only write its own entry status.nodes[name={env.node_a}] of ComputeDomain default/{domain}" in msg
    assert f"not status.{field} (written by nvlfabric-controller)" in msg
    assert status_of(env, domain) == before


# -- ResourceSlices ------------------------------------------------------------------------------


def channel_slice(name: str, *, driver: str = DRIVER, node_name: str | None = None,
                  all_nodes: bool | None = None) -> ResourceSlice:
    selector = None if node_name or all_nodes else NodeSelector(nodeSelectorTerms=[NodeSelectorTerm(
        matchExpressions=[NodeSelectorRequirement(key="nvlfabric.io/clique", operator="In", values=[CLIQUE])])])
    return ResourceSlice(metadata=ObjectMeta(name=name), spec=ResourceSliceSpec(
        driver=driver, nodeSelector=selector, nodeName=node_name, allNodes=all_nodes,
        pool=ResourcePool(name=f"{name}-pool", generation=1, resourceSliceCount=1),
        devices=[Device(name="channel-1")]))


def gpu_slice(node: str, *, pool: str | None = None) -> ResourceSlice:
    return ResourceSlice(metadata=ObjectMeta(name=names.gpu_slice_name(node)), spec=ResourceSliceSpec(
        driver=names.GPU_DRIVER, nodeName=node,
        pool=ResourcePool(name=pool or node, generation=1, resourceSliceCount=1), devices=[Device(name="gpu-0")]))


def test_agent_writes_only_its_own_nodes_gpu_slice(env: Env) -> None:
    """The agent publishes its node's GPUs (nodeagent/gpus.py); a hijacked agent may not publish
    channels (a pool the scheduler would hand out as IMEX channels), another node's GPUs, or a
    pool named otherwise."""
    name = f"agent-slice-{env.suffix}"
    own = env.agent.create(gpu_slice(env.node_a))
    try:
        own.spec.devices[0].taints = [DeviceTaint(key=names.FABRIC_UNHEALTHY_TAINT, value="FabricDegraded",
                                                  effect="NoSchedule")]
        env.agent.replace(own)
        msg = denied(lambda: env.agent.create(channel_slice(name)))
        assert f"nvlfabric-agent on node {env.node_a} may not CREATE ResourceSlice {name} (driver {DRIVER} of " \
            "no single node)" in msg
        assert "published only by nvlfabric-controller" in msg
        msg = denied(lambda: env.agent.create(channel_slice(name, node_name=env.node_a)))
        assert f"(driver {DRIVER} of node {env.node_a})" in msg
        msg = denied(lambda: env.agent.create(gpu_slice(env.node_b)))
        assert f"(driver {names.GPU_DRIVER} of node {env.node_b})" in msg
        assert f"its own node's GPU slice (driver {names.GPU_DRIVER}, spec.nodeName and pool {env.node_a})" in msg
        denied(lambda: env.agent.create(ResourceSlice(metadata=ObjectMeta(name=name), spec=gpu_slice(
            env.node_a, pool="elsewhere").spec)))
        # Another node's slice, written by its own agent or anyone else, is not this agent's to delete.
        env.admin.create(gpu_slice(env.node_b))
        msg = denied(lambda: env.agent.delete(ResourceSlice, names.gpu_slice_name(env.node_b)))
        assert f"may not DELETE ResourceSlice {names.gpu_slice_name(env.node_b)}" in msg
        env.agent.delete(ResourceSlice, names.gpu_slice_name(env.node_a))
    finally:
        for n in (name, names.gpu_slice_name(env.node_a), names.gpu_slice_name(env.node_b)):
            with contextlib.suppress(ApiError):
                env.admin.delete(ResourceSlice, n)


def test_controller_writes_only_clique_pool_slices_of_our_driver(env: Env) -> None:
    controller = env.token_client(CONTROLLER, manager="nvlfabric-controller")
    name = f"clique-test-{env.suffix}"
    try:
        created = eventually("RBAC to let the controller create ResourceSlices",
                             lambda: _try(lambda: controller.create(channel_slice(name))), timeout=POLICY_EFFECTIVE_S)
        created.spec.pool.generation = 2  # a pool change bumps the generation on every slice
        controller.replace(created)
        # The controller's policy comes into effect on its own schedule (the fixture waited for the
        # agent's): probe it with a dry run, which admission judges too, before the real denials.
        policy_in_effect(lambda: controller.create(channel_slice(f"{name}-p", node_name=env.node_a), dry_run=True))
        msg = denied(lambda: controller.create(channel_slice(f"{name}-n", node_name=env.node_a)))
        assert "may only write ResourceSlices that select their nodes with spec.nodeSelector" in msg
        assert f"uses spec.nodeName {env.node_a}" in msg
        msg = denied(lambda: controller.create(channel_slice(f"{name}-all", all_nodes=True)))
        assert "uses spec.allNodes" in msg
        msg = denied(lambda: controller.create(channel_slice(f"{name}-gpu", driver="gpu.example.com")))
        assert f"may only write ResourceSlices of driver {DRIVER}" in msg and "of driver gpu.example.com" in msg
        controller.delete(ResourceSlice, name)
    finally:
        controller.close()
        for n in (name, f"{name}-n", f"{name}-all", f"{name}-gpu"):
            with contextlib.suppress(ApiError):
                env.admin.delete(ResourceSlice, n)


def test_controller_may_hold_its_own_lease_only(env: Env) -> None:
    """Leader election (nvlfabric/controller/leader.py): create, get and update of the Lease
    nvlfabric-controller in its own namespace; no other Lease, no other namespace."""
    controller = env.token_client(CONTROLLER, manager="nvlfabric-controller")
    mine = Lease(metadata=ObjectMeta(name=CONTROLLER, namespace=NAMESPACE),
                 spec=LeaseSpec(holderIdentity=f"test-{env.suffix}", leaseDurationSeconds=15))
    try:
        with contextlib.suppress(ApiError):
            env.admin.delete(Lease, CONTROLLER, namespace=NAMESPACE)
        eventually("RBAC to let the controller create its Lease",
                   lambda: _try(lambda: controller.create(mine)), timeout=POLICY_EFFECTIVE_S)
        held = controller.get(Lease, CONTROLLER, namespace=NAMESPACE)
        assert held.spec is not None
        held.spec.holderIdentity = f"test-{env.suffix}-2"
        controller.replace(held)
        for name, namespace in ((f"other-{env.suffix}", NAMESPACE), (CONTROLLER, "default")):
            env.admin.create(Lease(metadata=ObjectMeta(name=name, namespace=namespace), spec=LeaseSpec()))
            try:
                with pytest.raises(ApiError) as info:
                    controller.get(Lease, name, namespace=namespace)
                assert info.value.status.code == 403
            finally:
                env.admin.delete(Lease, name, namespace=namespace)
    finally:
        controller.close()
        with contextlib.suppress(ApiError):
            env.admin.delete(Lease, CONTROLLER, namespace=NAMESPACE)


def test_controller_may_not_touch_other_drivers_slices(env: Env) -> None:
    name = f"other-driver-{env.suffix}"
    env.admin.create(channel_slice(name, driver="gpu.example.com"))
    controller = env.token_client(CONTROLLER, manager="nvlfabric-controller")
    try:
        msg = denied(lambda: controller.delete(ResourceSlice, name))
        assert "not DELETE ResourceSlice" in msg and "of driver gpu.example.com" in msg
    finally:
        controller.close()
        with contextlib.suppress(ApiError):
            env.admin.delete(ResourceSlice, name)


def test_controller_may_reserve_a_channel_claim_for_pending_pods(env: Env) -> None:
    """What nvlfabric/controller/reservations.py does with the controller's own token: watch unbound pods
    and append to an allocated claim's reservedFor (which also takes resourceclaims/binding)."""
    name = f"rsv-{env.suffix}"
    cd = env.admin.create(ComputeDomainResource(metadata=ObjectMeta(name=name, namespace="default"), spec={}))
    claim = channel_claim(name, "default", cd.metadata.uid, api.ComputeDomainSpec())  # as the provider makes it
    claim["metadata"]["name"] = name
    env.admin.create(codecs.from_dict(claim))
    # Two pending pods (kube-controller-manager drops reservations of pods that do not exist).
    pods = [env.admin.create(Pod(metadata=ObjectMeta(name=f"{name}-{i}", namespace="default"), spec=PodSpec(
        nodeSelector={"nvlfabric-test": "nowhere"}, containers=[Container(name="c", image="registry.invalid/c")])))
        for i in range(2)]
    refs = [{"resource": "pods", "name": p.metadata.name, "uid": p.metadata.uid} for p in pods]
    env.admin.patch(ResourceClaim.Status, name, {"status": {
        "allocation": {"devices": {"results": [{"request": "channel", "driver": DRIVER, "pool": f"clique-{CLIQUE}",
                                                "device": "channel-1"}]}},
        "reservedFor": refs[:1]}}, namespace="default", patch_type=PatchType.MERGE)
    controller = env.token_client(CONTROLLER, manager="nvlfabric-controller")
    try:
        unbound = eventually("RBAC to let the controller list unbound pods", lambda: _try(lambda: [
            p.metadata.name for p in controller.list(Pod, namespace="default", fields={"spec.nodeName": ""})]),
            timeout=POLICY_EFFECTIVE_S)
        assert {p.metadata.name for p in pods} <= set(unbound)
        uid = env.admin.get(ResourceClaim, name, namespace="default").metadata.uid
        later = PendingPod("default", refs[1]["name"], refs[1]["uid"], frozenset({name}))
        out = controller.patch(ResourceClaim.Status, name, reservation_patch(uid, [later]), namespace="default",
                               patch_type=PatchType.JSON)
        assert [r.to_dict() for r in out.status.reservedFor] == refs
    finally:
        controller.close()
        for p in pods:
            with contextlib.suppress(ApiError):
                env.admin.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
        with contextlib.suppress(ApiError):
            env.admin.delete(ResourceClaim, name, namespace="default")
        with contextlib.suppress(ApiError):
            env.admin.delete(ComputeDomainResource, name, namespace="default")


def test_controller_may_only_lift_the_reservation_gate_of_a_pod(env: Env) -> None:
    name = f"gated-{env.suffix}"
    env.admin.create(Pod(metadata=ObjectMeta(name=name, namespace="default", labels={"app": "w"}), spec=PodSpec(
        schedulingGates=[PodSchedulingGate(name="example.com/other"), PodSchedulingGate(name=RESERVATION_GATE)],
        containers=[Container(name="c", image="registry.invalid/c")])))
    controller = env.token_client(CONTROLLER, manager="nvlfabric-controller")

    def gates() -> list[str]:
        return [g.name for g in env.admin.get(Pod, name, namespace="default").spec.schedulingGates or []]

    def lift(gate: str) -> Any:
        return controller.patch(Pod, name, {"spec": {"schedulingGates": [{"$patch": "delete", "name": gate}]}},
                                namespace="default", patch_type=PatchType.STRATEGIC)

    try:
        msg = eventually_denied(lambda: lift("example.com/other"))
        assert "nvlfabric-controller may only lift the scheduling gate nvlfabric.io/channel-reservation" in msg
        assert f"UPDATE of pod default/{name} changes schedulingGates other than" in msg
        msg = denied(lambda: controller.patch(Pod, name, {"metadata": {"labels": {"app": "x"}}}, namespace="default",
                                              patch_type=PatchType.STRATEGIC))
        assert msg.endswith("changes metadata.labels")
        assert gates() == ["example.com/other", RESERVATION_GATE]
        # Sending a pioneer to its clique: the node selector may gain nvlfabric.io/clique and nothing else.
        msg = denied(lambda: controller.patch(Pod, name, {"spec": {"nodeSelector": {"rack": "7"}}},
                                              namespace="default", patch_type=PatchType.STRATEGIC))
        assert msg.endswith("changes spec.nodeSelector other than adding nvlfabric.io/clique")
        # A multi-clique job's pod gets its rank: that annotation may be added, no other.
        msg = denied(lambda: controller.patch(Pod, name, {"metadata": {"annotations": {"x": "1"}}},
                                              namespace="default", patch_type=PatchType.STRATEGIC))
        assert msg.endswith("changes metadata.annotations other than adding nvlfabric.io/rank")
        controller.patch(Pod, name, {"metadata": {"annotations": {"nvlfabric.io/rank": "7"}}}, namespace="default",
                         patch_type=PatchType.STRATEGIC)
        controller.patch(Pod, name, pioneer_patch(CLIQUE), namespace="default", patch_type=PatchType.STRATEGIC)
        assert gates() == ["example.com/other"]
        assert env.admin.get(Pod, name, namespace="default").spec.nodeSelector == {"nvlfabric.io/clique": CLIQUE}
    finally:
        controller.close()
        with contextlib.suppress(ApiError):
            env.admin.delete(Pod, name, namespace="default", grace_period=0)


def test_controller_may_fail_and_delete_only_a_lost_nodes_pod_of_a_claim(env: Env) -> None:
    """controller/lostpods.py: status phase Failed with DisruptionTarget DeletionByNvlfabric, on a pod
    that names a claim, then delete; no other status write, no other deletion."""
    name, plain = f"lost-{env.suffix}", f"plain-{env.suffix}"
    for pod, claims in ((name, [PodResourceClaim(name="channel", resourceClaimName="some-channel")]), (plain, None)):
        env.admin.create(Pod(metadata=ObjectMeta(name=pod, namespace="default"), spec=PodSpec(
            resourceClaims=claims, containers=[Container(name="c", image="registry.invalid/c")])))
    controller = env.token_client(CONTROLLER, manager="nvlfabric-controller")

    def fail(pod: str, reason: str = "DeletionByNvlfabric", phase: str = "Failed") -> Any:
        return controller.patch(Pod.Status, pod, {"status": {"phase": phase, "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": reason, "message": "node lost",
            "lastTransitionTime": "2026-12-07T01:00:00Z"}]}}, namespace="default", patch_type=PatchType.STRATEGIC)

    try:
        msg = eventually_denied(lambda: _try(lambda: controller.delete(Pod, name, namespace="default")))
        assert "DELETE of a pod it did not fail for a lost node" in msg
        assert "status other than failing a pod of a lost node" in denied(lambda: fail(name, reason="Other"))
        assert "status other than failing a pod of a lost node" in denied(lambda: fail(name, phase="Succeeded"))
        assert "status other than failing a pod of a lost node" in denied(lambda: fail(plain))  # names no claim
        fail(name)
        controller.delete(Pod, name, namespace="default")
        assert "DELETE of a pod it did not fail" in denied(lambda: controller.delete(Pod, plain, namespace="default"))
    finally:
        controller.close()
        for pod in (name, plain):
            with contextlib.suppress(ApiError):
                env.admin.delete(Pod, pod, namespace="default", grace_period=0)


def _try(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except ApiError as exc:
        if exc.status.code == 403 and "ValidatingAdmissionPolicy" not in (exc.status.message or ""):
            return None  # RBAC not updated yet
        raise


# -- Tokens without a node -----------------------------------------------------------------------


def test_agent_token_not_bound_to_a_pod_is_denied(env: Env) -> None:
    unbound = env.token_client(AGENT, manager=f"nvlfabric-agent-{env.node_a}")
    try:
        msg = denied(lambda: label(unbound, env.node_a, {"nvlfabric.io/clique": CLIQUE}))
        assert "this token carries no node" in msg and "TokenRequest without boundObjectRef" in msg
        assert f"may only write its own Node (nvlfabric.io/ labels, the {FABRIC} condition)" in msg
        # Reading stays possible: only writes are node-scoped.
        assert unbound.get(Node, env.node_a).metadata.name == env.node_a
    finally:
        unbound.close()


def _csr(name: str, signer: str) -> CertificateSigningRequest:
    key = ec.generate_private_key(ec.SECP256R1())
    req = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:node:spy")])).sign(key, hashes.SHA256())
    return CertificateSigningRequest.from_dict({"metadata": {"name": name}, "spec": {
        "signerName": signer, "usages": ["digital signature", "client auth"],
        "request": base64.b64encode(req.public_bytes(serialization.Encoding.PEM)).decode()}})


def test_agent_asks_for_imex_certificates_only_and_with_its_nodes_token(env: Env) -> None:
    """The agent's role may create CertificateSigningRequests (IMEX node certificates), which RBAC
    cannot narrow to a signer: the policy does, and wants the token bound to the agent's node."""
    name = f"agent-csr-{env.suffix}"
    msg = policy_in_effect(lambda: env.agent.create(_csr(name, "kubernetes.io/kube-apiserver-client-kubelet"),
                                                    dry_run=True))
    assert "asks for IMEX node certificates only (signerName nvlfabric.io/imex), not of signer " \
           "kubernetes.io/kube-apiserver-client-kubelet" in msg, msg
    env.agent.create(_csr(name, names.IMEX_SIGNER), dry_run=True)  # its own signer: admitted
    unbound = env.token_client(AGENT, manager="spy")
    try:
        msg = denied(lambda: unbound.create(_csr(name, names.IMEX_SIGNER), dry_run=True))
        assert "with its pod's token only (bound to its node" in msg, msg
    finally:
        unbound.close()


def test_admin_is_not_restricted(env: Env) -> None:
    label(env.admin, env.node_b, {"example.com/by-admin": "yes"})
    label(env.admin, env.node_b, {"example.com/by-admin": None})


def test_policies_type_check_cleanly(env: Env) -> None:
    deadline = time.monotonic() + POLICY_EFFECTIVE_S
    for name in POLICIES:
        policy = env.admin.get(ValidatingAdmissionPolicy, name)
        while (policy.status is None or policy.status.typeChecking is None) and time.monotonic() < deadline:
            time.sleep(0.2)
            policy = env.admin.get(ValidatingAdmissionPolicy, name)
        assert policy.status is not None and policy.status.typeChecking is not None, name
        assert not policy.status.typeChecking.expressionWarnings, (name, policy.status.typeChecking)


def test_manifest_binds_each_policy() -> None:
    docs = [d for d in yaml.safe_load_all(manifests.read(manifests.DRIVER_FILE)) if d]
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"]: d["spec"]["validationActions"] for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == set(POLICIES) and bindings == {p: ["Deny"] for p in POLICIES}


def test_agent_reports_a_domain_entry_on_its_own_node_only(env: Env) -> None:
    """The agent's entry for a ComputeDomain is an annotation of its own Node, which the controller
    copies into the domain's status: allowed there, refused on another node."""
    report = node_report("default", "train", api.NodeStatus(name=env.node_a, ready=True))
    env.agent.patch(Node, env.node_a, {"metadata": {"annotations": report}})
    assert node_reports(env.admin.get(Node, env.node_a).metadata.annotations)[0].entry.ready
    env.agent.patch(Node, env.node_a, {"metadata": {"annotations": {k: None for k in report}}})
    assert not node_reports(env.admin.get(Node, env.node_a).metadata.annotations)
    msg = denied(lambda: env.agent.patch(Node, env.node_b, {"metadata": {"annotations": report}}))
    assert f"may only modify its own Node {env.node_a}" in msg
