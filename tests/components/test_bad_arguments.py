"""Bad arguments are refused in one line naming the field (issue 17), and valid ones accepted:
pod template parts of the wrong type, a node name, unknown keywords, image references with a
registry port, clique ids as long as the hardware gives; a sidecar does not multiply the pod's
GPUs; a rack patches only Nodes that exist. Issue 49: a value of another type is refused rather
than converted (True for an integer), as are a non-finite number, a rack node no Node can be
named, and two domains on one channel claim. In-process with Pulumi's mocks (what `pulumi
preview` runs), plus a fuzz test of pod templates, and each of issue 49's refusals through the
real CLI's `pulumi preview`."""

from __future__ import annotations

import json
import math
import sys
import uuid
from pathlib import Path
from typing import Any

import pulumi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from nvlfabric.components import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver, clusterprobes, program, workload
from nvlfabric.components.args import ComponentArgsError, validate
from nvlfabric.components.computedomain import ComputeDomainArgs
from nvlfabric.components.driver import NvlfabricDriverArgs
from nvlfabric.components.rack import Nvl72RackArgs
from nvlfabric.components.workload import BoundJobArgs, bound_pod_template
from nvlfabric.testbed.pulumi_cli import PulumiProject, project_from_fixture
from tests.conftest import Cluster

CONTAINER = {"name": "worker", "image": "registry.invalid/train:1"}


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.created: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.created.append(f"{args.typ}::{args.name}")
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


@pytest.fixture(autouse=True)
def mocks(monkeypatch: pytest.MonkeyPatch) -> _Mocks:
    m = _Mocks()
    pulumi.runtime.set_mocks(m, preview=True)
    monkeypatch.setattr(clusterprobes, "scheduling_apis", lambda namespace: None)  # no cluster scheduling here
    return m


def _refused(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ComponentArgsError) as err:
        fn(*args, **kwargs)
    return str(err.value)


@pytest.mark.parametrize("spec_part, words", [
    ({"resourceClaims": "x"}, "pod_template: spec.resourceClaims must be a list (got 'x')"),
    ({"schedulingGates": ["x"]}, "pod_template: spec.schedulingGates[0] must be a mapping with a name (got 'x')"),
    ({"containers": [{**CONTAINER, "resources": "x"}]},
     "pod_template: spec.containers[0].resources must be a mapping (got 'x')"),
    ({"containers": [{**CONTAINER, "resources": {"limits": ["x"]}}]},
     "pod_template: spec.containers[0].resources.limits must be a mapping"),
    ({"containers": [{**CONTAINER, "env": {"A": "1"}}]}, "pod_template: spec.containers[0].env must be a list"),
    ({"initContainers": ["x"]}, "pod_template: spec.initContainers[0] must be a mapping (got 'x')"),
    ({"nodeName": "node-7"}, "pod_template: spec.nodeName is set"),
    ({"schedulingGroup": {"podGroupName": "g"}}, "pod_template: spec.schedulingGroup is set by BoundJob"),
])
def test_a_pod_template_part_of_the_wrong_kind_is_refused_naming_its_path(spec_part: dict[str, Any],
                                                                          words: str) -> None:
    msg = _refused(BoundJob, "train", compute_domain=ComputeDomain("cd"),
                   pod_template={"spec": {"containers": [CONTAINER], **spec_part}})
    assert msg.startswith("BoundJob 'train': invalid arguments\n  ") and words in msg, msg
    assert "Value error" not in msg and "{'spec'" not in msg  # the part, not the whole template


def test_metadata_that_is_not_a_mapping_is_refused() -> None:
    msg = _refused(BoundJob, "train", compute_domain=ComputeDomain("cd"),
                   pod_template={"metadata": "x", "spec": {"containers": [CONTAINER]}})
    assert "pod_template: metadata must be a mapping (got 'x')" in msg


def test_null_parts_are_as_good_as_absent() -> None:
    tpl = {"metadata": {"labels": None}, "spec": {"resourceClaims": None, "containers": [
        {**CONTAINER, "resources": {"limits": None, "claims": None}}]}}
    job = BoundJob("train", compute_domain=ComputeDomain("cd"), pod_template=tpl, gpus_per_pod=2)
    (c,) = bound_pod_template(job.args, claim_name="cd-channel", domain="cd")["spec"]["containers"]
    assert c["resources"] == {"claims": [{"name": "channel"}], "limits": {"nvidia.com/gpu": "2"}}


