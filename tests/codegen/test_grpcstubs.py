"""The checked-in kubelet gRPC stubs match the .proto files, and the wire names are the kubelet's."""

from __future__ import annotations

from pathlib import Path

from nvlfabric.api.kubelet import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_pb2
from nvlfabric.codegen import grpcstubs as generate

REPO = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    fresh_files = sorted(p for package in generate.PACKAGES for p in (tmp_path / package).iterdir())
    assert any("cri" in str(p) for p in fresh_files)
    for fresh in fresh_files:
        checked_in = REPO / fresh.relative_to(tmp_path)
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


def test_cri_names_and_numbers_are_the_kubelets() -> None:
    """The CRI subset the runtime stand-in serves: the services' full names (the kubelet's gRPC
    paths) and the field numbers of what it reads from the kubelet and reports back."""
    from nvlfabric.sim.cri import runtime_v1_pb2 as cri

    services = cri.DESCRIPTOR.services_by_name
    assert services["RuntimeService"].full_name == "runtime.v1.RuntimeService"
    assert services["ImageService"].full_name == "runtime.v1.ImageService"

    def numbers(message: object) -> dict[str, int]:
        return {n: f.number for n, f in message.DESCRIPTOR.fields_by_name.items()}  # type: ignore[attr-defined]

    assert numbers(cri.ContainerConfig) == {
        "metadata": 1, "image": 2, "command": 3, "args": 4, "working_dir": 5, "envs": 6, "mounts": 7,
        "devices": 8, "labels": 9, "annotations": 10, "log_path": 11, "linux": 15, "CDI_devices": 17}
    assert numbers(cri.ContainerStatus) == {
        "id": 1, "metadata": 2, "state": 3, "created_at": 4, "started_at": 5, "finished_at": 6, "exit_code": 7,
        "image": 8, "image_ref": 9, "reason": 10, "message": 11, "labels": 12, "annotations": 13, "mounts": 14,
        "log_path": 15, "image_id": 17}
    assert numbers(cri.PodSandboxConfig) == {"metadata": 1, "hostname": 2, "log_directory": 3, "labels": 6,
                                             "annotations": 7, "linux": 8}
    assert numbers(cri.PodSandboxStatus)["network"] == 5
    assert numbers(cri.ImageSpec) == {"image": 1, "annotations": 2, "user_specified_image": 18,
                                      "runtime_handler": 19, "image_ref": 20}
    assert cri.CONTAINER_EXITED == 2 and cri.SANDBOX_NOTREADY == 1 and cri.CGROUPFS == 1
