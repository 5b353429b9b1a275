"""The DeviceClass dynamic provider, called directly as the engine would, on the real API server."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import DeviceClass
from pulumi.dynamic import ConfigureRequest
from pulumi.dynamic.dynamic import Config

from nvlfabric.provider import errors
from nvlfabric.provider.deviceclass import DeviceClassProvider
from tests.conftest import Cluster

SELECTOR = 'device.driver == "channel.nvlfabric.io"'


@pytest.fixture
def prov(cluster: Cluster) -> DeviceClassProvider:
    p = DeviceClassProvider()
    p.configure(ConfigureRequest(Config({"kubernetes:kubeconfig": str(cluster.kubeconfig)}, "test")))
    return p


@pytest.fixture
def name(cluster: Cluster) -> Iterator[str]:
    n = f"dc-{uuid.uuid4().hex[:6]}.nvlfabric.io"
    yield n
    with contextlib.suppress(ApiError):
        cluster.client.delete(DeviceClass, n)


@pytest.mark.parametrize(
    ("inputs", "prop", "fragment"),
    [
        pytest.param({"name": "Not_A_DNS_Name"}, "name", "use a DNS subdomain", id="bad-name"),
        pytest.param({"name": "ok.example", "selectors": "x"}, "selectors", "list", id="selectors-not-a-list"),
        pytest.param({"name": "ok.example", "colour": "red"}, "colour", "unknown property", id="unknown-prop"),
        pytest.param({}, "name", "Field required", id="missing-name"),
    ],
)
def test_check_names_the_property_and_the_fix(inputs: dict[str, object], prop: str, fragment: str) -> None:
    failures = DeviceClassProvider().check({}, inputs).failures
    assert failures, "expected a failure"
    assert failures[0].property == prop
    assert fragment in failures[0].reason


@pytest.mark.cluster
def test_create_read_update_delete(prov: DeviceClassProvider, name: str, cluster: Cluster) -> None:
    created = prov.create({"name": name, "selectors": [SELECTOR], "labels": {}, "adopt": False})
    assert created.id == name and created.outs["uid"]
    read = prov.read(name, created.outs)
    assert read.outs["selectors"] == [SELECTOR]
    assert prov.diff(name, read.outs, {"name": name, "selectors": [SELECTOR], "labels": {}}).changes is False

    news = {"name": name, "selectors": [SELECTOR, 'device.driver != ""'], "labels": {"a": "b"}}
    diff = prov.diff(name, read.outs, news)
    assert diff.changes is True and not diff.replaces
    updated = prov.update(name, read.outs, news)
    assert updated.outs["labels"] == {"a": "b"}
    assert cluster.client.get(DeviceClass, name).metadata.labels == {"a": "b"}

    prov.delete(name, updated.outs)
    gone = prov.read(name, updated.outs)
    assert gone.id is None and gone.outs == {}
    prov.delete(name, updated.outs)  # already gone: not an error


@pytest.mark.cluster
def test_create_over_an_existing_object_needs_adopt(prov: DeviceClassProvider, name: str) -> None:
    prov.create({"name": name, "selectors": [SELECTOR]})
    with pytest.raises(errors.ObjectExists) as excinfo:
        prov.create({"name": name, "selectors": [SELECTOR]})
    assert "already exists" in str(excinfo.value) and "adopt=True" in str(excinfo.value)
    adopted = prov.create({"name": name, "selectors": [SELECTOR, "true"], "adopt": True})
    assert adopted.outs["selectors"] == [SELECTOR, "true"]


def test_renaming_is_a_delete_before_replace() -> None:
    diff = DeviceClassProvider().diff("a.x", {"name": "a.x", "selectors": []}, {"name": "b.x", "selectors": []})
    assert diff.replaces == ["name"] and diff.delete_before_replace is True