@pytest.mark.parametrize("component, kwargs, name", [
    (BoundJob, {"pod_template": {"spec": {"containers": [CONTAINER]}}, "replicas": 3}, "replicas"),
    (ComputeDomain, {"adopt": True}, "adopt"),
    (NvlfabricDriver, {"channels": 8}, "channels"),
    (Nvl72Rack, {"nodes": ["n0"], "observe": False, "racks": 2}, "racks"),
])
def test_an_unknown_keyword_is_named_with_the_valid_ones(component: Any, kwargs: dict[str, Any], name: str) -> None:
    if component is BoundJob:
        kwargs = {**kwargs, "compute_domain": ComputeDomain("cd")}
    msg = _refused(component, "x", **kwargs)
    assert f"  {name}: unknown argument; valid ones are " in msg, msg
    assert "clique_groups" not in msg  # internal: not an argument


def test_a_sidecar_gets_the_channel_but_not_the_pods_gpus() -> None:
    tpl = {"spec": {"containers": [CONTAINER, {"name": "logs", "image": "registry.invalid/logs:1"}]}}
    args = BoundJobArgs(name="train", pod_template=tpl, gpus_per_pod=4)
    worker, logs = bound_pod_template(args, claim_name="c", domain="d")["spec"]["containers"]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "limits" not in logs["resources"] and logs["resources"]["claims"] == [{"name": "channel"}]
    other = BoundJobArgs(name="train", pod_template=tpl, gpus_per_pod=4, gpu_container="logs")
    worker, logs = bound_pod_template(other, claim_name="c", domain="d")["spec"]["containers"]
    assert "limits" not in worker["resources"] and logs["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    msg = _refused(BoundJob, "train", compute_domain=ComputeDomain("cd"), pod_template=tpl, gpu_container="gpu")
    assert "gpu_container 'gpu' is not a container of pod_template (its containers: worker, logs)" in msg


@pytest.mark.parametrize("image", ["localhost:5000/nvlfabric/node-agent:0.1.0", "registry.example.com:443/a/b:v1",
                                   "ghcr.io/org/agent@sha256:" + "a" * 64, "nvlfabric/node-agent"])
def test_image_references_with_a_registry_port_or_a_digest_are_accepted(image: str) -> None:
    assert NvlfabricDriver("driver", image=image).args.image == image


@pytest.mark.parametrize("image", ["Nvlfabric/Agent:1", "agent:1:2", "a b", ""])
def test_malformed_image_references_are_refused(image: str) -> None:
    assert "image:" in _refused(NvlfabricDriver, "driver", image=image)


def test_a_clique_id_as_long_as_nvml_gives_is_accepted() -> None:
    clique = "08de8ac3-4935-5c92-a431-83c8c0b40e16.4294967295"  # a cluster UUID and a 32-bit clique id
    assert Nvl72Rack("r", nodes=["n0"], expected_clique=clique, observe=False).args.expected_clique == clique
    assert "expected_clique:" in _refused(Nvl72Rack, "r", nodes=["n0"], expected_clique="x" * 64, observe=False)


@pytest.mark.cluster
def test_an_observed_rack_patches_only_the_nodes_that_exist(cluster: Cluster, mocks: _Mocks,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from nvlfabric.sim.cluster import delete_nodes, make_ready_nodes

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    real = f"bad-{uuid.uuid4().hex[:5]}"
    make_ready_nodes(cluster.client, {real: {}})
    try:
        rack = Nvl72Rack("rack", nodes=[real, "no-such-node"])
        assert rack.labelled_nodes == [real]
        program.reset()  # the same nodes again, as another program would
        unobserved = Nvl72Rack("blind", nodes=[real, "no-such-node"], observe=False)
        assert unobserved.labelled_nodes == [real, "no-such-node"]  # the user's word: nothing was read
    finally:
        delete_nodes(cluster.client, [real])


@pytest.mark.cluster
@pytest.mark.parametrize("preview", [True, False])
def test_a_jobset_where_the_cluster_serves_no_jobset_warns_at_preview_and_stops_up(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch, preview: bool) -> None:
    """The shared test cluster has no JobSet CRD: `preview` warns naming the kind, the API and how
    to install it; `up` stops before creating anything of the job; told what installs JobSet
    (depends_on), the component trusts it."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    pulumi.runtime.set_mocks(_Mocks(), preview=preview)
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    cd = ComputeDomain("cd")
    words = ("kind: 'JobSet', but the cluster serves no jobset.x-k8s.io/v1alpha2 JobSet: install JobSet "
             "(https://jobset.sigs.k8s.io) and its controller first; on nvlfabric's simulator: "
             "`nvlfabric-sim up --addons jobset`, or pass opts=ResourceOptions(depends_on=[...])")
    if preview:
        BoundJob("train", kind="JobSet", compute_domain=cd, pod_template={"spec": {"containers": [CONTAINER]}})
        assert any(words in w and "`pulumi up` stops here" in w for w in warned), warned
    else:
        msg = _refused(BoundJob, "train", kind="JobSet", compute_domain=cd,
                       pod_template={"spec": {"containers": [CONTAINER]}})
        assert msg.startswith("BoundJob 'train': invalid arguments\n  kind: 'JobSet'") and words in msg, msg
    program.reset()
    warned.clear()
    installer = pulumi.CustomResource("test:index:JobSetInstall", "jobset-install")
    BoundJob("told", kind="JobSet", compute_domain=ComputeDomain("cd2"),
             pod_template={"spec": {"containers": [CONTAINER]}}, opts=pulumi.ResourceOptions(depends_on=[installer]))
    assert not [w for w in warned if "serves no" in w]
    assert workload.cluster_serves("Job") is True and workload.cluster_serves("JobSet") is False


@pytest.mark.cluster
@pytest.mark.parametrize("preview", [True, False])
def test_a_queue_name_where_the_cluster_serves_no_kueue_warns_at_preview_and_stops_up(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch, preview: bool) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    pulumi.runtime.set_mocks(_Mocks(), preview=preview)
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    words = ("queue_name: 'team-a', but the cluster serves no kueue.x-k8s.io/v1beta1 LocalQueue: install Kueue "
             "(https://kueue.sigs.k8s.io) first; on nvlfabric's simulator: `nvlfabric-sim up --addons kueue`")
    kwargs: dict[str, Any] = {"compute_domain": ComputeDomain("cd"), "queue_name": "team-a",
                              "pod_template": {"spec": {"containers": [CONTAINER]}}}
    if preview:
        BoundJob("train", **kwargs)
        assert any(words in w for w in warned), warned
    else:
        msg = _refused(BoundJob, "train", **kwargs)
        assert msg.startswith("BoundJob 'train': invalid arguments\n  queue_name: 'team-a'") and words in msg, msg


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["name", "image", "limits", "claims", "x"]), inner,
                                                 max_size=3)), max_leaves=8)
container = st.fixed_dictionaries({"name": st.just("w"), "image": st.just("img")}, optional={
    "resources": json_value, "env": json_value})
template = st.fixed_dictionaries({"spec": st.fixed_dictionaries({"containers": st.lists(container, min_size=1,
                                                                                        max_size=2)}, optional={
    "resourceClaims": json_value, "schedulingGates": json_value, "initContainers": json_value,
    "tolerations": json_value, "nodeSelector": json_value})}, optional={"metadata": json_value})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tpl=template)
def test_any_pod_template_is_either_refused_naming_a_field_or_bound(tpl: dict[str, Any]) -> None:
    """Never a raw exception: refused with a field, or bound with the claim and the GPUs."""
    try:
        args = validate(BoundJobArgs, "BoundJob", "fuzz", {"name": "fuzz", "pod_template": tpl})
    except ComponentArgsError as exc:
        assert "\n  pod_template" in str(exc), str(exc)
        return
    out = workload.workload_manifests(args, namespace="ml", claim_name="c", domain="d")[-1]["spec"]["template"]
    first = out["spec"]["containers"][0]
    assert first["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {"name": "channel", "resourceClaimName": "c"} in out["spec"]["resourceClaims"]


# -- checks across the components of one program ---------------------------------------------------

def test_two_domains_or_two_workloads_of_one_name_are_refused_naming_the_first() -> None:
    ComputeDomain("a", name="train")
    msg = _refused(ComputeDomain, "b", name="train")
    assert "ComputeDomain 'b': invalid arguments\n  name: ComputeDomain default/train is already declared by " \
           "ComputeDomain 'a' in this program" in msg
    ComputeDomain("c", name="train", namespace="ml")  # another namespace: another object
    cd = ComputeDomain("d", name="other")
    BoundJob("j1", name="job", compute_domain=cd, pod_template={"spec": {"containers": [CONTAINER]}}, gpus_per_pod=1)
    msg = _refused(BoundJob, "j2", name="job", compute_domain=cd, pod_template={"spec": {"containers": [CONTAINER]}},
                   gpus_per_pod=1)
    assert "workload default/job is already declared by BoundJob 'j1'" in msg


def test_a_node_in_two_racks_is_refused() -> None:
    Nvl72Rack("rack-a", nodes=["n0", "n1"], observe=False)
    assert "Node /n1 is already declared by Nvl72Rack 'rack-a'" in _refused(Nvl72Rack, "rack-b", nodes=["n1"],
                                                                            observe=False)


def test_workloads_that_together_need_more_than_a_clique_are_refused() -> None:
    cd = ComputeDomain("cd", spec={"numNodes": 18})
    BoundJob("big", compute_domain=cd, pod_template={"spec": {"containers": [CONTAINER]}}, parallelism=18)
    msg = _refused(BoundJob, "extra", compute_domain=cd, pod_template={"spec": {"containers": [CONTAINER]}})
    assert "binding 'extra' would put 76 GPUs in each of its clique groups (big 72, extra 4)" in msg
    assert "which has 72" in msg


@pytest.mark.parametrize("driver_first", [True, False])
def test_a_domain_mode_no_declared_driver_allows_is_refused(driver_first: bool) -> None:
    def driver() -> None:
        NvlfabricDriver("nvlfabric", imex_modes=["Dedicated"])

    if driver_first:
        driver()
        msg = _refused(ComputeDomain, "train")
    else:
        ComputeDomain("train")
        msg = _refused(driver)
    assert "ComputeDomain 'train': invalid arguments\n  spec.imexMode: CliqueScoped (domain train) is not allowed " \
           "by the program's NvlfabricDriver 'nvlfabric' (imex_modes: Dedicated)" in msg
    assert "use imexMode Dedicated, or add CliqueScoped to the driver's imex_modes" in msg


def test_a_job_tolerates_the_taints_of_the_racks_declared_before_it() -> None:
    Nvl72Rack("rack", nodes=["n0"], observe=False, taints=[{"key": "nvidia.com/gpu", "value": "present"},
                                                          {"key": "site/maint", "effect": "NoExecute"}])
    tpl = {"spec": {"containers": [CONTAINER], "tolerations": [{"key": "site/maint", "operator": "Exists"}]}}
    job = BoundJob("train", compute_domain=ComputeDomain("cd"), pod_template=tpl)
    assert job.args.pod_template["spec"]["tolerations"] == [
        {"key": "site/maint", "operator": "Exists"},  # the user's own already covers this taint
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    assert tpl["spec"]["tolerations"] == [{"key": "site/maint", "operator": "Exists"}]  # not modified


def test_a_rack_whose_taint_a_job_declared_before_it_does_not_tolerate_is_refused_naming_both() -> None:
    tolerant = {"spec": {"containers": [CONTAINER], "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}
    BoundJob("ok", compute_domain=ComputeDomain("cd0"), pod_template=tolerant)
    Nvl72Rack("rack0", nodes=["n0"], observe=False, taints=[{"key": "nvidia.com/gpu", "value": "present"}])
    BoundJob("train", compute_domain=ComputeDomain("cd"), pod_template={"spec": {"containers": [CONTAINER]}})
    with pytest.raises(ComponentArgsError) as err:
        Nvl72Rack("rack1", nodes=["n1"], observe=False, taints=[{"key": "site/maint", "effect": "NoExecute"}])
    (first, line) = str(err.value).splitlines()
    assert first == "Nvl72Rack 'rack1': invalid arguments"
    assert "taints: site/maint=:NoExecute is not tolerated by BoundJob 'ok', declared before this rack" in line
    assert "declare the rack before the workloads that run on it" in line


# -- issue 49: what was accepted and should fail `pulumi preview` ----------------------------------

@pytest.mark.parametrize("component, kwargs, line", [
    (NvlfabricDriver, {"channels_per_clique": True}, "  channels_per_clique: Input should be a valid integer, not a "
     "boolean (got True) (expected: IMEX channels per NVLink clique, 1..2047"),
    (NvlfabricDriver, {"channel_quota_per_namespace": "5"}, "  channel_quota_per_namespace: Input should be a valid "
     "integer, not a string (got '5') (expected: the IMEX channels one namespace's claims may hold"),
    (NvlfabricDriver, {"imex_cert_validity_s": 86400.0}, "  imex_cert_validity_s: Input should be a valid integer, not "
     "a float (got 86400.0)"),
    (BoundJob, {"parallelism": True}, "  parallelism: Input should be a valid integer, not a boolean (got True)"),
    (BoundJob, {"gpus_per_pod": 2.0}, "  gpus_per_pod: Input should be a valid integer, not a float (got 2.0)"),
    (BoundJob, {"master_port": "29500"}, "  master_port: Input should be a valid integer, not a string (got '29500')"),
    (BoundJob, {"wait": 1}, "  wait: Input should be a valid boolean, not an integer (got 1)"),
    (ComputeDomain, {"spec": {"numNodes": True}}, "  spec.numNodes: Input should be a valid integer, not a boolean "
     "(got True) (expected: a ComputeDomainSpec"),
    (ComputeDomain, {"spec": {"numNodes": 36.0, "placement": {"scope": "MultiClique", "cliques": 2.0}}},
     "  spec.placement.cliques: Input should be a valid integer, not a float (got 2.0)"),
    (ComputeDomain, {"backend": "nvidia", "spec": {"numNodes": "2"}}, "  spec.numNodes: Input should be a valid "
     "integer, not a string (got '2')"),
    (ComputeDomain, {"timeout_s": "60"}, "  timeout_s: Input should be a valid number, not a string (got '60')"),
    (ComputeDomain, {"force_delete": "yes"},
     "  force_delete: Input should be a valid boolean, not a string (got 'yes')"),
    (Nvl72Rack, {"observe": 0}, "  observe: Input should be a valid boolean, not an integer (got 0)"),
])
def test_a_value_of_another_type_is_refused_not_converted(component: Any, kwargs: dict[str, Any], line: str) -> None:
    """Before: pydantic's lax mode took them, `channels_per_clique=True` as a pool of one channel."""
    if component is BoundJob:
        kwargs = {"compute_domain": ComputeDomain("cd"), "pod_template": {"spec": {"containers": [CONTAINER]}},
                  **kwargs}
    if component is Nvl72Rack:
        kwargs = {"nodes": ["n0"], **kwargs}
    msg = _refused(component, "x", **kwargs)
    assert msg.startswith(f"{component.__name__} 'x': invalid arguments\n"), msg
    assert any(ln.startswith(line) for ln in msg.splitlines()), msg


def test_integers_and_floats_that_are_what_they_say_are_taken() -> None:
    cd = ComputeDomain("cd", timeout_s=60, spec={"numNodes": 36, "placement": {"scope": "MultiClique", "cliques": 2}})
    assert cd.args.timeout_s == 60 and cd.claims == ["cd-channel-0", "cd-channel-1"]
    job = BoundJob("train", compute_domain=cd, parallelism=36, gpus_per_pod=4, pod_template={"spec": {
        "containers": [CONTAINER]}})
    assert (job.args.parallelism, job.args.gpus_per_pod) == (36, 4)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_timeout_is_refused(value: float) -> None:
    msg = _refused(ComputeDomain, "cd", timeout_s=value)
    assert msg.splitlines() == ["ComputeDomain 'cd': invalid arguments", (
        f"  timeout_s: Input should be a finite number (got {value!r}) (expected: seconds a create, update or delete "
        "may take (a finite number > 0))")], msg


def test_a_non_finite_number_anywhere_in_the_arguments_is_refused_naming_its_path() -> None:
    tpl = {"spec": {"containers": [{**CONTAINER, "ports": [{"containerPort": math.nan}]}],
                    "terminationGracePeriodSeconds": math.inf}}
    msg = _refused(BoundJob, "train", compute_domain=ComputeDomain("cd"), pod_template=tpl)
    assert "  pod_template.spec.containers[0].ports[0].containerPort: Input should be a finite number (got nan)" in msg
    assert "  pod_template.spec.terminationGracePeriodSeconds: Input should be a finite number (got inf)" in msg


@pytest.mark.parametrize("node", ["gb200-R0-n01", "node_1", "n 1", "-n1", "n1.", "n1..x", "", "a" * 254])
def test_a_rack_node_no_node_can_be_named_is_refused_naming_its_index_and_the_rule(node: str) -> None:
    """Before: taken, and at preview only a warning that the Node is missing (unobserved: `up` failed)."""
    msg = _refused(Nvl72Rack, "rack", nodes=["n0", node], observe=False)
    first, line = msg.splitlines()
    assert first == "Nvl72Rack 'rack': invalid arguments"
    assert line.startswith("  nodes[1]: not a Node name: a Kubernetes Node name is a DNS subdomain: at most 253 "
                           "characters, lowercase letters, digits, '-' and '.', each dot-separated part starting and "
                           "ending with a letter or digit; a Node of this name cannot exist, so the rack could never "
                           "label it: write the name as `kubectl get nodes` shows it"), line
    assert f"(got {node!r})" in line or len(node) > 150, line  # (a long one is not repeated)
    assert "(expected: the rack's Kubernetes node names (DNS subdomains), 1..18 compute trays)" in line


def test_node_names_kubernetes_takes_are_taken() -> None:
    nodes = ["gb200-r0-n01", "node-7.rack-0.example.com", "0", "a" * 253]
    assert Nvl72Rack("rack", nodes=nodes, observe=False).args.nodes == nodes


CLAIM_FIX = ("already has as its channel claim in this program; two domains cannot share one claim (their pods would "
             "share one IMEX channel, and `pulumi up` would fail on the claim): give one of them a "
             "spec.channelClaim.name of its own")


@pytest.mark.parametrize("first, second, line", [
    ({"name": "x", "spec": {"channelClaim": {"name": "y-channel"}}}, {"name": "y"},
     "  name: 'y' makes ResourceClaim default/y-channel, its default channel claim <name>-channel, which "
     "ComputeDomain 'a' (domain default/x) " + CLAIM_FIX),
    ({"name": "x"}, {"name": "y", "spec": {"channelClaim": {"name": "x-channel"}}},
     "  spec.channelClaim.name: 'x-channel' makes ResourceClaim default/x-channel, which ComputeDomain 'a' (domain "
     "default/x) " + CLAIM_FIX),
    ({"name": "big", "spec": {"numNodes": 36, "placement": {"scope": "MultiClique", "cliques": 2},
                              "channelClaim": {"name": "shared"}}},
     {"name": "small", "spec": {"channelClaim": {"name": "shared-1"}}},
     "  spec.channelClaim.name: 'shared-1' makes ResourceClaim default/shared-1, which ComputeDomain 'a' (domain "
     "default/big) " + CLAIM_FIX),
    ({"name": "small", "namespace": "ml", "spec": {"channelClaim": {"name": "t-0"}}},
     {"name": "big", "namespace": "ml", "spec": {"placement": {"scope": "MultiClique", "cliques": 3},
                                                 "channelClaim": {"name": "t"}}},
     "  spec.channelClaim.name: 't' makes ResourceClaim ml/t-0, the channel claim of its clique group 0, which "
     "ComputeDomain 'a' (domain ml/small) " + CLAIM_FIX),
    ({"name": "x", "backend": "nvidia", "spec": {"channelClaim": {"name": "gang"}}},
     {"name": "y", "backend": "nvidia", "spec": {"channelClaim": {"name": "gang"}}},
     "  spec.channelClaim.name: 'gang' makes ResourceClaimTemplate default/gang, which ComputeDomain 'a' (domain "
     "default/x) " + CLAIM_FIX),
])
def test_two_domains_on_one_channel_claim_are_refused_naming_both_and_the_fix(
        first: dict[str, Any], second: dict[str, Any], line: str) -> None:
    """Before: both taken at preview, and `pulumi up` failed on the second claim."""
    ComputeDomain("a", **first)
    msg = _refused(ComputeDomain, "b", **second)
    assert msg.splitlines() == ["ComputeDomain 'b': invalid arguments", line], msg


def test_claims_of_one_name_in_other_namespaces_or_other_runs_are_taken() -> None:
    ComputeDomain("a", name="x", spec={"channelClaim": {"name": "y-channel"}})
    ComputeDomain("b", name="y", namespace="ml")  # another namespace: another claim
    ComputeDomain("c", name="z", backend="nvidia", spec={"channelClaim": {"name": "y-channel"}})  # a template
    program.reset()  # another program run (the Automation API's next preview)
    ComputeDomain("d", name="y")


# -- every component, every argument ----------------------------------------------------------------

GOOD: dict[str, list[Any]] = {  # values a user would write, per argument name (any component)
    "name": ["train", "rack-0", "a" * 57], "namespace": ["default", "ml"], "nodes": [["n0"], ["n0", "n1"]],
    "spec": [{}, {"numNodes": 18}, {"imexMode": "Dedicated"}, {"placement": {"scope": "MultiClique", "cliques": 2},
                                                                 "numNodes": 36}],
    "labels": [{}, {"team": "ml"}], "await_for": ["Accepted", "Ready", None], "timeout_s": [60, 600.0],
    "force_delete": [True, False], "expected_clique": [None, "abc.1"], "label_nodes": [True, False],
    "taints": [[], [{"key": "nvidia.com/gpu", "value": "present"}]], "gpu_resource": ["nvidia.com/gpu"],
    "image": ["nvlfabric/node-agent:0.1.0", "localhost:5000/agent@sha256:" + "a" * 64],
    "driver_root": ["/run/nvidia/driver", "/"], "kubelet_root": ["/var/lib/kubelet"],
    "channels_per_clique": [1, 128, 2047], "channel_quota_per_namespace": [0, 64, 4096],
    "imex_modes": [["CliqueScoped"], ["CliqueScoped", "Dedicated"]],
    "parallelism": [1, 18, 72], "gpus_per_pod": [1, 4], "kind": ["Job", "StatefulSet", "JobSet"],
    "pod_template": [{"spec": {"containers": [CONTAINER]}}], "clique_groups": [None, 2],
    "scheduler": ["auto", "nvlfabric"], "master_port": [29500], "wait": [True, False],
}
BAD = st.one_of(json_value, st.integers(-10**6, 10**6), st.text(max_size=70), st.just("x" * 64),
                st.just("/run/../x"), st.floats(allow_nan=True))
COMPONENTS = {
    "NvlfabricDriver": (NvlfabricDriver, ["image", "driver_root", "kubelet_root", "channels_per_clique",
                                          "channel_quota_per_namespace", "imex_modes", "labels"]),
    "ComputeDomain": (ComputeDomain, ["name", "namespace", "spec", "labels", "await_for", "timeout_s",
                                      "force_delete"]),
    "Nvl72Rack": (Nvl72Rack, ["name", "nodes", "expected_clique", "label_nodes", "taints", "gpu_resource"]),
    "BoundJob": (BoundJob, ["name", "kind", "pod_template", "parallelism", "gpus_per_pod", "clique_groups",
                            "scheduler", "master_port", "wait", "labels"]),
}


MODELS: dict[str, type[BaseModel]] = {"NvlfabricDriver": NvlfabricDriverArgs, "ComputeDomain": ComputeDomainArgs,
                                      "Nvl72Rack": Nvl72RackArgs, "BoundJob": BoundJobArgs}


@st.composite
def component_call(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(sorted(COMPONENTS)))
    fields = draw(st.lists(st.sampled_from(COMPONENTS[kind][1]), unique=True, max_size=4))
    kwargs = {f: draw(st.one_of(st.sampled_from(GOOD[f]), BAD) if draw(st.booleans()) else st.sampled_from(GOOD[f]))
              for f in fields}
    if kind == "BoundJob":  # required arguments (leaving one out is Python's TypeError, naming it)
        kwargs.setdefault("pod_template", GOOD["pod_template"][0])
    if kind == "Nvl72Rack":
        kwargs.setdefault("nodes", ["n0"])
        kwargs["observe"] = False  # no cluster to read here
    return kind, kwargs


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(call=component_call())
def test_any_arguments_to_any_component_are_accepted_or_refused_one_line_per_named_field(
        call: tuple[str, dict[str, Any]]) -> None:
    """Never a raw exception: each component either takes the arguments or refuses them with its
    name, the resource's name, and one line per problem that starts with an argument given."""
    program.reset()  # each example is a program of its own
    kind, kwargs = call
    cls, _ = COMPONENTS[kind]
    extra = {"compute_domain": ComputeDomain(f"cd-{uuid.uuid4().hex[:6]}")} if kind == "BoundJob" else {}
    try:
        cls("fuzz", **kwargs, **extra)
    except ComponentArgsError as exc:
        first, *lines = str(exc).splitlines()
        assert first == f"{kind} 'fuzz': invalid arguments", str(exc)
        assert lines, str(exc)
        for line in lines:
            assert line.startswith("  "), str(exc)
            named = line.strip().split(":")[0].split(".")[0].split("[")[0].split(" ")[0]
            # an argument given, or one whose default a cross-field rule names (parallelism 1 ...)
            assert named in kwargs or named in MODELS[kind].model_fields or named == "compute_domain", \
                (named, str(exc))


def test_an_internal_field_given_as_a_keyword_is_an_unknown_argument_not_an_override() -> None:
    """BoundJob derives clique_groups from its domain; as a keyword it made a one-clique job
    look like two groups (found by the fuzz above)."""
    msg = _refused(BoundJob, "train", compute_domain=ComputeDomain("cd"), pod_template={"spec": {
        "containers": [CONTAINER]}}, clique_groups=2)
    assert msg.splitlines()[1].startswith("  clique_groups: unknown argument; valid ones are name, kind, pod_template")
    assert "clique_groups," not in msg  # internal: not offered as a valid one


ARGS_FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "args_stack"


@pytest.fixture(scope="module")
def args_project(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> PulumiProject:
    proj = project_from_fixture(ARGS_FIXTURE, tmp_path_factory.mktemp("args") / "proj", kubeconfig=cluster.kubeconfig,
                                venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "run", f"fuzz-{uuid.uuid4().hex[:5]}")
    return proj


@pytest.mark.cluster
@pytest.mark.pulumi
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(call=component_call().filter(lambda c: c[0] != "Nvl72Rack" and json_safe(c[1])))
def test_a_sample_of_the_arguments_through_the_real_cli_never_prints_a_traceback(
        args_project: PulumiProject, call: tuple[str, dict[str, Any]]) -> None:
    """The same draws through `pulumi preview` against the real API server (racks are left out:
    an unobserved rack patches Nodes that do not exist here): refused in one block naming the
    component, or previewed, or failed with the engine's reason; never a Python traceback or a hang.
    A domain or a workload that previews is then `up`: it converges or fails naming why (a
    namespace that does not exist, a kind whose CRD is not installed), and `destroy` leaves
    nothing. (Not a domain awaiting Ready: no agent runs here to make it so, and that wait is its
    timeout, not a hang.)"""
    kind, kwargs = call
    kwargs.pop("observe", None)
    args_project.run("config", "set", "component", kind)
    args_project.run("config", "set", "kwargs", json.dumps(kwargs))
    out = args_project.run("preview", check=False, timeout=180)
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "unhandled exception" not in text, text
    if f"{kind} 'fuzz': invalid arguments" not in text:
        assert out.returncode == 0 or "error:" in text, text
    if out.returncode != 0 or kind not in ("ComputeDomain", "BoundJob") or kwargs.get("await_for") == "Ready":
        return
    try:
        up = args_project.run("up", "--yes", "--skip-preview", check=False, timeout=300)
        text = up.stdout + up.stderr
        assert "Traceback" not in text and "unhandled exception" not in text, text
        assert up.returncode == 0 or "error:" in text, text
    finally:
        down = args_project.run("destroy", "--yes", "--skip-preview", check=False, timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr


ISSUE_49 = [  # (component, kwargs, components declared before it, what the refusal says)
    pytest.param("NvlfabricDriver", {"channels_per_clique": True}, [],
                 "channels_per_clique: Input should be a valid integer, not a boolean (got True) (expected: IMEX "
                 "channels per NVLink clique", id="a-boolean-for-an-integer"),
    pytest.param("ComputeDomain", {"timeout_s": math.inf}, [],
                 "timeout_s: Input should be a finite number (got inf) (expected: seconds a create, update or delete "
                 "may take (a finite number > 0))", id="an-infinite-timeout"),
    pytest.param("Nvl72Rack", {"nodes": ["gb200-r0-n00", "GB200_r0_n01"], "observe": False}, [],
                 "nodes[1]: not a Node name: a Kubernetes Node name is a DNS subdomain: at most 253 characters",
                 id="a-node-name-no-node-has"),
    pytest.param("ComputeDomain", {"name": "hole-b"},
                 [["ComputeDomain", "first", {"name": "hole-a", "spec": {"channelClaim": {"name": "hole-b-channel"}}}]],
                 "name: 'hole-b' makes ResourceClaim default/hole-b-channel, its default channel claim <name>-channel, "
                 "which ComputeDomain 'first' (domain default/hole-a) " + CLAIM_FIX, id="two-domains-on-one-claim"),
]


@pytest.mark.cluster
@pytest.mark.pulumi
@pytest.mark.parametrize("kind, kwargs, before, words", ISSUE_49)
def test_each_refusal_of_issue_49_fails_pulumi_preview_naming_the_component_the_field_and_the_fix(
        args_project: PulumiProject, kind: str, kwargs: dict[str, Any], before: list[Any], words: str) -> None:
    args_project.run("config", "set", "component", kind)
    args_project.run("config", "set", "kwargs", json.dumps(kwargs))  # (inf as JSON's usual Infinity)
    args_project.run("config", "set", "before", json.dumps(before))
    try:
        out = args_project.run("preview", check=False, timeout=180)
    finally:
        args_project.run("config", "rm", "before")
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert f"{kind} 'fuzz': invalid arguments" in text and words in text, text
    assert "Traceback" not in text and "unhandled exception" not in text, text


def json_safe(kwargs: dict[str, Any]) -> bool:
    """Whether the arguments survive JSON (config carries them): no NaN or infinity."""
    try:
        return json.loads(json.dumps(kwargs, allow_nan=False)) == kwargs
    except ValueError:
        return False


@pytest.mark.cluster
def test_a_node_another_rack_label_owns_is_refused_at_preview_naming_the_owner(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: preview was clean and `up` failed with a server-side apply conflict on the label."""
    from lightkube.resources.core_v1 import Node

    from nvlfabric.sim.cluster import delete_nodes, make_ready_nodes

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    by_hand, by_pulumi = f"lbl-{uuid.uuid4().hex[:5]}", f"lbl-{uuid.uuid4().hex[:5]}"
    make_ready_nodes(cluster.client, {by_hand: {}, by_pulumi: {}})
    try:
        cluster.client.patch(Node, by_hand, {"metadata": {"labels": {"nvlfabric.io/rack": "old"}}},
                             field_manager="kubectl-label")
        cluster.client.patch(Node, by_pulumi, {"metadata": {"labels": {"nvlfabric.io/rack": "old"}}},
                             field_manager="pulumi-kubernetes-0a1b2c3d")
        msg = _refused(Nvl72Rack, "rack", name="rack-new", nodes=[by_hand])
        assert msg.splitlines() == ["Nvl72Rack 'rack': invalid arguments", (
            f"  nodes: {by_hand} is already in rack 'old' (label nvlfabric.io/rack, owned by 'kubectl-label'); a node "
            "is in one rack, and `pulumi up` would fail with a field conflict on it: take it out of that rack "
            f"(`kubectl label node {by_hand} nvlfabric.io/rack-` if nothing declares it any more), or name this "
            "rack 'old'")]
        program.reset()
        Nvl72Rack("same", name="old", nodes=[by_hand])  # the rack it is in: nothing to refuse
        Nvl72Rack("renamed", name="rack-new", nodes=[by_pulumi])  # maybe this stack's own: a warning only
    finally:
        delete_nodes(cluster.client, [by_hand, by_pulumi])
