"""nvlfabric's container runtime stand-in: CRI v1 served to a real kubelet on a simulated node.

It is to the real kubelet what containerd is: pod sandboxes and containers by ID, images, logs
and `exec` for probes. A container whose image maps to a local program (nvlfabric-sim up
--images) runs as the simulated kubelet runs one (rootfs.py: a mount namespace of its own with
the kubelet's mounts at their paths, the CDI devices the kubelet names resolved from the node's
spec directories and applied: env, mounts, device nodes). Any other image is pulled at once and
runs nothing: its container is Running until stopped, and its log says so. There is no network
of pods: every sandbox has the node's address, as a host-network pod has.

The kubelet has done what is the kubelet's: volumes materialised (projected tokens, config
maps, secrets as files under its root), `$(VAR)` expanded, the pod's /etc/hosts written and
passed as a mount. What is the runtime's is done here: ENTRYPOINT/CMD from the image, CDI, the
container's root, CRI-format logs (the proxy writes them), exit codes and times.

Every started container is recorded as the simulated kubelet records it, in the node's
containers/ directory (`<namespace>_<pod>_<container>.json`: CDI IDs, their edits, the env,
command and args the kubelet gave), so tests read one format for both kinds of node.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel

from nvlfabric.api.kubelet.cdi import ContainerEdits
from nvlfabric.sim.cri import runtime_v1_pb2 as cri
from nvlfabric.sim.cri import runtime_v1_pb2_grpc as cri_grpc
from nvlfabric.sim.images import ImageProgram, program_for
from nvlfabric.sim.kubelet import cdi, machine
from nvlfabric.sim.kubelet.processes import cdi_mounts_and_devices, image_mounts

RUNTIME_NAME = "nvlfabric-sim"
RUNTIME_VERSION = "0.1.0"
#: The kubelet refuses an image of size 0 (ImageInspectError): what every image "weighs" here.
IMAGE_SIZE_BYTES = 64 << 20
POLL_S = 0.2


class RuntimeSettings(BaseModel):
    """What one node's runtime needs; written by the simulator as JSON, read by `python -m nvlfabric.sim.cri`."""

    socket: Path
    """The CRI endpoint (a unix socket) the kubelet's containerRuntimeEndpoint names."""
    work_dir: Path
    """Container specs and pid files: the runtime's own state, on the node's disk."""
    records_dir: Path
    """Where each started container's record goes (the node's containers/ directory)."""
    cdi_dirs: list[Path]
    """CDI spec directories as this machine sees them, lowest priority first."""
    images: dict[str, ImageProgram]
    env: dict[str, str]
    """Environment every container gets under the kubelet's: the image's, and the node's hardware
    identity (the NVML stand-in's node), which a real node's containers get from its devices."""
    pod_ip: str
    shim: Path
    """The containers' shim (nvlfabric/sim/shim), which writes their CRI logs."""
    service_env: dict[str, str] = {}
    """Set over what the kubelet gives: KUBERNETES_SERVICE_HOST/PORT as the API server's real
    address. No kube-proxy runs, so the `kubernetes` Service's cluster IP leads nowhere; this is
    the network's part, which the stand-in plays (as the simulated kubelet does)."""


def now_ns() -> int:
    return time.time_ns()


@dataclass
class Sandbox:
    id: str
    config: cri.PodSandboxConfig
    created_at: int
    ready: bool = True
    pause: subprocess.Popen[bytes] | None = None
    """With a PID namespace of its own (mode POD: `shareProcessNamespace`), the process holding it..."""
    pidns: str | None = None
    """... and /proc/<its first process>/ns/pid, which the sandbox's containers enter."""

    @property
    def pid_mode(self) -> int:
        return int(self.config.linux.security_context.namespace_options.pid)


@dataclass
class Container:
    id: str
    sandbox_id: str
    config: cri.ContainerConfig
    log_path: Path
    created_at: int
    image: str
    """The image as the pod names it."""
    spec_path: Path | None = None
    """The rootfs spec, for a container that runs a program; None: it runs nothing."""
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    state: int = cri.CONTAINER_CREATED
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""

    @property
    def pid_file(self) -> Path | None:
        return self.spec_path.with_suffix(".pid") if self.spec_path else None

    def container_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text()) if self.pid_file else None
        except (OSError, ValueError):
            return None


