"""nvlfabric's CRI stand-in over its real gRPC socket, and the pieces a real kubelet relies on:
the CRI log format the container proxy writes, the status codes, the image answers."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvlfabric.sim import hardware, realnode
from nvlfabric.sim.cri import runtime_v1_pb2 as cri
from nvlfabric.sim.cri import runtime_v1_pb2_grpc as cri_grpc
from nvlfabric.sim.cri.runtime import IMAGE_SIZE_BYTES, RuntimeSettings, serve

SHIM = hardware.build_standins()["nvlfabric-shim"]
#: A container as rootfs.py leaves it to the shim: its output on two pipes, the shim exec'd in the
#: parent's place with the child's pid and the pipes' ends.
CONTAINER = """
import os, sys, time
chunks, shim, log = eval(sys.argv[1]), sys.argv[2], sys.argv[3]
pipes = {"stdout": os.pipe(), "stderr": os.pipe()}
child = os.fork()
if child == 0:
    for fd, (_, w) in zip((1, 2), pipes.values()):
        os.dup2(w, fd)
    for stream, data in chunks:
        os.write(1 if stream == "stdout" else 2, data)
        time.sleep(0.001)
    os._exit(3)
for r, w in pipes.values():
    os.close(w)
    os.set_inheritable(r, True)
os.execv(shim, [shim, str(child), log, *(str(r) for r, _ in pipes.values())])
"""


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]), st.binary(max_size=40)), max_size=12))
def test_the_shims_cri_log_holds_every_line_in_order_tagged_with_its_stream(
        tmp_path_factory: pytest.TempPathFactory, chunks: list[tuple[str, bytes]]) -> None:
    path = tmp_path_factory.mktemp("log") / "0.log"
    done = subprocess.run([sys.executable, "-c", CONTAINER, repr(chunks), str(SHIM), str(path)], timeout=30)
    assert done.returncode == 3  # the container's status, through the shim
    written = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    for stream in ("stdout", "stderr"):
        text = b"".join(d for s, d in chunks if s == stream)
        expected = text.split(b"\n")
        if expected and expected[-1] == b"":
            expected.pop()  # a final newline ends the last line; it starts none
        lines = [line for line in written if line.split(b" ", 2)[1] == stream.encode()]
        assert [line.split(b" ", 3)[3] for line in lines] == expected
        for line in lines:  # <RFC 3339 time> <stream> F <text>: what the kubelet's log parser reads
            stamp, _, tag, _ = line.split(b" ", 3)
            assert tag == b"F"
            datetime.datetime.strptime(stamp.decode(), "%Y-%m-%dT%H:%M:%S.%fZ")


def test_more_real_kubelets_than_addresses_is_refused_naming_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode, "machine_addresses", lambda: ["192.0.2.7"])
    assert realnode.node_addresses(1) == ["192.0.2.7"]
    with pytest.raises(realnode.RealKubeletError, match=r"--real-kubelets 2 needs 2 .*found 1: 192\.0\.2\.7\. "
                                                       r"Use --real-kubelets 1 or fewer"):
        realnode.node_addresses(2)


Stubs = tuple[cri_grpc.RuntimeServiceStub, cri_grpc.ImageServiceStub, Path]


def with_runtime(tmp_path: Path, body: Callable[[Stubs], Awaitable[None]]) -> None:
    """Serve the runtime on a unix socket in tmp_path and run `body` with clients of it."""
    async def main() -> None:
        cdi_dir = tmp_path / "cdi"
        cdi_dir.mkdir()
        settings = RuntimeSettings(socket=tmp_path / "cri.sock", work_dir=tmp_path / "work",
                                   records_dir=tmp_path / "rec", cdi_dirs=[cdi_dir], images={}, env={},
                                   pod_ip="192.0.2.9", shim=SHIM)
        server, runtime = await serve(settings)
        channel = grpc.aio.insecure_channel(f"unix://{settings.socket}")
        try:
            await body((cri_grpc.RuntimeServiceStub(channel), cri_grpc.ImageServiceStub(channel), tmp_path))
        finally:
            await runtime.stop_all()
            await channel.close()
            await server.stop(0)

    asyncio.run(main())


def _sandbox_config(tmp_path: Path) -> cri.PodSandboxConfig:
    return cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name="p", uid="u1", namespace="default"),
                                log_directory=str(tmp_path / "logs" / "p"), labels={"app": "x"})


def test_an_unresolvable_cdi_device_fails_create_as_containerd_does(tmp_path: Path) -> None:
    with_runtime(tmp_path, _unresolvable)


async def _unresolvable(stubs: Stubs) -> None:
    runtime, _, tmp_path = stubs
    sandbox = (await runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=_sandbox_config(tmp_path)))).pod_sandbox_id
    status = await runtime.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox))
    assert status.status.network.ip == "192.0.2.9" and status.status.state == cri.SANDBOX_READY
    config = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="w"), image=cri.ImageSpec(image="busybox"),
                                 log_path="w/0.log", CDI_devices=[cri.CDIDevice(name="k8s.example.com/x=missing")])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await runtime.CreateContainer(cri.CreateContainerRequest(pod_sandbox_id=sandbox, config=config))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unresolvable CDI devices k8s.example.com/x=missing" in (err.value.details() or "")
    listed = await runtime.ListContainers(cri.ListContainersRequest())
    assert not listed.containers  # nothing half-made


def test_a_container_of_an_unmapped_image_runs_nothing_and_says_so(tmp_path: Path) -> None:
    with_runtime(tmp_path, _unmapped)


async def _unmapped(stubs: Stubs) -> None:
    runtime, images, tmp_path = stubs
    assert not (await images.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image="busybox:1")))) \
        .HasField("image")
    ref = (await images.PullImage(cri.PullImageRequest(image=cri.ImageSpec(image="busybox:1")))).image_ref
    image = (await images.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image=ref)))).image
    assert image.id == ref and image.size == IMAGE_SIZE_BYTES  # a size of 0 is refused by the kubelet
    sandbox = (await runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=_sandbox_config(tmp_path)))).pod_sandbox_id
    config = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="w"),
                                 image=cri.ImageSpec(image=ref, user_specified_image="busybox:1"), log_path="w/0.log")
    created = await runtime.CreateContainer(cri.CreateContainerRequest(pod_sandbox_id=sandbox, config=config))
    cid = created.container_id
    await runtime.StartContainer(cri.StartContainerRequest(container_id=cid))
    status = (await runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=cid))).status
    assert status.state == cri.CONTAINER_RUNNING
    assert status.log_path == str(tmp_path / "logs" / "p" / "w" / "0.log")  # never empty (the kubelet globs it)
    assert "image busybox:1 maps to no local program" in Path(status.log_path).read_text()
    await runtime.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=1))
    status = (await runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=cid))).status
    assert status.state == cri.CONTAINER_EXITED and status.finished_at >= status.started_at > 0
    await runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=cid))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND  # "already gone", to a kubelet cleaning up
