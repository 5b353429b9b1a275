"""`python -m nvlfabric.sim.cri.machine SETTINGS`: one simulated node run by the real kubelet.

Started by the simulator inside the node's machine (its own PID namespace, and a mount namespace
whose root is the host's file system with the node's directories at /var/lib/kubelet, /etc/cdi,
/var/run/cdi, /run/nvidia/driver, its /proc/devices, GPU device nodes and the kernel tunables the
kubelet writes: see nvlfabric/sim/realnode.py). Here it serves the node's container runtime, then
runs the kubelet against it and supervises both: SIGTERM stops the kubelet, then every pod, then
the runtime. The kubelet exiting on its own ends the node (its log says why).

The runtime is the CRI stand-in (runtime.py), or with `containerd` set the real one
(sim/containerdnode.py): containerd is started on the node's own root, state and socket, the
images the node runs (testbed/nodeimages.py) are imported into its `k8s.io` namespace with `ctr`
before the kubelet starts (no registry can be reached), and at the end every pod sandbox is
stopped and removed through CRI (its containers, its network through CNI, its cgroups), as a
node being drained and shut down would have it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

import grpc.aio
from pydantic import BaseModel

from nvlfabric.sim.cri import runtime_v1_pb2 as cri
from nvlfabric.sim.cri import runtime_v1_pb2_grpc as cri_grpc
from nvlfabric.sim.cri.runtime import RuntimeSettings, serve

log = logging.getLogger("nvlfabric.sim.cri")
KUBELET_STOP_TIMEOUT_S = 20.0
CONTAINERD_START_TIMEOUT_S = 30.0
SANDBOXES_STOP_TIMEOUT_S = 8.0
IMPORT_TIMEOUT_S = 300.0


class ContainerdSettings(BaseModel):
    argv: list[str]
    """`containerd --config <the node's config.toml>`."""
    socket: Path
    log: Path
    ctr: Path
    images: list[Path]
    """Docker archives imported into the `k8s.io` namespace before the kubelet starts."""
    path: str
    """containerd's PATH: where it finds containerd-shim-runc-v2 (the shim finds runc by path)."""


class MachineSettings(BaseModel):
    node: str
    runtime: RuntimeSettings | None = None
    containerd: ContainerdSettings | None = None
    kubelet_argv: list[str]
    kubelet_log: Path
    kubelet_cwd: Path
    """An empty scratch directory: the kubelet deletes files matching a container's log path
    pattern in its working directory when a runtime reports an empty one (never a checkout)."""


async def _start_containerd(node: str, settings: ContainerdSettings) -> asyncio.subprocess.Process:
    settings.log.parent.mkdir(parents=True, exist_ok=True)
    settings.socket.unlink(missing_ok=True)
    with settings.log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(*settings.argv, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                                                    stderr=out, env={"PATH": settings.path, "HOME": "/root"})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONTAINERD_START_TIMEOUT_S
    while not settings.socket.exists():
        if proc.returncode is not None or loop.time() > deadline:
            raise RuntimeError(f"node {node}: containerd made no socket at {settings.socket} "
                               f"(exit {proc.returncode}); see {settings.log}")
        await asyncio.sleep(0.1)
    log.info("node %s: containerd (pid %d) serves %s", node, proc.pid, settings.socket)
    for archive in settings.images:
        started = loop.time()
        imp = await asyncio.create_subprocess_exec(
            str(settings.ctr), "--address", str(settings.socket), "--namespace", "k8s.io", "images", "import",
            "--snapshotter", "overlayfs", str(archive), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        said, _ = await asyncio.wait_for(imp.communicate(), IMPORT_TIMEOUT_S)
        if imp.returncode != 0:
            raise RuntimeError(f"node {node}: ctr images import {archive} failed: {said.decode(errors='replace')}")
        log.info("node %s: image %s imported in %.1fs", node, archive.name, loop.time() - started)
    return proc


async def _remove_sandboxes(node: str, socket: Path) -> None:
    """Every pod sandbox containerd holds, stopped (its containers killed, its network released
    through CNI) and removed, over CRI as the kubelet would."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = cri_grpc.RuntimeServiceStub(channel)
        listed = await stub.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=5)
        for sandbox in listed.items:
            await stub.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=5)
            await stub.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id), timeout=5)
        log.info("node %s: %d pod sandbox(es) stopped and removed", node, len(listed.items))


async def run(settings: MachineSettings) -> int:
    server, runtime, containerd = None, None, None
    if settings.containerd is not None:
        containerd = await _start_containerd(settings.node, settings.containerd)
    elif settings.runtime is not None:
        server, runtime = await serve(settings.runtime)
        log.info("node %s: CRI served on %s", settings.node, settings.runtime.socket)
    else:
        raise ValueError("machine settings name no runtime (runtime or containerd)")
    settings.kubelet_cwd.mkdir(parents=True, exist_ok=True)
    settings.kubelet_log.parent.mkdir(parents=True, exist_ok=True)
    with settings.kubelet_log.open("ab") as out:
        kubelet = await asyncio.create_subprocess_exec(*settings.kubelet_argv, stdin=asyncio.subprocess.DEVNULL,
                                                       stdout=out, stderr=out, cwd=settings.kubelet_cwd)
    log.info("node %s: kubelet started (pid %d), log %s", settings.node, kubelet.pid, settings.kubelet_log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    exited = asyncio.create_task(kubelet.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if exited.done():
        code = exited.result() or 1
        log.error("node %s: the kubelet exited (%s); see %s", settings.node, code, settings.kubelet_log)
    else:
        kubelet.terminate()
        try:
            await asyncio.wait_for(exited, KUBELET_STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                kubelet.kill()
            await exited
    stopping.cancel()
    if runtime is not None and server is not None:
        await runtime.stop_all()
        await server.stop(1)
    if containerd is not None and settings.containerd is not None:
        try:
            await asyncio.wait_for(_remove_sandboxes(settings.node, settings.containerd.socket),
                                   SANDBOXES_STOP_TIMEOUT_S)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            log.warning("node %s: pods left to the machine's end: %s", settings.node, exc)
        containerd.terminate()
        try:
            await asyncio.wait_for(containerd.wait(), 5)
        except TimeoutError:
            containerd.kill()
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = MachineSettings.model_validate_json(Path(args[0]).read_text())
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
