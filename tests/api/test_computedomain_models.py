"""The ComputeDomain API (nvlfabric.io/v1alpha1): the models, the generated CRD, and the real API server.

The pydantic models are the one source of the schema, so the tests hold three things together:
the checked-in CRD is what the models generate; the models accept and reject what they should
(property tests); and the real kube-apiserver, given the generated CRD, accepts and rejects the
same objects, applies the same defaults, enforces the CEL immutability rules, and lets node agents
own their own `status.nodes` entries through server-side apply.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lightkube import ApiError
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType
from pydantic import BaseModel, ValidationError

from nvlfabric.api import computedomain as cdapi
from nvlfabric.api import names as contract
from nvlfabric.api.computedomain import (
    ComputeDomain,
    ComputeDomainSpec,
    ComputeDomainStatus,
    NodeStatus,
    condition,
    immutable_changes,
    immutable_message,
    node_status_apply,
)
from nvlfabric.codegen import crdgen
from tests.conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
REGENERATE = f"run `python -m nvlfabric.codegen.crdgen > {crdgen.MANIFEST}`"
NAMESPACE = "default"

# -- strategies ------------------------------------------------------------------------------------

dns_labels = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", fullmatch=True)
short_labels = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z", fullmatch=True)
claim_names = st.lists(short_labels, min_size=1, max_size=4).map(".".join)
cliques = st.builds(lambda u, n: f"{u}.{n}", st.uuids().map(str), st.integers(0, 2**32 - 1))
placements = st.one_of(
    st.fixed_dictionaries({}, optional={"scope": st.just("SingleClique"), "clique": cliques}),
    st.fixed_dictionaries({"scope": st.just("MultiClique"),
                           "cliques": st.integers(2, contract.MAX_CLIQUES_PER_DOMAIN)}))


def _consistent(spec: dict[str, Any]) -> dict[str, Any]:
    k = (spec.get("placement") or {}).get("cliques")
    if k is not None:  # MultiClique: the shared IMEX domains, and numNodes a whole number per clique
        spec.pop("channelAllocationMode", None)
        spec.pop("imexMode", None)
        if "numNodes" in spec:
            spec["numNodes"] = k * (spec["numNodes"] % contract.NODES_PER_CLIQUE + 1)
    elif "numNodes" in spec:
        spec["numNodes"] = (spec["numNodes"] - 1) % contract.NODES_PER_CLIQUE + 1
    if spec.get("channelAllocationMode") == "All":
        spec["imexMode"] = "Dedicated"
    return spec


valid_specs = st.fixed_dictionaries(
    {},
    optional={
        "channelAllocationMode": st.sampled_from([m.value for m in cdapi.ChannelAllocationMode]),
        "numNodes": st.integers(1, 10**6),
        "imexMode": st.sampled_from([m.value for m in cdapi.IMEXMode]),
        "placement": placements,
        "channelClaim": st.fixed_dictionaries({"name": claim_names}),
    },
).map(_consistent)


def _cd(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": cdapi.API_VERSION, "kind": cdapi.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _error_locs(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in err["loc"]) for err in exc.errors()]


# -- (a) the checked-in CRD is current, and structural ----------------------------------------------


def test_checked_in_crd_is_current() -> None:
    path = REPO / crdgen.MANIFEST
    assert path.exists(), f"{crdgen.MANIFEST} is missing: {REGENERATE}"
    if path.read_text(encoding="utf-8") != crdgen.render():
        pytest.fail(f"{crdgen.MANIFEST} is stale (the models changed): {REGENERATE}")


def _walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crdgen.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_generated_schema_is_structural_and_described() -> None:
    for path, node in _walk(_schema()):
        assert "type" in node, f"{path or '<root>'} has no type"
        assert not node.keys() & {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const", "nullable"}, path
        assert node.get("additionalProperties") is not False, path
        assert "default" not in node or node["default"] is not None, path
        if path.startswith((".spec", ".status")) or path == "":
            assert node.get("description"), f"{path or '<root>'} has no description"
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in item.get("required", []) or "default" in item["properties"][key], (
                    f"{path}: list-map key {key} must be required or defaulted")


def test_schema_decisions() -> None:
    assert f"{contract.GROUP}/{cdapi.VERSION}" == cdapi.API_VERSION
    props = _schema()["properties"]
    spec, status = props["spec"]["properties"], props["status"]["properties"]
    assert props["metadata"] == {"type": "object", "properties": {"name": {
        "type": "string", "maxLength": 63, "pattern": contract.DNS_LABEL}}}
    assert spec["channelAllocationMode"]["enum"] == ["Single", "All"]
    assert spec["channelAllocationMode"]["default"] == "Single"
    assert spec["imexMode"]["enum"] == ["CliqueScoped", "Dedicated"]
    assert spec["imexMode"]["default"] == "CliqueScoped"
    assert spec["placement"]["default"] == {}
    assert spec["placement"]["properties"]["scope"] == {**spec["placement"]["properties"]["scope"],
                                                         "enum": ["SingleClique", "MultiClique"],
                                                         "default": "SingleClique"}
    assert spec["numNodes"]["minimum"] == 1 and "default" not in spec["numNodes"]
    assert props["spec"]["default"] == {}
    for field in ("channelAllocationMode", "imexMode", "placement"):
        rules = spec[field]["x-kubernetes-validations"]
        assert rules == [{"rule": "self == oldSelf", "message": immutable_message(field, cdapi._WHY[field])}]
    assert "x-kubernetes-validations" not in spec["numNodes"]
    assert status["phase"]["enum"] == [p.value for p in cdapi.Phase]
    assert status["nodes"]["x-kubernetes-list-type"] == "map"
    assert status["nodes"]["x-kubernetes-list-map-keys"] == ["name"]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert status["channel"]["maximum"] == 2047
    version = crdgen.build()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "Clique", "Channel", "Cliques", "Ready", "Nodes", "Unhealthy", "Lost", "IMEX", "Age"]


def test_crdgen_refuses_unions() -> None:
    class Bad(BaseModel):
        x: int | str

    with pytest.raises(crdgen.SchemaError, match=r"\.x: a union of 2 types"):
        crdgen.structural(Bad.model_json_schema(), {})


def test_crdgen_main_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main([str(tmp_path / "crds" / "cd.yaml")]) == 0
    assert (tmp_path / "crds" / "cd.yaml").read_text() == crdgen.render()
    capsys.readouterr()
    assert crdgen.main([]) == 0
    assert capsys.readouterr().out == crdgen.render()


# -- (b) model validation, property-tested ----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(name=dns_labels, spec=valid_specs)
def test_valid_specs_round_trip(name: str, spec: dict[str, Any]) -> None:
    cd = ComputeDomain.model_validate(_cd(name, spec))
    out = cd.to_kube()
    assert ComputeDomain.model_validate(out) == cd
    for key, value in spec.items():
        if key == "placement":
            assert out["spec"]["placement"] == {"scope": "SingleClique", **value}
        else:
            assert out["spec"][key] == value
    assert out["spec"]["channelAllocationMode"] == spec.get("channelAllocationMode", "Single")
    assert out["spec"]["imexMode"] == spec.get("imexMode", "CliqueScoped")
    assert "status" not in out
    expected_claim = spec["channelClaim"]["name"] if "channelClaim" in spec else f"{name}-channel"
    assert cd.channel_claim_name == expected_claim
    k = spec.get("placement", {}).get("cliques")
    assert cdapi.channel_claim_names(name, cd.spec) == (
        [expected_claim] if k is None else [f"{expected_claim}-{g}" for g in range(k)])


def _not_dns_label(s: str) -> bool:
    return len(s) > 63 or re.fullmatch(contract.DNS_LABEL, s) is None


@settings(max_examples=60, deadline=None)
@given(name=st.one_of(st.text(max_size=80), dns_labels.map(lambda s: s + "." + s), st.just("x" * 64)
                      ).filter(_not_dns_label))
def test_invalid_names_rejected(name: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ComputeDomain.model_validate(_cd(name, {}))
    assert _error_locs(exc.value) == ["metadata.name"]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_invalid_spec_values_rejected_naming_the_field(data: st.DataObject) -> None:
    field, value = data.draw(st.one_of(
        st.tuples(st.just("numNodes"), st.integers(max_value=0)),
        st.tuples(st.just("channelAllocationMode"), st.text().filter(lambda s: s not in ("Single", "All"))),
        st.tuples(st.just("imexMode"), st.text().filter(lambda s: s not in ("CliqueScoped", "Dedicated"))),
        st.tuples(st.just("placement.scope"), st.text().filter(lambda s: s not in ("SingleClique", "MultiClique"))),
        st.tuples(st.just("placement.clique"), st.text().filter(lambda s: re.fullmatch(contract.CLIQUE, s) is None)),
        st.tuples(st.just("channelClaim.name"),
                  st.text().filter(lambda s: len(s) > 253 or re.fullmatch(contract.DNS_SUBDOMAIN, s) is None)),
    ))
    spec: dict[str, Any] = {}
    head, _, tail = field.partition(".")
    spec[head] = {tail: value} if tail else value
    with pytest.raises(ValidationError) as exc:
        ComputeDomain.model_validate(_cd("cd", spec))
    assert _error_locs(exc.value) == [f"spec.{field}"]


@settings(max_examples=30, deadline=None)
@given(key=st.from_regex(r"\A[a-zA-Z][a-zA-Z0-9]{0,15}\Z", fullmatch=True).filter(
    lambda k: k not in {f.alias or n for n, f in ComputeDomainSpec.model_fields.items()}
    and k not in ComputeDomainSpec.model_fields))
def test_unknown_spec_fields_rejected(key: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ComputeDomain.model_validate(_cd("cd", {key: 1}))
    assert _error_locs(exc.value) == [f"spec.{key}"]
    assert exc.value.errors()[0]["type"] == "extra_forbidden"


def test_all_channels_need_a_dedicated_imex_domain() -> None:
    with pytest.raises(ValidationError, match=r"channelAllocationMode: All requires spec\.imexMode: Dedicated"):
        ComputeDomainSpec.model_validate({"channelAllocationMode": "All"})
    assert ComputeDomainSpec.model_validate({"channelAllocationMode": "All", "imexMode": "Dedicated"})


@settings(max_examples=60, deadline=None)
@given(old=valid_specs, new=valid_specs, num_nodes=st.none() | st.integers(1, 100))
def test_immutable_changes(old: dict[str, Any], new: dict[str, Any], num_nodes: int | None) -> None:
    a, b = ComputeDomainSpec.model_validate(old), ComputeDomainSpec.model_validate(new)
    changed = immutable_changes(a, b)
    assert set(changed) <= set(cdapi.IMMUTABLE_FIELDS)
    for field in cdapi.IMMUTABLE_FIELDS:
        attr = next(n for n, f in ComputeDomainSpec.model_fields.items() if (f.alias or n) == field)
        assert (field in changed) == (getattr(a, attr) != getattr(b, attr))
    assert immutable_changes(a, a.model_copy(update={"num_nodes": num_nodes})) == []


@settings(max_examples=40, deadline=None)
@given(channel=st.integers().filter(lambda c: not 0 <= c <= contract.MAX_CHANNEL))
def test_status_channel_range(channel: int) -> None:
    with pytest.raises(ValidationError) as exc:
        ComputeDomainStatus.model_validate({"channel": channel})
    assert _error_locs(exc.value) == ["channel"]


def test_status_tolerates_newer_fields() -> None:
    status = ComputeDomainStatus.model_validate({"nodes": [{"name": "n1", "futureField": 1}], "futureTop": {}})
    assert status.nodes == [NodeStatus(name="n1")]


# -- (c) the real API server -------------------------------------------------------------------------

CD = create_namespaced_resource(contract.GROUP, cdapi.VERSION, cdapi.KIND, cdapi.PLURAL)


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
def names(api: Cluster) -> Iterator[list[str]]:
    """Collects the ComputeDomains a test creates and deletes them afterwards."""
    created: list[str] = []
    yield created
    for name in created:
        with contextlib.suppress(ApiError):
            api.client.delete(CD, name, namespace=NAMESPACE)


def _create(api: Cluster, names: list[str], spec: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    name = f"cd-{uuid.uuid4().hex[:8]}"
    if not dry_run:
        names.append(name)
    body = ComputeDomain.model_validate(_cd(name, spec)).to_kube()
    return dict(api.client.create(CD(body), dry_run=dry_run))


def _rejected(fn: Any) -> str:
    with pytest.raises(ApiError) as exc:
        fn()
    assert exc.value.status.code == 422, exc.value.status
    return str(exc.value.status.message)


@pytest.mark.cluster
def test_crd_established_with_printer_columns(api: Cluster) -> None:
    crd = api.client.get(CustomResourceDefinition, cdapi.CRD_NAME)
    version = crd.spec.versions[0]
    assert crd.spec.names.shortNames == ["cd"]
    assert version.subresources is not None and version.subresources.status is not None
    columns = {c.name: c.jsonPath for c in version.additionalPrinterColumns or []}
    assert columns == {"Phase": ".status.phase", "Clique": ".status.clique", "Channel": ".status.channel",
                       "Cliques": ".status.placedCliques",
                       "Ready": ".status.readyNodes", "Nodes": ".status.totalNodes",
                       "Unhealthy": ".status.unhealthyNodes", "Lost": ".status.lostNodes[*].name",
                       "IMEX": ".spec.imexMode",
                       "Age": ".metadata.creationTimestamp"}


@pytest.mark.cluster
def test_minimal_cd_gets_the_models_defaults(api: Cluster, names: list[str]) -> None:
    obj = _create(api, names, {})
    assert obj["spec"] == ComputeDomainSpec().model_dump(mode="json", exclude_none=True)
    assert obj["spec"] == {"channelAllocationMode": "Single", "imexMode": "CliqueScoped",
                           "placement": {"scope": "SingleClique"}}
    assert ComputeDomain.model_validate(obj).metadata.name == names[0]


@pytest.mark.cluster
@settings(max_examples=15, deadline=None)
@given(spec=valid_specs)
def test_server_accepts_what_the_model_accepts(api: Cluster, spec: dict[str, Any]) -> None:
    obj = _create(api, [], spec, dry_run=True)
    assert obj["spec"] == ComputeDomainSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)


@pytest.mark.cluster
def test_null_means_absent(api: Cluster, names: list[str]) -> None:
    """Optional fields are not `nullable`: the server prunes a null, as the models treat None."""
    body = _cd(f"cd-{uuid.uuid4().hex[:8]}", {"numNodes": None, "placement": {"clique": None}})
    obj = api.client.create(CD(body), dry_run=True)
    assert obj["spec"] == {"channelAllocationMode": "Single", "imexMode": "CliqueScoped",
                           "placement": {"scope": "SingleClique"}}


INVALID = [
    pytest.param({"numNodes": 0}, "spec.numNodes", "greater than or equal to 1", id="numNodes-0"),
    pytest.param({"channelAllocationMode": "Many"}, "spec.channelAllocationMode", "Unsupported value", id="mode"),
    pytest.param({"imexMode": "Shared"}, "spec.imexMode", "Unsupported value", id="imexMode"),
    pytest.param({"placement": {"scope": "Everywhere"}}, "spec.placement.scope", "Unsupported value",
                 id="scope"),
    pytest.param({"placement": {"scope": "MultiClique"}}, "spec", cdapi.MULTI_NEEDS_CLIQUES_MESSAGE,
                 id="multi-without-cliques"),
    pytest.param({"placement": {"cliques": 2}}, "spec", cdapi.MULTI_NEEDS_CLIQUES_MESSAGE, id="cliques-single"),
    pytest.param({"numNodes": 19}, "spec", "is more nodes than one NVL72 clique has (18)",
                 id="numNodes-19"),
    pytest.param({"numNodes": 72, "placement": {"scope": "MultiClique", "cliques": 5}}, "spec",
                 "must split evenly over spec.placement.cliques", id="uneven"),
    pytest.param({"numNodes": 40, "placement": {"scope": "MultiClique", "cliques": 2}}, "spec",
                 "at most 18 nodes (one NVL72 rack) per clique", id="over-a-rack"),
    pytest.param({"imexMode": "Dedicated", "placement": {"scope": "MultiClique", "cliques": 2}}, "spec",
                 cdapi.MULTI_CLIQUE_SCOPED_MESSAGE, id="multi-dedicated"),
    pytest.param({"placement": {"scope": "MultiClique", "cliques": 65}}, "spec.placement.cliques",
                 "less than or equal to 64", id="cliques-65"),
    pytest.param({"placement": {"clique": "rack-1"}}, "spec.placement.clique", "should match", id="clique"),
    pytest.param({"channelClaim": {"name": "Bad_Name"}}, "spec.channelClaim.name", "should match", id="claim"),
    pytest.param({"channelClaim": {}}, "spec.channelClaim.name", "Required value", id="claim-no-name"),
    pytest.param({"channelAllocationMode": "All"}, "spec", cdapi.ALL_NEEDS_DEDICATED_MESSAGE, id="all-shared"),
    pytest.param({"imexAuthentication": "TLS"}, "spec", cdapi.TLS_NEEDS_DEDICATED_MESSAGE, id="tls-shared"),
    pytest.param({"imexMode": "Dedicated", "imexAuthentication": "Kerberos"}, "spec.imexAuthentication",
                 "Unsupported value", id="tls-kind"),
]


@pytest.mark.cluster
@pytest.mark.parametrize(("spec", "field", "fragment"), INVALID)
def test_server_rejects_invalid_specs(api: Cluster, spec: dict[str, Any], field: str, fragment: str) -> None:
    body = _cd(f"cd-{uuid.uuid4().hex[:8]}", spec)
    message = _rejected(lambda: api.client.create(CD(body), dry_run=True))
    assert f"{field}: " in message and fragment in message, message
    with pytest.raises(ValidationError) as exc:  # and the model agrees
        ComputeDomain.model_validate(body)
    assert field in _error_locs(exc.value) or (field == "spec" and fragment.split(" (")[0][:40] in str(exc.value))


@pytest.mark.cluster
@pytest.mark.parametrize("name", ["has.dots", "x" * 64, "Upper"])
def test_server_rejects_names_that_are_not_dns_labels(api: Cluster, name: str) -> None:
    message = _rejected(lambda: api.client.create(CD(_cd(name, {})), dry_run=True))
    assert "metadata.name" in message, message


@pytest.mark.cluster
def test_immutable_fields(api: Cluster, names: list[str]) -> None:
    obj = _create(api, names, {"numNodes": 2, "imexMode": "Dedicated",
                               "channelClaim": {"name": "claim-a"}})
    name = obj["metadata"]["name"]

    def patch(spec: dict[str, Any]) -> dict[str, Any]:
        return dict(api.client.patch(CD, name, {"spec": spec}, namespace=NAMESPACE, patch_type=PatchType.MERGE))

    changes: list[tuple[str, dict[str, Any]]] = [
        ("channelAllocationMode", {"channelAllocationMode": "All"}),
        ("imexMode", {"imexMode": "CliqueScoped"}),
        ("placement", {"placement": {"clique": "9f410827-489f-46fd-8203-51266ca08eb7.32766"}}),
        ("channelClaim", {"channelClaim": {"name": "claim-b"}}),
        ("channelClaim", {"channelClaim": None}),
        ("imexAuthentication", {"imexAuthentication": "TLS"}),
    ]
    for field, change in changes:
        with pytest.raises(ApiError) as exc:
            patch(change)
        assert exc.value.status.code == 422, exc.value.status
        assert immutable_message(field, cdapi._WHY[field]) in str(exc.value.status.message), exc.value.status
    assert patch({"numNodes": 5})["spec"]["numNodes"] == 5
    assert "numNodes" not in patch({"numNodes": None})["spec"]


@pytest.mark.cluster
def test_channel_claim_cannot_be_added_later(api: Cluster, names: list[str]) -> None:
    name = _create(api, names, {})["metadata"]["name"]
    message = _rejected(lambda: api.client.patch(CD, name, {"spec": {"channelClaim": {"name": "late"}}},
                                                 namespace=NAMESPACE, patch_type=PatchType.MERGE))
    assert immutable_message("channelClaim", cdapi._WHY["channelClaim"]) in message


def _apply_node(api: Cluster, cd_name: str, node: NodeStatus, *, manager: str | None = None,
                force: bool = False) -> dict[str, Any]:
    body = node_status_apply(cd_name, NAMESPACE, node)
    return dict(api.client.apply(CD.Status(body), field_manager=manager or f"nvlfabric-node/{node.name}",
                                 force=force))


def _owned_node_keys(obj: dict[str, Any], manager: str) -> set[str]:
    keys: set[str] = set()
    for entry in obj["metadata"].get("managedFields", []):
        if entry["manager"] == manager and entry.get("subresource") == "status":
            nodes = entry["fieldsV1"].get("f:status", {}).get("f:nodes", {})
            keys |= {k for k in nodes if k.startswith("k:")}
    return keys


@pytest.mark.cluster
def test_node_agents_own_their_own_status_entries(api: Cluster, names: list[str]) -> None:
    name = _create(api, names, {})["metadata"]["name"]
    clique = "9f410827-489f-46fd-8203-51266ca08eb7.32766"
    _apply_node(api, name, NodeStatus(name="node-a", address="10.0.0.1", clique=clique))
    obj = _apply_node(api, name, NodeStatus(name="node-b", address="10.0.0.2", clique=clique, ready=True))
    assert [n["name"] for n in obj["status"]["nodes"]] == ["node-a", "node-b"]
    assert _owned_node_keys(obj, "nvlfabric-node/node-a") == {'k:{"name":"node-a"}'}
    assert _owned_node_keys(obj, "nvlfabric-node/node-b") == {'k:{"name":"node-b"}'}

    # Each agent updates its own entry without conflict and without touching the other's.
    obj = _apply_node(api, name, NodeStatus(name="node-a", address="10.0.0.1", clique=clique, ready=True))
    by_name = {n["name"]: n for n in obj["status"]["nodes"]}
    assert by_name["node-a"]["ready"] is True and by_name["node-b"]["address"] == "10.0.0.2"

    # A controller writes the summary with its own manager: no conflict with the node entries.
    summary = {"apiVersion": cdapi.API_VERSION, "kind": cdapi.KIND,
               "metadata": {"name": name, "namespace": NAMESPACE},
               "status": {"phase": "Ready", "clique": clique, "channel": 7, "readyNodes": 2, "totalNodes": 2,
                          "observedGeneration": 1,
                          "conditions": [condition(cdapi.ConditionType.READY, cdapi.ConditionStatus.TRUE,
                                                   "MembersReady", "2 of 2 members ready", generation=1)
                                         .model_dump(mode="json", by_alias=True, exclude_none=True)]}}
    obj = dict(api.client.apply(CD.Status(summary), field_manager="nvlfabric-controller"))
    assert len(obj["status"]["nodes"]) == 2 and obj["status"]["channel"] == 7

    # Ownership is per entry: node-a may not overwrite node-b's entry (409 naming node-b's manager).
    with pytest.raises(ApiError) as exc:
        _apply_node(api, name, NodeStatus(name="node-b", address="10.9.9.9"), manager="nvlfabric-node/node-a")
    assert exc.value.status.code == 409 and "nvlfabric-node/node-b" in str(exc.value.status.message)

    # An agent that leaves applies without its entry; only its own entry goes.
    api.client.apply(CD.Status({**summary, "status": {}}), field_manager="nvlfabric-node/node-b")
    obj = dict(api.client.get(CD, name, namespace=NAMESPACE))
    assert [n["name"] for n in obj["status"]["nodes"]] == ["node-a"]
    assert obj["spec"]["imexMode"] == "CliqueScoped"  # status writes never touch spec
    parsed = ComputeDomain.model_validate(obj)
    assert parsed.status is not None and parsed.status.phase is cdapi.Phase.READY
    assert [(c.type, c.status, c.observed_generation) for c in parsed.status.conditions] == [
        ("Ready", cdapi.ConditionStatus.TRUE, 1)]


@pytest.mark.cluster
def test_table_shows_the_printer_columns(api: Cluster, names: list[str]) -> None:
    name = _create(api, names, {"imexMode": "Dedicated"})["metadata"]["name"]
    api.client.apply(CD.Status({"apiVersion": cdapi.API_VERSION, "kind": cdapi.KIND,
                                "metadata": {"name": name, "namespace": NAMESPACE},
                                "status": {"phase": "Degraded", "channel": 3, "readyNodes": 1, "totalNodes": 4,
                                           "unhealthyNodes": ["rack-0-node-01"]}}),
                     field_manager="nvlfabric-controller")
    http = client_adapter.Client(KubeConfig.from_file(str(api.kubeconfig)).get(), client_adapter.ConnectionParams())
    with http:
        resp = http.get(f"/apis/{contract.GROUP}/{cdapi.VERSION}/namespaces/{NAMESPACE}/{cdapi.PLURAL}/{name}",
                        headers={"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"})
    resp.raise_for_status()
    table = resp.json()
    header = [c["name"] for c in table["columnDefinitions"]]
    assert header == ["Name", "Phase", "Clique", "Channel", "Cliques", "Ready", "Nodes", "Unhealthy", "Lost", "IMEX",
                      "Age"]
    row = dict(zip(header, table["rows"][0]["cells"], strict=True))
    assert row["Name"] == name and row["Phase"] == "Degraded" and row["Channel"] == 3
    assert row["Unhealthy"] == '["rack-0-node-01"]'
    assert (row["Ready"], row["Nodes"], row["IMEX"], row["Clique"]) == (1, 4, "Dedicated", None)
