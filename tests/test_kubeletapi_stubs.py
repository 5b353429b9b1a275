"""The checked-in kubelet gRPC stubs match the .proto files, and the wire names are the kubelet's."""

from __future__ import annotations

from pathlib import Path

from nvlfabric.api.kubelet import dra_v1_pb2, dra_v1beta1_pb2, generate, pluginregistration_pb2

REPO = Path(__file__).resolve().parent.parent


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    for fresh in sorted((tmp_path / generate.PACKAGE).iterdir()):
        checked_in = REPO / generate.PACKAGE / fresh.name
        assert checked_in.exists(), f"{fresh.name} is not checked in; run `make generate`"
        assert checked_in.read_text() == fresh.read_text(), f"{fresh.name} is stale; run `make generate`"


def test_service_and_field_names_match_the_kubelet() -> None:
    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert (dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
            == "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin")
    assert (pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name
            == "pluginregistration.Registration")
    device = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in device.items()} == {
        "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5}
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    info = pluginregistration_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in info.items()} == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
