"""The real Pulumi CLI, language host and both plugins work offline against the local cluster.

preview → up → out-of-band edit → refresh shows the drift → destroy leaves nothing, with every
network attempt routed to a refusing proxy.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.resource_v1 import DeviceClass

from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "offline_stack"


def test_preview_up_refresh_destroy_offline(cluster: Cluster, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=cluster.kubeconfig,
                                venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "suffix", suffix)

    preview = proj.json("preview", "--json")
    ops = {s["urn"].rsplit("::", 1)[1]: s["op"] for s in preview["steps"]}
    assert ops["ns"] == "create" and ops["dc"] == "create", ops

    up = proj.run("up", "--yes", "--skip-preview")
    assert "+ 3 created" in up.stdout or "3 created" in up.stdout, up.stdout
    outputs = proj.json("stack", "output", "--json")
    assert outputs == {"namespace": f"offline-{suffix}", "device_class": f"offline-{suffix}.nvlfabric.io"}
    klass = cluster.client.get(DeviceClass, f"offline-{suffix}.nvlfabric.io")
    assert klass.spec.selectors[0].cel.expression == 'device.driver == "channel.nvlfabric.io"'

    # Somebody edits the DeviceClass behind Pulumi's back; refresh must show it.
    klass.spec.selectors[0].cel.expression = 'device.driver == "edited.example.com"'
    cluster.client.replace(klass)
    refresh = proj.run("refresh", "--yes", "--diff")
    assert "edited.example.com" in refresh.stdout, refresh.stdout
    # The program still says channel.nvlfabric.io, so the next preview wants to put it back.
    again = proj.json("preview", "--json")
    assert {s["urn"].rsplit("::", 1)[1]: s["op"] for s in again["steps"]}["dc"] == "update"

    proj.run("destroy", "--yes", "--skip-preview")
    for kind, name in ((DeviceClass, f"offline-{suffix}.nvlfabric.io"),):
        with pytest.raises(ApiError) as gone:
            cluster.client.get(kind, name)
        assert gone.value.status.code == 404
    ns = _namespace_or_none(cluster, f"offline-{suffix}")
    assert ns is None or ns.status.phase == "Terminating"
    assert proj.json("stack", "export")["deployment"].get("resources") in (None, [])


def _namespace_or_none(cluster: Cluster, name: str) -> Namespace | None:
    try:
        return cluster.client.get(Namespace, name)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
