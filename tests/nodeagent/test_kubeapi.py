"""The node agent's own API client (nvlfabric/nodeagent/kubeapi.py): credentials it refuses with a clear
message, and the calls it makes, against the real API server."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import yaml

from nvlfabric.api import errors
from nvlfabric.nodeagent import kubeapi
from tests.conftest import Cluster


def _kubeconfig(cluster: Cluster) -> dict[str, object]:
    return yaml.safe_load(cluster.kubeconfig.read_text())  # type: ignore[no-any-return]


def test_unusable_kubeconfigs_are_refused_naming_the_file_and_the_part(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(kubeapi.ConfigError, match=f"kubeconfig {missing}: cannot read it"):
        kubeapi.from_kubeconfig(missing)
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(kubeapi.ConfigError, match="no current-context and no contexts"):
        kubeapi.from_kubeconfig(empty)
    dangling = tmp_path / "dangling"
    dangling.write_text(yaml.safe_dump({"current-context": "c", "contexts": [
        {"name": "c", "context": {"cluster": "k", "user": "u"}}], "clusters": [], "users": []}))
    with pytest.raises(kubeapi.ConfigError, match="no cluster named 'k'"):
        kubeapi.from_kubeconfig(dangling)


def test_in_cluster_config_needs_the_service_env_and_the_token(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(kubeapi.ConfigError, match=r"\$KUBERNETES_SERVICE_HOST"):
        kubeapi.from_service_account(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(kubeapi.ConfigError, match="automountServiceAccountToken"):
        kubeapi.from_service_account(tmp_path)
    (tmp_path / "token").write_text("t")
    assert kubeapi.from_service_account(tmp_path).server == "https://10.0.0.1:443"


def test_paths_quote_names_and_know_the_core_group() -> None:
    assert kubeapi.path("v1", "nodes", "n1", subresource="status") == "/api/v1/nodes/n1/status"
    assert kubeapi.path("resource.k8s.io/v1", "resourceclaims", "a b", namespace="ns") == \
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a%20b"


@pytest.mark.cluster
def test_calls_against_the_api_server(cluster: Cluster) -> None:
    client = kubeapi.Client(kubeapi.from_kubeconfig(cluster.kubeconfig), field_manager="kubeapi-test")
    try:
        with pytest.raises(errors.ApiStatusError) as err:
            client.get(kubeapi.path("v1", "configmaps", "does-not-exist", namespace="default"))
        assert err.value.code == 404 and "does-not-exist" in err.value.message
        name = f"kubeapi-{uuid.uuid4().hex[:6]}"
        cms = kubeapi.path("v1", "configmaps", namespace="default")
        client.create(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "labels": {"t": name}}, "data": {"a": "1"}})
        client.patch(kubeapi.path("v1", "configmaps", name, namespace="default"), {"data": {"b": "2"}})
        applied = client.apply(kubeapi.path("v1", "configmaps", name, namespace="default"),
                               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                "data": {"c": "3"}}, field_manager="kubeapi-other")
        assert applied["data"] == {"a": "1", "b": "2", "c": "3"}
        assert {m["manager"] for m in applied["metadata"]["managedFields"]} >= {"kubeapi-test", "kubeapi-other"}
        (found,) = client.list(cms, label_selector=f"t={name}")
        assert found["metadata"]["name"] == name
        client.request("DELETE", kubeapi.path("v1", "configmaps", name, namespace="default"))
    finally:
        client.close()


@pytest.mark.cluster
def test_a_rotated_token_file_is_read_again(cluster: Cluster, tmp_path: Path) -> None:
    doc = _kubeconfig(cluster)
    user = doc["users"][0]["user"]  # type: ignore[index]
    token = user.pop("token")
    token_file = tmp_path / "token"
    token_file.write_text("not-a-valid-token\n")
    user["tokenFile"] = str(token_file)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    client = kubeapi.Client(kubeapi.from_kubeconfig(path), field_manager="kubeapi-test")
    try:
        with pytest.raises(errors.ApiStatusError) as err:
            client.get("/api/v1/namespaces/default")
        assert err.value.code == 401
        token_file.write_text(token + "\n")  # the kubelet rotates the projected token

        os.utime(token_file, (1, 1))  # a different mtime even within the same second
        assert client.get("/api/v1/namespaces/default")["metadata"]["name"] == "default"
    finally:
        client.close()


def test_the_retry_delay_is_the_servers_retry_after_capped() -> None:
    throttled = errors.from_status({"code": 429, "reason": "TooManyRequests", "details": {"retryAfterSeconds": 3}},
                                   action="GET /api/v1/nodes")
    assert isinstance(throttled, errors.TooManyRequests) and kubeapi.retry_delay(throttled, 0.25) == 3
    slow = errors.from_status({"code": 429, "details": {"retryAfterSeconds": 600}}, action="GET /api/v1/nodes")
    assert kubeapi.retry_delay(slow, 0.25) == kubeapi.MAX_RETRY_AFTER_S
    failed = errors.from_status({"code": 500, "reason": "InternalError"}, action="POST /api/v1/namespaces/x/events")
    assert kubeapi.retry_delay(failed, 0.5) == 0.5


@pytest.mark.cluster
def test_a_5xx_is_tried_again_with_back_off_then_raised_as_a_server_error(cluster: Cluster) -> None:
    """A real 500 from the API server: an admission webhook that cannot be reached, with
    failurePolicy Fail, on ConfigMaps of one namespace. The agent's client tries four times with
    the documented waits between them, then raises ServerError; 4xx answers are not retried."""
    from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
    from lightkube.resources.core_v1 import Namespace

    run = uuid.uuid4().hex[:6]
    ns, webhook = f"kubeapi-retry-{run}", f"kubeapi-retry-{run}.nvlfabric.io"
    admin = cluster.client
    admin.create(Namespace.from_dict({"metadata": {"name": ns, "labels": {"kubeapi-retry": run}}}))
    admin.create(ValidatingWebhookConfiguration.from_dict({
        "metadata": {"name": webhook},
        "webhooks": [{"name": webhook, "clientConfig": {"url": "https://127.0.0.1:9/refuse"},
                      "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                 "resources": ["configmaps"]}],
                      "namespaceSelector": {"matchLabels": {"kubeapi-retry": run}}, "failurePolicy": "Fail",
                      "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 1}]}))
    client = kubeapi.Client(kubeapi.from_kubeconfig(cluster.kubeconfig), field_manager="kubeapi-test")
    waits: list[float] = []
    client.sleep = waits.append
    cms = kubeapi.path("v1", "configmaps", namespace=ns)
    try:
        with pytest.raises(errors.ServerError) as exc:
            for _ in range(20):  # until the API server's webhook informer has seen the new webhook
                waits.clear()
                client.create(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"generateName": "c-"}, "data": {}})
        assert "failed calling webhook" in str(exc.value) and exc.value.code == 500
        assert waits == list(kubeapi.RETRY_DELAYS_S)
        waits.clear()
        with pytest.raises(errors.NotFound):
            client.get(kubeapi.path("v1", "configmaps", "none", namespace=ns))
        assert waits == []
    finally:
        client.close()
        admin.delete(ValidatingWebhookConfiguration, webhook)
        admin.delete(Namespace, ns)
