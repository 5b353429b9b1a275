"""The ComputeDomain dynamic provider, called as the engine calls it, on the real API server.

`check` and `diff` are pure and tested on their own. Every other path runs against the real
kube-apiserver with the generated CRD: nothing of the API is faked. Time is a `ManualClock`
(awaits poll the real server but never really sleep), and agents' status reports are written
through the status subresource, as the node agents and the controller will write them. One test
drives the real Pulumi CLI through `tests/fixtures/cd_stack/`.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType
from pulumi.dynamic import ConfigureRequest
from pulumi.dynamic.dynamic import Config
from pulumi.runtime.rpc import UNKNOWN

from nvlfabric.api import computedomain as cdapi
from nvlfabric.api import errors as api_errors
from nvlfabric.api import names
from nvlfabric.codegen import crdgen
from nvlfabric.kube import errors as kube_errors
from nvlfabric.provider import await_, errors, host, nvidiadomain
from nvlfabric.provider.await_ import ManualClock
from nvlfabric.provider.computedomain import (
    CD,
    ComputeDomain,
    ComputeDomainProvider,
    check_inputs,
    claim_users,
    compute_diff,
    in_use_message,
)
from nvlfabric.sim.cluster import eventually
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster

NS = "default"
CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"
FIXTURE = Path(__file__).parents[1] / "fixtures" / "cd_stack"


def inputs(name: str = "train", **kw: Any) -> dict[str, Any]:
    """Checked (normalised) inputs, as the engine hands them to create/update/diff."""
    result = check_inputs({"name": name, "namespace": NS, **kw})
    assert not result.failures, [(f.property, f.reason) for f in result.failures]
    return dict(result.inputs)


# -- check -------------------------------------------------------------------------------------------

INVALID = [
    pytest.param({"name": "Train_1"}, "name", "use a DNS label", id="name"),
    pytest.param({"name": "t", "namespace": "No"}, "namespace", "use the name of a namespace", id="namespace"),
    pytest.param({"name": "t", "spec": {"imexMode": "Shared"}}, "spec.imexMode",
                 "use CliqueScoped (the default) or Dedicated", id="imexMode"),
    pytest.param({"name": "t", "spec": {"numNodes": 0}}, "spec.numNodes", "set a positive number of nodes",
                 id="numNodes"),
    pytest.param({"name": "t", "spec": {"channelAllocationMode": "All"}}, "spec.channelAllocationMode",
                 "requires spec.imexMode: Dedicated", id="all-needs-dedicated"),
    pytest.param({"name": "t", "spec": {"placement": {"clique": "rack-1"}}}, "spec.placement.clique",
                 "'<clusterUUID>.<cliqueID>'", id="clique"),
    pytest.param({"name": "t", "spec": {"channelClaim": {}}}, "spec.channelClaim.name",
                 "spec.channelClaim.name is required: use a DNS subdomain", id="claim-name-missing"),
    pytest.param({"name": "t", "spec": {"imexmode": "Dedicated"}}, "spec.imexmode",
                 "unknown property spec.imexmode; allowed here: channelAllocationMode, numNodes, imexMode", id="typo"),
    pytest.param({"name": "t", "colour": "red"}, "colour", "allowed here: name, namespace, backend, spec",
                 id="unknown-input"),
    pytest.param({"name": "t", "await_for": "Done"}, "await_for", "use 'None', 'Accepted' or 'Ready'", id="await"),
    pytest.param({"name": "t", "timeout_s": 0}, "timeout_s", "positive number", id="timeout"),
    pytest.param({"name": "t", "labels": {"bad key!": "x"}}, 'labels["bad key!"]', "invalid label key", id="label"),
    pytest.param({"name": "t", "labels": {"ok": "-bad"}}, 'labels["ok"]', "invalid label value", id="label-value"),
    pytest.param({"name": "t", "labels": {"app.kubernetes.io/name": 3}}, 'labels["app.kubernetes.io/name"]',
                 "valid string: give a map of label keys to string values", id="label-not-a-string"),
    pytest.param({}, "name", "name is required: use a DNS label", id="name-missing"),
]


@pytest.mark.parametrize(("news", "prop", "fix"), INVALID)
def test_check_names_the_property_and_the_fix(news: dict[str, Any], prop: str, fix: str) -> None:
    failures = ComputeDomainProvider().check({}, news).failures
    assert [f.property for f in failures] == [prop]
    assert fix in failures[0].reason, failures[0].reason


def test_check_normalises_the_spec_and_keeps_the_provider() -> None:
    result = check_inputs({"__provider": "p", "name": "t", "spec": {"numNodes": 2}, "uid": None})
    assert not result.failures
    assert result.inputs == {
        "__provider": "p", "name": "t", "namespace": "default", "backend": "nvlfabric",
        "spec": {"channelAllocationMode": "Single", "numNodes": 2, "imexMode": "CliqueScoped",
                 "placement": {"scope": "SingleClique"}},
        "labels": {}, "await_for": "Accepted", "timeout_s": 600.0, "adopt": False, "force_delete": False,
    }


@pytest.mark.parametrize("news", [
    pytest.param({"name": UNKNOWN, "spec": {}}, id="name"),
    pytest.param({"name": "t", "namespace": UNKNOWN}, id="namespace"),
    pytest.param({"name": "t", "spec": UNKNOWN}, id="whole-spec"),
    pytest.param({"name": "t", "spec": {"numNodes": UNKNOWN}}, id="numNodes"),
    pytest.param({"name": "t", "spec": {"channelAllocationMode": "All", "imexMode": UNKNOWN}}, id="cross-field"),
    pytest.param({"name": "t", "spec": {"channelClaim": {"name": UNKNOWN}}}, id="nested"),
    pytest.param({"name": "t", "labels": {"team": UNKNOWN}}, id="label"),
    pytest.param({"name": "t", "timeout_s": UNKNOWN}, id="timeout"),
])
def test_check_does_not_judge_unknown_values(news: dict[str, Any]) -> None:
    result = check_inputs(news)
    assert result.failures == []
    assert result.inputs == news  # passed through as given: normalising would lose the unknowns


def test_check_still_judges_what_is_known_beside_unknowns() -> None:
    failures = check_inputs({"name": "t", "spec": {"numNodes": UNKNOWN, "imexMode": "Shared"}}).failures
    assert [f.property for f in failures] == ["spec.imexMode"]


# -- diff --------------------------------------------------------------------------------------------


def state(**kw: Any) -> dict[str, Any]:
    """Stored outputs as create leaves them (inputs plus outputs)."""
    outs = inputs(**kw)
    claim = cdapi.channel_claim_name(outs["name"], cdapi.ComputeDomainSpec.model_validate(outs["spec"]))
    outs.update(uid="u1", claim_name=claim, phase="Pending", nodes=[])
    return outs


DIFFS = [
    pytest.param(state(), inputs(), False, [], None, id="no-change"),
    pytest.param({**state(), "spec": {}}, inputs(), False, [], None, id="defaults-filled-is-no-change"),
    pytest.param(state(spec={"numNodes": 2}), inputs(spec={"numNodes": 3}), True, [], None, id="numNodes-update"),
    pytest.param(state(), inputs(labels={"team": "a"}), True, [], None, id="labels-update"),
    pytest.param(state(), inputs(force_delete=True), True, [], None, id="settings-update"),
    pytest.param(state(), inputs(spec={"imexMode": "Dedicated"}), True, ["spec.imexMode"], True, id="imexMode"),
    pytest.param(state(), inputs(spec={"placement": {"clique": CLIQUE}}), True, ["spec.placement"], True,
                 id="placement"),
    pytest.param(state(), inputs(spec={"channelClaim": {"name": "other"}}), True, ["spec.channelClaim"], True,
                 id="claim-name-reuses-cd-name"),
    pytest.param(state(), inputs(name="train2"), True, ["name"], False, id="rename-creates-first"),
    pytest.param(state(spec={"channelClaim": {"name": "shared"}}),
                 inputs(name="train2", spec={"channelClaim": {"name": "shared"}}), True, ["name"], True,
                 id="rename-keeping-the-claim-name-deletes-first"),
    pytest.param(state(), {**inputs(), "namespace": "ml"}, True, ["namespace"], False, id="namespace"),
    pytest.param(state(), {**inputs(), "spec": {**inputs()["spec"], "numNodes": UNKNOWN}}, True, [], None,
                 id="unknown-numNodes-is-an-update"),
    pytest.param(state(), {**inputs(), "spec": {**inputs()["spec"], "imexMode": UNKNOWN}}, True,
                 ["spec.imexMode"], True, id="unknown-imexMode-is-a-replace"),
    pytest.param(state(), {**inputs(), "spec": UNKNOWN}, True,
                 ["spec.channelAllocationMode", "spec.imexMode", "spec.placement", "spec.channelClaim",
                  "spec.imexAuthentication"], True, id="unknown-spec"),
    pytest.param(state(), {**inputs(), "name": UNKNOWN}, True, ["name"], True, id="unknown-name"),
    pytest.param(state(), {**inputs(), "labels": {"a": UNKNOWN}}, True, [], None, id="unknown-label"),
]


@pytest.mark.parametrize(("olds", "news", "changes", "replaces", "dbr"), DIFFS)
def test_diff(olds: dict[str, Any], news: dict[str, Any], changes: bool, replaces: list[str],
              dbr: bool | None) -> None:
    diff = compute_diff(olds, {"__provider": "x", **news})
    assert diff.changes is changes
    assert (diff.replaces or []) == replaces
    assert diff.delete_before_replace is dbr


# -- pure helpers ------------------------------------------------------------------------------------


def test_claim_users_come_from_reserved_for_and_from_pods_not_finished() -> None:
    claim = {"metadata": {"namespace": "ml"},
             "status": {"reservedFor": [{"resource": "pods", "name": "a", "uid": "1"}]}}

    def pod(name: str, claim_name: str, phase: str = "Pending") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml"}, "status": {"phase": phase},
                "spec": {"resourceClaims": [{"name": "ch", "resourceClaimName": claim_name}]}}

    pods = [pod("a", "c"), pod("b", "c"), pod("done", "c", "Succeeded"), pod("other", "x")]
    assert claim_users(claim, pods, "c") == ["ml/a", "ml/b"]


def test_in_use_names_at_most_five_pods() -> None:
    message = in_use_message("ComputeDomain ml/t", "ResourceClaim ml/t-channel", [f"ml/p{i}" for i in range(8)])
    assert message.startswith("ComputeDomain ml/t is still in use: 8 pods use its channel ResourceClaim "
                              "ml/t-channel: ml/p0, ml/p1, ml/p2, ml/p3, ml/p4 and 3 more. Delete the workload first")
    assert "force_delete=True" in message


STATUSES = [
    pytest.param(400, "BadRequest", api_errors.BadRequest, False, id="400"),
    pytest.param(401, "Unauthorized", api_errors.Unauthorized, False, id="401"),
    pytest.param(403, "Forbidden", api_errors.Forbidden, False, id="403"),
    pytest.param(404, "NotFound", api_errors.NotFound, False, id="404"),
    pytest.param(409, "AlreadyExists", api_errors.AlreadyExists, False, id="409-exists"),
    pytest.param(409, "Conflict", api_errors.Conflict, True, id="409-conflict"),
    pytest.param(410, "Expired", api_errors.Gone, True, id="410"),
    pytest.param(422, "Invalid", api_errors.Invalid, False, id="422"),
    pytest.param(429, "TooManyRequests", api_errors.TooManyRequests, True, id="429"),
    pytest.param(418, "Teapot", api_errors.BadRequest, False, id="other-4xx"),
    pytest.param(500, "InternalError", api_errors.ServerError, True, id="500"),
    pytest.param(504, "Timeout", api_errors.Timeout, True, id="504"),
    pytest.param(500, "ServerTimeout", api_errors.Timeout, True, id="server-timeout"),
]


@pytest.mark.parametrize(("code", "reason", "cls", "temporary"), STATUSES)
def test_api_errors_are_chosen_by_status(code: int, reason: str, cls: type[api_errors.ApiStatusError],
                                         temporary: bool) -> None:
    from lightkube.models.meta_v1 import Status, StatusCause, StatusDetails

    status = Status(code=code, reason=reason, message="m" * 1000, details=StatusDetails(
        retryAfterSeconds=3, causes=[StatusCause(field="spec.numNodes", message="c" * 1000)]))
    with pytest.raises(cls) as exc, kube_errors.api_call("create ComputeDomain ml/t"):
        raise ApiError(status=status)
    err = exc.value
    assert type(err) is cls and isinstance(err.__cause__, ApiError)
    assert isinstance(err, api_errors.TemporaryError) is temporary
    assert isinstance(err, api_errors.PermanentError) is not temporary
    assert len(err.message) == api_errors.MAX_PAYLOAD and err.message.endswith("…")
    assert len(err.causes[0].message) == api_errors.MAX_PAYLOAD and err.delay_s == 3
    assert str(err).startswith("create ComputeDomain ml/t: mmm") and str(err).endswith(
        f"({code} {reason}); fields: spec.numNodes")


def test_bodies_that_are_not_a_status_are_not_shown() -> None:
    import httpx2

    request = httpx2.Request("GET", "https://127.0.0.1/apis")
    response = httpx2.Response(502, text="<html>token=secret</html>", request=request)
    with pytest.raises(api_errors.ServerError) as exc, kube_errors.api_call("read ComputeDomain ml/t"):
        raise httpx2.HTTPStatusError("bad gateway", request=request, response=response)
    assert "secret" not in str(exc.value) and "(502 Bad Gateway)" in str(exc.value)
    with pytest.raises(api_errors.Unreachable) as down, kube_errors.api_call("read ComputeDomain ml/t"):
        raise httpx2.ConnectError("connection refused", request=request)
    assert str(down.value) == "read ComputeDomain ml/t: the API server could not be reached: connection refused"


def test_create_with_inputs_that_never_passed_check_fails_like_check() -> None:
    with pytest.raises(errors.InvalidInputs) as exc:
        ComputeDomainProvider().create({"name": "Bad_Name", "spec": {}})
    assert str(exc.value).startswith("invalid ComputeDomain inputs: name: String should match pattern")


def test_provider_pickles_by_reference_without_a_client() -> None:
    import dill  # type: ignore[import-untyped]

    prov = ComputeDomainProvider()
    data = dill.dumps(prov, recurse=True)
    assert b"nvlfabric.provider.computedomain" in data and len(data) < 400
    assert ComputeDomainProvider.serialize_as_secret_always is False


def test_a_provider_from_an_older_state_waits_with_the_defaults() -> None:
    """Until the await settings were class attributes, __init__ set them to None (meaning the
    default), and states hold the provider pickled so."""
    import dill

    old = ComputeDomainProvider()
    old.__dict__.update(kubeconfig=None, clock=None, poll=None, on_progress=None)
    loaded = dill.loads(dill.dumps(old, recurse=True))
    assert loaded.clock is await_.SYSTEM_CLOCK and loaded.poll == await_.POLL and loaded.on_progress is host.progress
    assert loaded.controller_grace_s == nvidiadomain.CONTROLLER_GRACE_S and loaded.kubeconfig is None


# -- against the real API server ---------------------------------------------------------------------


def _established(crd: CustomResourceDefinition) -> bool:
    conds = crd.status.conditions if crd.status and crd.status.conditions else []
    return any(c.type == "Established" and c.status == "True" for c in conds)


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Cluster:
    """The generated CRD applied (idempotently: server-side apply, forced) and Established."""
    client = cluster.client
    client.apply(CustomResourceDefinition.from_dict(crdgen.build()), field_manager="nvlfabric-crdgen", force=True)
    deadline = time.monotonic() + 30
    while not _established(client.get(CustomResourceDefinition, cdapi.CRD_NAME)):
        assert time.monotonic() < deadline, f"CRD {cdapi.CRD_NAME} not Established after 30 s"
        time.sleep(0.1)
    return cluster


@pytest.fixture
def progress() -> list[str]:
    return []


@pytest.fixture
def prov(api: Cluster, progress: list[str]) -> ComputeDomainProvider:
    p = ComputeDomainProvider()
    p.configure(ConfigureRequest(Config({"kubernetes:kubeconfig": str(api.kubeconfig)}, "test")))
    p.clock = ManualClock()
    p.on_progress = progress.append
    return p


def _gone(api: Cluster, res: Any, name: str) -> bool:
    try:
        api.client.get(res, name, namespace=NS)
    except ApiError as exc:
        if exc.status.code == 404:
            return True
        raise
    return False


@pytest.fixture
def name(api: Cluster) -> Iterator[str]:
    """A fresh ComputeDomain name; whatever a test leaves of it (CD, claim, pods) is removed after."""
    n = f"cd-{uuid.uuid4().hex[:8]}"
    yield n
    client = api.client
    for pod in client.list(Pod, namespace=NS, labels={"test-cd": n}):
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod.metadata.name, namespace=NS, grace_period=0)
    with contextlib.suppress(ApiError):
        client.patch(CD, n, {"metadata": {"finalizers": None}}, namespace=NS, patch_type=PatchType.MERGE)
    for res, obj in ((CD, n), (ResourceClaim, f"{n}-channel"), (ResourceClaim, f"{n}-other")):
        with contextlib.suppress(ApiError):
            client.delete(res, obj, namespace=NS)


def _write_status(api: Cluster, name: str, status: dict[str, Any]) -> None:
    """What the controller and agents will do: server-side apply to the status subresource."""
    body = {"apiVersion": cdapi.API_VERSION, "kind": cdapi.KIND, "metadata": {"name": name, "namespace": NS},
            "status": status}
    api.client.apply(CD.Status(body), field_manager="test-controller", force=True)


HALF = {"phase": "Allocating", "observedGeneration": 1, "clique": CLIQUE, "channel": 7,
        "nodes": [{"name": "rack-0-node-01", "ready": True},
                  {"name": "rack-0-node-02", "ready": False, "message": "IMEX daemon not ready"}],
        "readyNodes": 1, "totalNodes": 2}
FULL = {**HALF, "phase": "Ready",
        "nodes": [{"name": "rack-0-node-01", "ready": True}, {"name": "rack-0-node-02", "ready": True}],
        "readyNodes": 2}


@pytest.mark.cluster
def test_create_awaits_accepted_and_makes_the_shared_claim(prov: ComputeDomainProvider, name: str, api: Cluster,
                                                           progress: list[str]) -> None:
    created = prov.create(inputs(name, spec={"numNodes": 2}, labels={"team": "ml"}))
    assert created.id == f"{NS}/{name}"
    outs = created.outs
    assert outs["uid"] and outs["claim_name"] == f"{name}-channel"
    assert (outs["phase"], outs["ready_nodes"], outs["total_nodes"], outs["nodes"]) == ("Pending", 0, 0, [])
    assert outs["spec"]["numNodes"] == 2 and outs["labels"] == {"team": "ml"}
    assert prov.clock is not None and prov.clock.sleeps == [] and progress == []  # Accepted at the first look

    claim = api.client.get(ResourceClaim, f"{name}-channel", namespace=NS).to_dict()
    assert claim["metadata"]["labels"] == {names.COMPUTE_DOMAIN_LABEL: name}
    assert claim["metadata"]["ownerReferences"] == [{"apiVersion": cdapi.API_VERSION, "kind": "ComputeDomain",
                                                     "name": name, "uid": outs["uid"], "controller": True}]
    assert claim["spec"]["devices"]["requests"] == [{"name": "channel", "exactly": {
        "deviceClassName": "imex-channel.nvlfabric.io", "allocationMode": "ExactCount", "count": 1}}]
    assert claim["spec"]["devices"]["config"] == [{"requests": ["channel"], "opaque": {
        "driver": "channel.nvlfabric.io",
        "parameters": {"apiVersion": "nvlfabric.io/v1alpha1", "kind": "ChannelConfig",
                       "computeDomain": {"name": name, "namespace": NS, "uid": outs["uid"]},
                       "imexMode": "CliqueScoped", "channelAllocationMode": "Single"}}}]

    # Nothing changed: the state diffs clean against the same program.
    assert prov.diff(created.id, outs, inputs(name, spec={"numNodes": 2}, labels={"team": "ml"})).changes is False


@pytest.mark.cluster
def test_a_multi_clique_domain_gets_a_claim_per_group_and_goes_with_them(prov: ComputeDomainProvider, name: str,
                                                                          api: Cluster) -> None:
    spec = {"numNodes": 36, "placement": {"scope": "MultiClique", "cliques": 2}}
    created = prov.create(inputs(name, spec=spec))  # awaits Accepted: the domain and its claims exist
    assert created.outs["claim_name"] == f"{name}-channel-0"
    claims = [api.client.get(ResourceClaim, f"{name}-channel-{g}", namespace=NS).to_dict() for g in range(2)]
    assert all(c["metadata"]["annotations"] == {names.CLIQUE_GROUPS_ANNOTATION: "2"} for c in claims)
    with pytest.raises(ApiError):
        api.client.get(ResourceClaim, f"{name}-channel", namespace=NS)
    prov.delete(created.id, created.outs)
    for g in range(2):
        eventually(f"claim {g} to go with its domain", lambda g=g: not list(api.client.list(
            ResourceClaim, namespace=NS, fields={"metadata.name": f"{name}-channel-{g}"})))


@pytest.mark.cluster
def test_all_channels_mode_still_claims_one_device(prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    prov.create(inputs(name, spec={"channelAllocationMode": "All", "imexMode": "Dedicated"}, await_for="None"))
    claim = api.client.get(ResourceClaim, f"{name}-channel", namespace=NS).to_dict()
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    params = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert (params["channelAllocationMode"], params["imexMode"]) == ("All", "Dedicated")


@pytest.mark.cluster
def test_create_over_an_existing_cd_lists_remedies_unless_adopting(prov: ComputeDomainProvider, name: str,
                                                                  api: Cluster) -> None:
    first = prov.create(inputs(name, spec={"numNodes": 2}))
    with pytest.raises(errors.ObjectExists) as exc:
        prov.create(inputs(name, spec={"numNodes": 2}))
    message = str(exc.value)
    assert message.startswith(f"ComputeDomain {NS}/{name} already exists and this stack did not create it")
    for remedy in ("adopt=True", f"kubectl delete computedomain -n {NS} {name}", "choose another name"):
        assert remedy in message
    assert not _gone(api, CD, name)  # never rolled back: it was not ours

    adopted = prov.create(inputs(name, spec={"numNodes": 4}, labels={"owner": "pulumi"}, adopt=True))
    assert adopted.outs["uid"] == first.outs["uid"]
    assert adopted.outs["spec"]["numNodes"] == 4 and adopted.outs["labels"] == {"owner": "pulumi"}

    # An immutable difference cannot be adopted; the server's CEL message names the field and the fix.
    with pytest.raises(api_errors.Invalid) as bad:
        prov.create(inputs(name, spec={"imexMode": "Dedicated"}, adopt=True))
    assert "spec.imexMode is immutable" in str(bad.value) and "delete the ComputeDomain" in str(bad.value)
    assert not _gone(api, CD, name)


@pytest.mark.cluster
@pytest.mark.parametrize(("spec", "error", "fragment"), [
    pytest.param({"numNodes": 0}, api_errors.Invalid, "spec.numNodes", id="invalid-value"),
    pytest.param({"numNodes": 2, "colour": "red"}, api_errors.BadRequest, 'unknown field "spec.colour"',
                 id="unknown-field-strict"),
])
def test_invalid_spec_forced_past_check_is_rejected_by_the_server(prov: ComputeDomainProvider, name: str,
                                                                  api: Cluster, spec: dict[str, Any],
                                                                  error: type[Exception], fragment: str) -> None:
    props = {**inputs(name), "spec": spec}
    with pytest.raises(error) as exc:
        prov.create(props)
    assert fragment in str(exc.value), str(exc.value)
    assert str(exc.value).startswith(f"create ComputeDomain {NS}/{name}: ")
    # The API server's answer (its Status code), not a check of ours; raised without its chain,
    # which the engine would print in full (provider/computedomain.py `_plain_errors`).
    assert isinstance(exc.value, api_errors.ApiStatusError) and exc.value.code in (400, 422)
    assert exc.value.__cause__ is None
    assert _gone(api, CD, name) and _gone(api, ResourceClaim, f"{name}-channel")


@pytest.mark.cluster
def test_create_in_a_missing_namespace_says_what_to_check(prov: ComputeDomainProvider, name: str) -> None:
    with pytest.raises(api_errors.NotFound) as exc:
        prov.create({**inputs(name), "namespace": "no-such-namespace"})
    assert "does namespace no-such-namespace exist?" in str(exc.value)


@pytest.mark.cluster
def test_a_claim_that_cannot_be_created_rolls_the_cd_back(prov: ComputeDomainProvider, name: str,
                                                          api: Cluster) -> None:
    squatter = ResourceClaim.from_dict({"metadata": {"name": f"{name}-channel", "namespace": NS},
                                        "spec": {"devices": {"requests": [{"name": "x", "exactly": {
                                            "deviceClassName": "somebody-else.example.com"}}]}}})
    api.client.create(squatter)
    with pytest.raises(errors.ObjectExists) as exc:
        prov.create(inputs(name))
    assert str(exc.value).startswith(f"ResourceClaim {NS}/{name}-channel already exists and does not belong to "
                                     f"ComputeDomain {NS}/{name}")
    assert "spec.channelClaim.name" in str(exc.value)
    assert exc.value.__notes__ == [f"rolled back: deleted ComputeDomain {NS}/{name}"]
    assert _gone(api, CD, name)
    kept = api.client.get(ResourceClaim, f"{name}-channel", namespace=NS)
    assert kept.spec.devices.requests[0].exactly.deviceClassName == "somebody-else.example.com"


@pytest.mark.cluster
def test_ready_await_reports_what_it_saw_then_succeeds(prov: ComputeDomainProvider, name: str, api: Cluster,
                                                       progress: list[str]) -> None:
    created = prov.create(inputs(name, spec={"numNodes": 2}))
    _write_status(api, name, HALF)
    news = inputs(name, spec={"numNodes": 2}, await_for="Ready", timeout_s=5)
    with pytest.raises(errors.AwaitTimeout) as exc:
        prov.update(created.id, created.outs, news)
    assert str(exc.value) == (
        f"timed out after 5s waiting for ComputeDomain {NS}/{name} to be Ready: phase Allocating; 1 of 2 nodes "
        f"ready; node rack-0-node-02: IMEX daemon not ready; claim {NS}/{name}-channel not allocated yet (no pod "
        "that uses it has been scheduled) (raise timeout_s, or set await_for='Accepted' to not wait for the members)")
    assert prov.clock is not None and sum(prov.clock.sleeps) == 5  # waited 5 s of manual time, none of real time
    assert progress and progress[0].startswith(f"waiting for ComputeDomain {NS}/{name} to be Ready: phase Allocating")

    _write_status(api, name, FULL)
    updated = prov.update(created.id, created.outs, news).outs
    assert (updated["phase"], updated["ready_nodes"], updated["total_nodes"]) == ("Ready", 2, 2)
    assert (updated["clique"], updated["channel"]) == (CLIQUE, 7)
    assert updated["nodes"] == [{"name": "rack-0-node-01", "ready": True}, {"name": "rack-0-node-02", "ready": True}]


@pytest.mark.cluster
def test_ready_await_needs_the_status_of_the_current_generation(prov: ComputeDomainProvider, name: str,
                                                                api: Cluster) -> None:
    created = prov.create(inputs(name, spec={"numNodes": 2}))
    _write_status(api, name, FULL)  # Ready, for generation 1
    news = inputs(name, spec={"numNodes": 3}, await_for="Ready", timeout_s=3)  # generation 2
    with pytest.raises(errors.AwaitTimeout) as exc:
        prov.update(created.id, created.outs, news)
    assert "status is for generation 1, the spec is at generation 2; phase Ready" in str(exc.value)
    assert api.client.get(CD, name, namespace=NS)["spec"]["numNodes"] == 3


@pytest.mark.cluster
def test_create_awaiting_ready_sees_the_agents_report(prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    assert isinstance(prov.clock, ManualClock)
    prov.clock.on_sleep = lambda i: _write_status(api, name, FULL) if i == 1 else None
    outs = prov.create(inputs(name, spec={"numNodes": 2}, await_for="Ready", timeout_s=30)).outs
    assert outs["phase"] == "Ready" and len(prov.clock.sleeps) == 2


@pytest.mark.cluster
def test_create_whose_await_times_out_leaves_nothing(prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    with pytest.raises(errors.AwaitTimeout) as exc:
        prov.create(inputs(name, await_for="Ready", timeout_s=2))
    assert exc.value.__notes__ == [f"rolled back: deleted ResourceClaim {NS}/{name}-channel",
                                   f"rolled back: deleted ComputeDomain {NS}/{name}"]
    assert _gone(api, CD, name) and _gone(api, ResourceClaim, f"{name}-channel")


@pytest.mark.cluster
def test_read_shows_drift_and_rebuilds_inputs(prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    news = inputs(name, spec={"numNodes": 2}, labels={"team": "ml"}, force_delete=True)
    created = prov.create(news)
    api.client.patch(CD, name, {"metadata": {"labels": {"team": "ops", "extra": "x"}}, "spec": {"numNodes": 5}},
                     namespace=NS, patch_type=PatchType.MERGE)
    read = prov.read(created.id, created.outs)
    assert read.id == created.id
    assert read.outs["spec"]["numNodes"] == 5 and read.outs["labels"] == {"team": "ops", "extra": "x"}
    assert read.outs["force_delete"] is True  # settings are not in the cluster; they come from state
    assert read.inputs == {k: read.outs[k] for k in ("name", "namespace", "backend", "spec", "labels", "await_for",
                                                     "timeout_s", "adopt", "force_delete")}
    diff = prov.diff(created.id, read.outs, news)  # the program still says 2 and team=ml: an update
    assert diff.changes is True and not diff.replaces

    updated = prov.update(created.id, read.outs, news).outs
    assert updated["spec"]["numNodes"] == 2 and updated["labels"] == {"team": "ml"}  # extra was dropped
    live = api.client.get(CD, name, namespace=NS)
    assert live["spec"]["numNodes"] == 2 and live["metadata"]["labels"] == {"team": "ml"}


@pytest.mark.cluster
def test_read_of_a_deleted_cd_is_gone(prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    created = prov.create(inputs(name))
    api.client.delete(CD, name, namespace=NS)
    gone = prov.read(created.id, created.outs)
    assert gone.id is None and gone.outs == {}


@pytest.mark.cluster
def test_update_recreates_a_claim_deleted_behind_our_back(prov: ComputeDomainProvider, name: str,
                                                          api: Cluster) -> None:
    created = prov.create(inputs(name))
    api.client.delete(ResourceClaim, f"{name}-channel", namespace=NS)
    prov.update(created.id, created.outs, inputs(name, spec={"numNodes": 1}))
    claim = api.client.get(ResourceClaim, f"{name}-channel", namespace=NS)
    assert claim.metadata.ownerReferences[0].uid == created.outs["uid"]


def _pod_using(api: Cluster, cd_name: str, pod_name: str, claim_name: str) -> None:
    api.client.create(Pod.from_dict({
        "metadata": {"name": pod_name, "namespace": NS, "labels": {"test-cd": cd_name}},
        "spec": {"automountServiceAccountToken": False,
                 "resourceClaims": [{"name": "channel", "resourceClaimName": claim_name}],
                 "containers": [{"name": "c", "image": "example.invalid/worker",
                                 "resources": {"claims": [{"name": "channel"}]}}]}}))


@pytest.mark.cluster
def test_delete_refuses_while_pods_use_the_claim_unless_forced(prov: ComputeDomainProvider, name: str,
                                                               api: Cluster) -> None:
    created = prov.create(inputs(name))
    _pod_using(api, name, f"{name}-worker-0", f"{name}-channel")
    with pytest.raises(errors.InUse) as exc:
        prov.delete(created.id, created.outs)
    assert str(exc.value).startswith(f"ComputeDomain {NS}/{name} is still in use: 1 pod uses its channel "
                                     f"ResourceClaim {NS}/{name}-channel: {NS}/{name}-worker-0. Delete the workload")
    assert not _gone(api, CD, name) and not _gone(api, ResourceClaim, f"{name}-channel")

    prov.delete(created.id, {**created.outs, "force_delete": True})
    assert _gone(api, CD, name) and _gone(api, ResourceClaim, f"{name}-channel")
    prov.delete(created.id, created.outs)  # already gone: not an error


@pytest.mark.cluster
def test_delete_waits_for_finalizers_and_names_them(prov: ComputeDomainProvider, name: str, api: Cluster,
                                                    progress: list[str]) -> None:
    created = prov.create(inputs(name, timeout_s=4))
    api.client.patch(CD, name, {"metadata": {"finalizers": ["nvlfabric.io/test-hold"]}}, namespace=NS,
                     patch_type=PatchType.MERGE)
    with pytest.raises(errors.AwaitTimeout) as exc:
        prov.delete(created.id, created.outs)
    assert str(exc.value) == (
        f"timed out after 4s waiting for ComputeDomain {NS}/{name} and its ResourceClaim {NS}/{name}-channel to be "
        f"deleted: ComputeDomain {NS}/{name} is marked for deletion but still has finalizers nvlfabric.io/test-hold "
        "(the controllers that set them must remove them; remove them by hand only if those controllers are gone)")
    assert _gone(api, ResourceClaim, f"{name}-channel")  # deleted explicitly, not only by the GC

    # Once the finalizer goes, a retried delete completes.
    api.client.patch(CD, name, {"metadata": {"finalizers": None}}, namespace=NS, patch_type=PatchType.MERGE)
    prov.delete(created.id, created.outs)
    assert _gone(api, CD, name)


@pytest.mark.cluster
def test_delete_leaves_a_claim_that_is_not_ours(prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    created = prov.create(inputs(name, spec={"channelClaim": {"name": f"{name}-other"}}, await_for="None"))
    api.client.patch(ResourceClaim, f"{name}-other", {"metadata": {"ownerReferences": None, "labels": None}},
                     namespace=NS, patch_type=PatchType.MERGE)
    prov.delete(created.id, created.outs)
    assert _gone(api, CD, name) and not _gone(api, ResourceClaim, f"{name}-other")


# -- through the real Pulumi CLI ---------------------------------------------------------------------


def _steps(preview: Any) -> dict[str, list[str]]:
    ops: dict[str, list[str]] = {}
    for step in preview["steps"]:
        ops.setdefault(step["urn"].rsplit("::", 1)[1], []).append(step["op"])
    return ops


@pytest.mark.cluster
@pytest.mark.pulumi
def test_up_preview_destroy_through_the_pulumi_cli(api: Cluster, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    suffix = uuid.uuid4().hex[:6]
    cd_name = f"e2e-{suffix}"
    def remove_leftovers() -> None:
        for res, obj in ((CD, cd_name), (ResourceClaim, f"{cd_name}-channel")):
            with contextlib.suppress(ApiError):
                api.client.delete(res, obj, namespace=NS)

    request.addfinalizer(remove_leftovers)
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=api.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "suffix", suffix)

    # An error at up (here a namespace that does not exist) is its message, not a traceback.
    proj.run("config", "set", "namespace", f"no-such-{suffix}")
    failed = proj.run("up", "--yes", "--skip-preview", check=False)
    assert failed.returncode != 0 and "Traceback" not in failed.stdout + failed.stderr, failed.stdout
    assert f'error: create ComputeDomain no-such-{suffix}/{cd_name}: namespaces "no-such-{suffix}" not found' \
        in failed.stdout, failed.stdout
    proj.run("config", "rm", "namespace")

    proj.run("up", "--yes", "--skip-preview")
    outputs = proj.json("stack", "output", "--json")
    assert outputs["claim_name"] == f"{cd_name}-channel" and outputs["phase"] == "Pending" and outputs["uid"]
    live = api.client.get(CD, cd_name, namespace=NS)
    assert live["spec"]["numNodes"] == 2 and live["metadata"]["labels"] == {"team": "e2e"}
    claim = api.client.get(ResourceClaim, f"{cd_name}-channel", namespace=NS)
    assert claim.metadata.ownerReferences[0].uid == outputs["uid"]

    same = proj.run("preview", "--diff")  # the unchanged program diffs clean
    assert "2 unchanged" in same.stdout and "ComputeDomain" not in same.stdout, same.stdout

    proj.run("config", "set", "numNodes", "3")
    update = proj.run("preview", "--diff")
    assert "~ pulumi-python:dynamic/nvlfabric:ComputeDomain: (update)" in update.stdout, update.stdout
    assert "numNodes" in update.stdout and "1 to update" in update.stdout, update.stdout

    proj.run("config", "set", "imexMode", "Dedicated")
    replace = proj.run("preview", "--diff")
    assert "+-pulumi-python:dynamic/nvlfabric:ComputeDomain: (replace)" in replace.stdout, replace.stdout
    assert "imexMode" in replace.stdout and "1 to replace" in replace.stdout, replace.stdout
    assert _steps(proj.json("preview", "--json"))["cd"] == ["replace"]
    old_uid = outputs["uid"]
    proj.run("up", "--yes", "--skip-preview")  # the same name again: only works deleting first
    outputs = proj.json("stack", "output", "--json")
    assert outputs["uid"] != old_uid
    assert api.client.get(CD, cd_name, namespace=NS)["spec"]["imexMode"] == "Dedicated"

    proj.run("destroy", "--yes", "--skip-preview")
    assert _gone(api, CD, cd_name) and _gone(api, ResourceClaim, f"{cd_name}-channel")
    assert proj.json("stack", "export")["deployment"].get("resources") in (None, [])


def test_the_resource_type_token() -> None:
    assert ComputeDomain._resource_type_name == "dynamic/nvlfabric:ComputeDomain"


def test_in_the_dynamic_provider_host_our_errors_are_their_message_and_others_keep_their_traceback() -> None:
    import traceback
    import types

    main = types.SimpleNamespace(_abort_with_traceback=lambda fn: fn, traceback=traceback)
    assert host.install(main) and host.install(main)  # idempotent
    try:
        raise errors.ObjectExists("ComputeDomain default/x exists and this stack did not create it")
    except errors.ObjectExists:
        assert main.traceback.format_exc() == "ComputeDomain default/x exists and this stack did not create it"
    try:
        raise KeyError("a bug")
    except KeyError:
        text = main.traceback.format_exc()
        assert text.startswith("Traceback (most recent call last):") and "KeyError: 'a bug'" in text
    assert main.traceback.print_exc is traceback.print_exc  # the rest of the module is the real one
    assert not host.install(types.SimpleNamespace())  # not the host: nothing to do


@pytest.mark.cluster
def test_a_claim_deleted_out_of_band_shows_on_refresh_and_up_recreates_it_or_says_why_not(
        prov: ComputeDomainProvider, name: str, api: Cluster) -> None:
    """Before: a claim deleted while pods held it stayed 'deleted, allocated, reserved', refresh and
    up said nothing, and the domain silently lost its claim when the pods ended."""
    created = prov.create(inputs(name))
    claim = f"{name}-channel"
    clean = prov.read(created.id, created.outs).outs
    assert clean["claim_drift"] is None and not compute_diff(clean, inputs(name)).changes

    api.client.delete(ResourceClaim, claim, namespace=NS)
    drifted = prov.read(created.id, created.outs).outs
    assert drifted["claim_drift"] == (f"ResourceClaim {NS}/{claim}, the channel claim of ComputeDomain {NS}/{name}, "
                                      "was deleted outside this stack: `pulumi up` creates it anew")
    assert compute_diff(drifted, inputs(name)).changes
    prov.update(created.id, drifted, inputs(name))
    assert not _gone(api, ResourceClaim, claim) and prov.read(created.id, created.outs).outs["claim_drift"] is None

    # Held by a pod (a finalizer stands in for the DRA controller's, which holds an allocated claim).
    api.client.patch(ResourceClaim, claim, {"metadata": {"finalizers": ["nvlfabric.io/test-hold"]}}, namespace=NS,
                     patch_type=PatchType.MERGE)
    _pod_using(api, name, f"{name}-worker-0", claim)
    try:
        api.client.delete(ResourceClaim, claim, namespace=NS)
        held = prov.read(created.id, created.outs).outs
        assert f"was deleted outside this stack and is held by 1 pods until they stop ({NS}/{name}-worker-0)" in \
            held["claim_drift"]
        with pytest.raises(errors.ClaimDeleting) as exc:
            prov.update(created.id, held, inputs(name))
        assert "let them finish (or delete the workload), then run `pulumi up` to create it anew" in str(exc.value)
    finally:
        api.client.patch(ResourceClaim, claim, {"metadata": {"finalizers": None}}, namespace=NS,
                         patch_type=PatchType.MERGE)
