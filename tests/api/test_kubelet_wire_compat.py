"""Our kubelet protos are wire-compatible with the kubelet's own generated clients.

`kubeletcheck` (tools/kubeletcheck) is built from the official k8s.io/kubelet module's
registration and DRA v1/v1beta1 clients; here it drives a plugin that serves our protos.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.sim.kubelet.fakeplugin import FakePlugin
from nvlfabric.sim.paths import load_tools


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nvlw-", dir="/tmp"))  # unix socket paths: 107 bytes at most
    yield d
    shutil.rmtree(d, ignore_errors=True)


def kubeletcheck(plugin: FakePlugin, *claims: str) -> dict[str, object]:
    argv = [str(load_tools().binary("kubeletcheck")), "-registration", str(plugin.registration_socket)]
    for c in claims:
        argv += ["-claim", c]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(("versions", "service"), [
    (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "v1.DRAPlugin"),
    (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1.DRAPlugin"),
    (["v1beta1.DRAPlugin"], "v1beta1.DRAPlugin"),
], ids=["prefers-v1", "plugin-order-decides", "v1beta1-only"])
def test_official_clients_register_prepare_and_unprepare(short_dir: Path, versions: list[str], service: str) -> None:
    cdi = short_dir / "cdi"
    cdi.mkdir()
    plugin = FakePlugin(driver="wire.test.io", registry_dir=short_dir / "reg", plugin_dir=short_dir / "p",
                        cdi_dir=cdi, versions=versions)
    plugin.start()
    try:
        out = kubeletcheck(plugin, "default/claim-a/uid-a", "team/claim-b/uid-b")
    finally:
        plugin.stop()
    assert out["info"] == {"type": "DRAPlugin", "name": "wire.test.io", "endpoint": str(plugin.endpoint),
                           "supportedVersions": versions}
    assert out["service"] == service
    assert plugin.registered.is_set()
    prepared = out["prepare"]
    assert isinstance(prepared, dict) and set(prepared) == {"uid-a", "uid-b"}
    assert prepared["uid-a"]["devices"] == [{"requestNames": ["gpu"], "poolName": "pool", "deviceName": "gpu-0",
                                             "cdiDeviceIDs": ["k8s.wire.test.io/claim=uid-a-dev"]}]
    assert out["unprepare"] == {"uid-a": "", "uid-b": ""}
    assert [c[1] for c in plugin.calls] == [service.split(".")[0]] * 2