def _image_ref(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def _matches(labels: Any, selector: Any) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class Runtime(cri_grpc.RuntimeServiceServicer, cri_grpc.ImageServiceServicer):
    def __init__(self, settings: RuntimeSettings) -> None:
        self.s = settings
        self.sandboxes: dict[str, Sandbox] = {}
        self.containers: dict[str, Container] = {}
        self.images: dict[str, str] = {}  # image reference as pulled → its ref

    # -- the runtime itself ------------------------------------------------------------------------

    async def Version(self, request: cri.VersionRequest, context: Any) -> cri.VersionResponse:
        return cri.VersionResponse(version="0.1.0", runtime_name=RUNTIME_NAME, runtime_version=RUNTIME_VERSION,
                                   runtime_api_version="v1")

    async def Status(self, request: cri.StatusRequest, context: Any) -> cri.StatusResponse:
        return cri.StatusResponse(status=cri.RuntimeStatus(conditions=[
            cri.RuntimeCondition(type="RuntimeReady", status=True),
            # No pod network to set up: sandboxes share the node's address.
            cri.RuntimeCondition(type="NetworkReady", status=True)]),
            runtime_handlers=[cri.RuntimeHandler(name="")])

    async def RuntimeConfig(self, request: cri.RuntimeConfigRequest, context: Any) -> cri.RuntimeConfigResponse:
        return cri.RuntimeConfigResponse(linux=cri.LinuxRuntimeConfiguration(cgroup_driver=cri.CGROUPFS))

    async def UpdateRuntimeConfig(self, request: cri.UpdateRuntimeConfigRequest,
                                  context: Any) -> cri.UpdateRuntimeConfigResponse:
        return cri.UpdateRuntimeConfigResponse()

    # -- sandboxes ---------------------------------------------------------------------------------

    async def RunPodSandbox(self, request: cri.RunPodSandboxRequest, context: Any) -> cri.RunPodSandboxResponse:
        sandbox = Sandbox(id=uuid.uuid4().hex, config=request.config, created_at=now_ns())
        if sandbox.config.log_directory:
            Path(sandbox.config.log_directory).mkdir(parents=True, exist_ok=True)
        self.sandboxes[sandbox.id] = sandbox
        return cri.RunPodSandboxResponse(pod_sandbox_id=sandbox.id)

    async def StopPodSandbox(self, request: cri.StopPodSandboxRequest, context: Any) -> cri.StopPodSandboxResponse:
        sandbox = self.sandboxes.get(request.pod_sandbox_id)
        if sandbox is not None:  # stopping an unknown (removed) sandbox succeeds, as CRI asks
            await asyncio.gather(*(self._stop(c, 10) for c in self.containers.values()
                                   if c.sandbox_id == sandbox.id))
            sandbox.ready = False
        return cri.StopPodSandboxResponse()

    async def RemovePodSandbox(self, request: cri.RemovePodSandboxRequest,
                               context: Any) -> cri.RemovePodSandboxResponse:
        for c in [c for c in self.containers.values() if c.sandbox_id == request.pod_sandbox_id]:
            await self._stop(c, 0)
            del self.containers[c.id]
        sandbox = self.sandboxes.pop(request.pod_sandbox_id, None)
        if sandbox is not None and sandbox.pause is not None and sandbox.pidns is not None:
            machine.end_pid_namespace(sandbox.pause, sandbox.pidns)
        return cri.RemovePodSandboxResponse()

    def _sandbox(self, sandbox_id: str, context: Any) -> Sandbox:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise _NotFound(f"pod sandbox {sandbox_id} not found")
        return sandbox

    async def PodSandboxStatus(self, request: cri.PodSandboxStatusRequest,
                               context: Any) -> cri.PodSandboxStatusResponse:
        sb = self._sandbox(request.pod_sandbox_id, context)
        return cri.PodSandboxStatusResponse(status=cri.PodSandboxStatus(
            id=sb.id, metadata=sb.config.metadata, state=cri.SANDBOX_READY if sb.ready else cri.SANDBOX_NOTREADY,
            created_at=sb.created_at, network=cri.PodSandboxNetworkStatus(ip=self.s.pod_ip),
            # The namespaces as asked: every sandbox here is in the node's network, so a pod's
            # sandbox is what its spec wants whichever mode it asked for.
            linux=cri.LinuxPodSandboxStatus(namespaces=cri.Namespace(
                options=sb.config.linux.security_context.namespace_options)),
            labels=sb.config.labels, annotations=sb.config.annotations), timestamp=now_ns())

    async def ListPodSandbox(self, request: cri.ListPodSandboxRequest, context: Any) -> cri.ListPodSandboxResponse:
        f = request.filter
        items = []
        for sb in self.sandboxes.values():
            state = cri.SANDBOX_READY if sb.ready else cri.SANDBOX_NOTREADY
            if (f.id and sb.id != f.id) or (f.HasField("state") and f.state.state != state) \
                    or not _matches(sb.config.labels, f.label_selector):
                continue
            items.append(cri.PodSandbox(id=sb.id, metadata=sb.config.metadata, state=state, created_at=sb.created_at,
                                        labels=sb.config.labels, annotations=sb.config.annotations))
        return cri.ListPodSandboxResponse(items=items)

    async def ListPodSandboxStats(self, request: cri.ListPodSandboxStatsRequest,
                                  context: Any) -> cri.ListPodSandboxStatsResponse:
        return cri.ListPodSandboxStatsResponse()

    async def ListMetricDescriptors(self, request: cri.ListMetricDescriptorsRequest,
                                    context: Any) -> cri.ListMetricDescriptorsResponse:
        return cri.ListMetricDescriptorsResponse()

    async def ListPodSandboxMetrics(self, request: cri.ListPodSandboxMetricsRequest,
                                    context: Any) -> cri.ListPodSandboxMetricsResponse:
        return cri.ListPodSandboxMetricsResponse()

    # -- containers --------------------------------------------------------------------------------

    async def CreateContainer(self, request: cri.CreateContainerRequest,
                              context: Any) -> cri.CreateContainerResponse:
        sb = self._sandbox(request.pod_sandbox_id, context)
        config = request.config
        ids = [d.name for d in config.CDI_devices]
        try:
            edits = cdi.resolve(self.s.cdi_dirs, ids)
        except cdi.UnresolvableDevices as exc:
            # What containerd answers; the kubelet shows it as CreateContainerError on the pod.
            raise _Failed(f"failed to inject CDI devices: {exc}") from exc
        cid = uuid.uuid4().hex
        log_path = Path(sb.config.log_directory or self.s.work_dir / "logs") / (config.log_path or f"{cid}.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        c = Container(id=cid, sandbox_id=sb.id, config=config, log_path=log_path, created_at=now_ns(),
                      image=self._image_name(config.image))
        # The runtime's env order: the image's, then the spec's (as the kubelet resolved it), then
        # the CDI edits of the container's devices over both.
        spec_env = {kv.key: kv.value for kv in config.envs}
        program = program_for(self.s.images, c.image)
        c.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(program.env if program else {}),
                 "HOME": "/", "PYTHONUNBUFFERED": "1",
                 **self.s.env, "HOSTNAME": sb.config.hostname, **spec_env, **self.s.service_env,
                 **dict(e.split("=", 1) for e in edits.env if "=" in e)}
        if program is not None:
            c.spec_path = self._write_spec(c, program, edits, sb)
        self._record(sb, c, ids, edits, spec_env)
        self.containers[cid] = c
        return cri.CreateContainerResponse(container_id=cid)

    def _image_name(self, spec: cri.ImageSpec) -> str:
        """The reference the pod named: the kubelet passes the image's ID (what the pull returned)
        and the pod's own reference beside it (`user_specified_image`)."""
        if spec.user_specified_image:
            return spec.user_specified_image
        return next((name for name, ref in self.images.items() if ref == spec.image), spec.image)

    def _pod_pidns(self, sb: Sandbox) -> str | None:
        """The PID namespace a container of `sb` is made in: the pod's (mode POD: its containers
        share one, held by a pause from its first container that runs to its removal), else the
        node's (this runtime's)."""
        if sb.pid_mode == cri.POD and sb.pidns is None:
            sb.pause, init = machine.pid_namespace(self.s.shim, None)
            if init is None:
                sb.pause.kill()
                sb.pause.wait()
                sb.pause = None
                raise _Failed("failed to start the pod's PID namespace (unshare --pid)")
            sb.pidns = f"/proc/{init}/ns/pid"
        return sb.pidns

    def _write_spec(self, c: Container, program: ImageProgram, edits: ContainerEdits, sb: Sandbox) -> Path:
        config = c.config
        argv = program.argv(list(config.command), list(config.args))
        cdi_mounts, devices = cdi_mounts_and_devices(Path, edits)
        for d in config.devices:  # a device plugin's devices (none of ours), by their host node
            with contextlib.suppress(OSError):
                rdev = os.stat(d.host_path).st_rdev
                devices.append({"path": d.container_path, "type": "c", "major": os.major(rdev),
                                "minor": os.minor(rdev)})
        mounts = [{"source": m.host_path, "target": m.container_path, "readonly": m.readonly}
                  for m in config.mounts]
        work = self.s.work_dir / c.id
        work.mkdir(parents=True, exist_ok=True)
        spec = {"root": str(work / "rootfs"), "mounts": [*image_mounts(c.image, program), *mounts, *cdi_mounts],
                "devices": devices, "hosts": None,
                "cwd": config.working_dir or "/", "argv": argv, "env": c.env,
                # The PID namespace the kubelet asks for: the pod's, the node's (this runtime's), or
                # (CONTAINER, the default) one of the container's own inside the node's.
                "pidns": self._pod_pidns(sb), "own_pidns": sb.pid_mode == cri.CONTAINER,
                "pid_file": str(work / "container.pid"), "cri_log": str(c.log_path), "shim": str(self.s.shim)}
        (work / "rootfs").mkdir(exist_ok=True)
        path = work / "container.json"
        path.write_text(json.dumps(spec, indent=1))
        return path

    def _record(self, sb: Sandbox, c: Container, ids: list[str], edits: ContainerEdits,
                spec_env: dict[str, str]) -> None:
        meta = sb.config.metadata
        record = {"cdi_device_ids": ids, **edits.model_dump(mode="json", by_alias=True, exclude_none=True),
                  "command": list(c.config.command), "args": list(c.config.args), "containerEnv": spec_env,
                  "pod": meta.name, "namespace": meta.namespace, "pod_uid": meta.uid,
                  "container": c.config.metadata.name, "runtime": RUNTIME_NAME, "container_id": c.id}
        self.s.records_dir.mkdir(parents=True, exist_ok=True)
        path = self.s.records_dir / f"{meta.namespace}_{meta.name}_{c.config.metadata.name}.json"
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

    def _container(self, container_id: str) -> Container:
        c = self.containers.get(container_id)
        if c is None:
            raise _NotFound(f"container {container_id} not found")
        return c

    async def StartContainer(self, request: cri.StartContainerRequest, context: Any) -> cri.StartContainerResponse:
        c = self._container(request.container_id)
        if c.state != cri.CONTAINER_CREATED:
            raise _Failed(f"container {c.id} is not in created state")
        if c.spec_path is None:
            with c.log_path.open("a") as fh:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
                fh.write(f"{stamp} stdout F nvlfabric-sim: image {c.image} maps to no local program "
                         f"(nvlfabric-sim up --images), so nothing runs in container {c.config.metadata.name}\n")
        else:
            with (c.spec_path.parent / "proxy.log").open("ab") as err:
                c.proc = subprocess.Popen([sys.executable, "-m", "nvlfabric.sim.kubelet.rootfs", str(c.spec_path)],
                                          stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=c.env,
                                          start_new_session=True)
        c.state, c.started_at = cri.CONTAINER_RUNNING, now_ns()
        return cri.StartContainerResponse()

    def reap(self) -> None:
        """Mark exited containers: their exit code and time, as the runtime's shim reports them."""
        for c in self.containers.values():
            if c.state == cri.CONTAINER_RUNNING and c.proc is not None and (code := c.proc.poll()) is not None:
                c.state, c.finished_at, c.exit_code = cri.CONTAINER_EXITED, now_ns(), code
                c.reason = "Completed" if code == 0 else "Error"

    async def _stop(self, c: Container, timeout_s: int) -> None:
        if c.state == cri.CONTAINER_CREATED:
            c.state, c.finished_at = cri.CONTAINER_EXITED, now_ns()
            return
        if c.state != cri.CONTAINER_RUNNING:
            return
        if c.proc is not None and c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)  # the proxy forwards it to the container
            deadline = time.monotonic() + timeout_s
            while c.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                while c.proc.poll() is None:
                    await asyncio.sleep(0.02)
        self.reap()
        if c.state == cri.CONTAINER_RUNNING:  # nothing ran: it stops as told
            c.state, c.finished_at, c.exit_code, c.reason = cri.CONTAINER_EXITED, now_ns(), 137, "Error"

    async def StopContainer(self, request: cri.StopContainerRequest, context: Any) -> cri.StopContainerResponse:
        c = self.containers.get(request.container_id)
        if c is not None:
            await self._stop(c, int(request.timeout))
        return cri.StopContainerResponse()

    async def RemoveContainer(self, request: cri.RemoveContainerRequest,
                              context: Any) -> cri.RemoveContainerResponse:
        c = self.containers.get(request.container_id)
        if c is not None:
            await self._stop(c, 0)
            del self.containers[c.id]
        return cri.RemoveContainerResponse()

    def _summary(self, c: Container) -> cri.Container:
        return cri.Container(id=c.id, pod_sandbox_id=c.sandbox_id, metadata=c.config.metadata,
                             image=cri.ImageSpec(image=c.image, user_specified_image=c.image),
                             image_ref=_image_ref(c.image), state=c.state,  # type: ignore[arg-type]
                             created_at=c.created_at, labels=c.config.labels, annotations=c.config.annotations,
                             image_id=_image_ref(c.image))

    async def ListContainers(self, request: cri.ListContainersRequest, context: Any) -> cri.ListContainersResponse:
        self.reap()
        f = request.filter
        out = [self._summary(c) for c in self.containers.values()
               if not (f.id and c.id != f.id) and not (f.pod_sandbox_id and c.sandbox_id != f.pod_sandbox_id)
               and not (f.HasField("state") and f.state.state != c.state)
               and _matches(c.config.labels, f.label_selector)]
        return cri.ListContainersResponse(containers=out)

    async def ContainerStatus(self, request: cri.ContainerStatusRequest, context: Any) -> cri.ContainerStatusResponse:
        self.reap()
        c = self._container(request.container_id)
        return cri.ContainerStatusResponse(status=cri.ContainerStatus(
            id=c.id, metadata=c.config.metadata, state=c.state,  # type: ignore[arg-type]
            created_at=c.created_at, started_at=c.started_at,
            finished_at=c.finished_at, exit_code=c.exit_code,
            image=cri.ImageSpec(image=c.image, user_specified_image=c.image),
            image_ref=_image_ref(c.image), image_id=_image_ref(c.image), reason=c.reason,
            labels=c.config.labels, annotations=c.config.annotations, mounts=c.config.mounts,
            log_path=str(c.log_path)))

    async def UpdateContainerResources(self, request: cri.UpdateContainerResourcesRequest,
                                       context: Any) -> cri.UpdateContainerResourcesResponse:
        return cri.UpdateContainerResourcesResponse()

    async def ReopenContainerLog(self, request: cri.ReopenContainerLogRequest,
                                 context: Any) -> cri.ReopenContainerLogResponse:
        # The proxy holds the log open: after the kubelet rotates it (containerLogMaxSize, set far
        # above what a simulated container writes), lines would go on into the renamed file.
        return cri.ReopenContainerLogResponse()

    async def ExecSync(self, request: cri.ExecSyncRequest, context: Any) -> cri.ExecSyncResponse:
        """A command in the container's mount namespace, root and working directory (exec probes)."""
        c = self._container(request.container_id)
        pid = c.container_pid()
        if c.state != cri.CONTAINER_RUNNING or pid is None:
            raise _Failed(f"container {c.id} is not running a process")
        proc = await asyncio.create_subprocess_exec(
            "nsenter", "-t", str(pid), "-m", "-r", "-w", "--", *request.cmd, env=c.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=request.timeout or None)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise _Timeout(f"command {list(request.cmd)} timed out after {request.timeout}s") from None
        return cri.ExecSyncResponse(stdout=out, stderr=err, exit_code=proc.returncode or 0)

    async def ListContainerStats(self, request: cri.ListContainerStatsRequest,
                                 context: Any) -> cri.ListContainerStatsResponse:
        return cri.ListContainerStatsResponse()

    # -- images ------------------------------------------------------------------------------------

    def _image(self, ref: str) -> cri.Image:
        return cri.Image(id=_image_ref(ref), repo_tags=[ref], size=IMAGE_SIZE_BYTES, spec=cri.ImageSpec(image=ref))

    async def ListImages(self, request: cri.ListImagesRequest, context: Any) -> cri.ListImagesResponse:
        return cri.ListImagesResponse(images=[self._image(r) for r in self.images])

    async def ImageStatus(self, request: cri.ImageStatusRequest, context: Any) -> cri.ImageStatusResponse:
        # Asked by the pod's reference or by the ID a pull returned (the kubelet does both).
        asked = request.image.image
        name = asked if asked in self.images else next((n for n, ref in self.images.items() if ref == asked), None)
        return cri.ImageStatusResponse(image=self._image(name) if name is not None else None)

    async def PullImage(self, request: cri.PullImageRequest, context: Any) -> cri.PullImageResponse:
        # Every reference "pulls" at once: the image of every container here is the machine itself.
        self.images[request.image.image] = _image_ref(request.image.image)
        return cri.PullImageResponse(image_ref=_image_ref(request.image.image))

    async def RemoveImage(self, request: cri.RemoveImageRequest, context: Any) -> cri.RemoveImageResponse:
        self.images.pop(request.image.image, None)
        return cri.RemoveImageResponse()

    async def ImageFsInfo(self, request: cri.ImageFsInfoRequest, context: Any) -> cri.ImageFsInfoResponse:
        st = os.statvfs(self.s.work_dir)
        usage = cri.FilesystemUsage(timestamp=now_ns(), fs_id=cri.FilesystemIdentifier(mountpoint=str(self.s.work_dir)),
                                    used_bytes=cri.UInt64Value(value=(st.f_blocks - st.f_bfree) * st.f_frsize),
                                    inodes_used=cri.UInt64Value(value=st.f_files - st.f_ffree))
        return cri.ImageFsInfoResponse(image_filesystems=[usage], container_filesystems=[usage])

    # -- lifecycle ---------------------------------------------------------------------------------

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(c, 10) for c in self.containers.values()))


class _Status(Exception):
    code = grpc.StatusCode.UNKNOWN


class _NotFound(_Status):
    code = grpc.StatusCode.NOT_FOUND


class _Failed(_Status):
    code = grpc.StatusCode.FAILED_PRECONDITION


class _Timeout(_Status):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class _StatusInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Turn the runtime's errors into gRPC status codes the kubelet acts on (NotFound above all:
    it means "already gone" to a kubelet cleaning up)."""

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def call(request: Any, context: Any) -> Any:
            try:
                return await inner(request, context)
            except _Status as exc:
                await context.abort(exc.code, str(exc))

        return grpc.unary_unary_rpc_method_handler(call, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


async def serve(settings: RuntimeSettings) -> tuple[grpc.aio.Server, Runtime]:
    runtime = Runtime(settings)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    settings.socket.parent.mkdir(parents=True, exist_ok=True)
    settings.socket.unlink(missing_ok=True)
    server = grpc.aio.server(interceptors=[_StatusInterceptor()])
    cri_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
    cri_grpc.add_ImageServiceServicer_to_server(runtime, server)
    server.add_insecure_port(f"unix://{settings.socket}")
    await server.start()
    return server, runtime
