"""Running a pod's container as a local process on a simulated node (the node agent's DaemonSet).

There is no container runtime, so the "container" is a process of ours in a mount namespace of
its own (rootfs.py): each volume is bound at its mount path (hostPath volumes through the node's
host-path table, the projected service-account volume a per-pod directory with a token bound to
this pod), the CDI edits of its claims are applied (env, mounts, device nodes), and the pod has
its own /etc/hosts. The kubelet's usual environment is added (KUBERNETES_SERVICE_HOST/PORT,
downward-API fields, the pod's labels and annotations among them), and `$(VAR)` references in env
values, command and args are expanded as a kubelet expands them, so the process sees what a pod
would, at the paths a pod would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightkube.models.core_v1 import Container, EnvVar
from lightkube.resources.core_v1 import Pod

from nvlfabric.api.kubelet.cdi import ContainerEdits
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.kubelet import volumes
from nvlfabric.sim.nodes import SimNode

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
STOP_POLL_S = 0.05  # how often a stopping pod's processes are looked at


@dataclass
class PodProcess:
    pod_uid: str
    pod_name: str
    namespace: str
    container: Container
    proc: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    restarts: int = 0
    restart_at: float | None = None
    """Once this instance has exited: when the kubelet starts the next (after its back-off)."""
    log_offset: int = 0
    """Where this instance's output starts in the container's log (restarts append to it)."""

    @property
    def pid_file(self) -> Path:
        return self.cwd / f"{self.container.name}.pid"

    def container_pid(self) -> int | None:
        """The container's own process (rootfs.py writes it), not its shim's: the one whose mount
        namespace, root and working directory are the container's."""
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if self.proc.poll() is None else None

    def termination_message(self, code: int) -> str | None:
        """`lastState.terminated.message` as the kubelet writes it for an instance that exited with
        `code`: with `terminationMessagePolicy: FallbackToLogsOnError` and a failed exit, the end of
        its log (the last 80 lines, 2048 bytes at most). The termination-message file itself is not
        read here: nothing we run writes one."""
        if code == 0 or self.container.terminationMessagePolicy != "FallbackToLogsOnError":
            return None
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self.log_offset)
                data = fh.read()
        except OSError:
            return None
        tail = "\n".join(data.decode(errors="replace").splitlines()[-80:]).encode()[-2048:]
        return tail.decode(errors="ignore") or None

    def back_off_s(self) -> float:
        """How long the kubelet waits before starting the next instance once this one exited: at
        once after a first exit, then doubling and capped, as its CrashLoopBackOff does (10 s .. 300 s
        there; a tenth of that here, so that tests of restarts stay short)."""
        return 0.0 if self.restarts == 0 else min(10.0 * 2 ** (self.restarts - 1), 300.0) / 10

    def restart(self) -> PodProcess:
        """The next instance, after a crash and its back-off."""
        new = launch(pod_uid=self.pod_uid, pod_name=self.pod_name, namespace=self.namespace,
                     container=self.container, argv=self.argv, env=self.env, cwd=self.cwd, log_path=self.log_path)
        new.restarts = self.restarts + 1
        return new

    def kill(self) -> None:
        """SIGKILL the container: its whole process group (the proxy and the container it runs;
        what the container made a session of its own, an IMEX daemon, is not the container's)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()


def _terminate_all(procs: Sequence[PodProcess]) -> list[PodProcess]:
    running = [p for p in procs if p.proc.poll() is None]
    for p in running:
        with contextlib.suppress(ProcessLookupError):
            p.proc.send_signal(signal.SIGTERM)
    return running


def stop_all(procs: Sequence[PodProcess], timeout: float = 10.0) -> None:
    """Stop many processes at once: SIGTERM to all, then wait for all, SIGKILL what is left after
    `timeout` s. One after another, 72 node agents (each stopping its IMEX daemon) outlast the time
    `nvlfabric-sim down` gives the kubelet process, and whatever is left keeps running orphaned.
    Blocking: for the kubelet's own exit; a pod's stop is `stop_pod_processes`."""
    running = _terminate_all(procs)
    deadline = time.monotonic() + timeout
    for p in running:
        try:
            p.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.proc.wait()


async def stop_pod_processes(procs: Sequence[PodProcess], timeout: float = 10.0) -> None:
    """`stop_all` without holding the event loop while the processes take their grace: every
    node's heartbeats and pods share it, and 36 pods stopping together (a ComputeDomain's
    teardown) held it for minutes: nodes went NotReady, API requests timed out."""
    running = _terminate_all(procs)
    deadline = time.monotonic() + timeout
    while (left := [p for p in running if p.proc.poll() is None]) and time.monotonic() < deadline:
        await asyncio.sleep(STOP_POLL_S)
    for p in left:
        p.kill()
    while any(p.proc.poll() is None for p in left):
        await asyncio.sleep(STOP_POLL_S)


def _field_ref(pod: Pod, node: SimNode, pod_ip: str, path: str) -> str:
    assert pod.metadata is not None and pod.spec is not None
    values = {
        "metadata.name": pod.metadata.name or "", "metadata.namespace": pod.metadata.namespace or "",
        "metadata.uid": pod.metadata.uid or "", "spec.nodeName": node.name,
        "spec.serviceAccountName": pod.spec.serviceAccountName or "",
        "status.hostIP": node.address, "status.podIP": pod_ip,
    }
    if m := _META_KEY.fullmatch(path):  # metadata.labels['<key>'], metadata.annotations['<key>']
        return str((getattr(pod.metadata, m[1]) or {}).get(m[2], ""))
    return values.get(path, "")


_META_KEY = re.compile(r"metadata\.(labels|annotations)\['(.+)'\]")
_REF = re.compile(r"\$(\$|\(([^)]*)\))")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
    `$(NAME)` becomes NAME's value when defined, else stays as written; `$$` is a literal `$`."""
    def sub(m: re.Match[str]) -> str:
        if m[1] == "$":
            return "$"
        return env.get(m[2], m[0])
    return _REF.sub(sub, value)


def env_value(pod: Pod, node: SimNode, pod_ip: str, var: EnvVar, env: dict[str, str]) -> str:
    """One env entry's value: a downward-API field, else its value expanded against `env` (the
    entries before it: Kubernetes expands only earlier ones). Other sources (secrets, config maps)
    are empty: nothing here reads them."""
    if var.valueFrom is not None and var.valueFrom.fieldRef is not None:
        return _field_ref(pod, node, pod_ip, var.valueFrom.fieldRef.fieldPath)
    return expand(var.value or "", env)


def container_config(pod: Pod, node: SimNode, pod_ip: str, container: Container) -> dict[str, Any]:
    """What a kubelet hands the runtime for `container` (CRI's ContainerConfig): the env of its
    spec resolved in order, and command and args with `$(VAR)` expanded against it."""
    env: dict[str, str] = {}
    for var in container.env or []:
        env[var.name] = env_value(pod, node, pod_ip, var, env)
    return {"command": [expand(a, env) for a in container.command or []],
            "args": [expand(a, env) for a in container.args or []], "containerEnv": env}


def volume_dirs(node: SimNode, pod: Pod, files: dict[str, volumes.Files]) -> dict[str, Path]:
    """Volume name → directory on this node standing in for it; the configMap, secret,
    downwardAPI and projected ones hold `files` (volumes.contents)."""
    assert pod.metadata is not None and pod.spec is not None
    pod_dir = node.pod_dir(pod.metadata.uid or "")
    out: dict[str, Path] = {}
    host_paths = node.host_paths()
    for vol in pod.spec.volumes or []:
        if vol.hostPath is not None:
            path = vol.hostPath.path
            match = next((hp for hp in sorted(host_paths, key=len, reverse=True)
                          if path == hp or path.startswith(hp + "/")), None)
            if match is None:
                # Any other host path is private to this node (never the real host's); one that
                # holds node paths (/run/nvidia holds /run/nvidia/driver) has them, as links.
                out[vol.name] = node.host_dir(path)
                _link_node_paths(out[vol.name], path, host_paths)
            else:
                out[vol.name] = host_paths[match] / path[len(match):].lstrip("/")
        elif any(v is not None for v in (vol.projected, vol.emptyDir, vol.configMap, vol.secret, vol.downwardAPI)):
            out[vol.name] = pod_dir / "volumes" / vol.name
    for d in out.values():
        if not d.exists():
            d.mkdir(parents=True, exist_ok=True)  # DirectoryOrCreate; files (e.g. /proc/devices) exist
    for name, content in files.items():
        volumes.write(out[name], content)
    return out


def _link_node_paths(directory: Path, path: str, host_paths: dict[str, Path]) -> None:
    """In the node's directory for host path `path`, a link to each node path below it (what the
    parent of a node path shows on a real node: the driver root under /run/nvidia)."""
    for hp, where in host_paths.items():
        if not hp.startswith(path.rstrip("/") + "/"):
            continue
        link = directory / hp[len(path.rstrip("/")):].lstrip("/")
        if link.is_symlink() or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(where)


def hosts_file(pod: Pod, pod_ip: str) -> str:
    """The pod's /etc/hosts as the kubelet writes it: localhost, and the pod's own name at its IP
    (under its subdomain's Service when it has one)."""
    assert pod.metadata is not None and pod.spec is not None
    host = pod.spec.hostname or pod.metadata.name or ""
    names = [host]
    if pod.spec.subdomain:
        names.insert(0, f"{host}.{pod.spec.subdomain}.{pod.metadata.namespace or 'default'}.svc.cluster.local")
    return ("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            "fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n"
            f"{pod_ip}\t{chr(9).join(names)}\n")


def cdi_mounts_and_devices(host_view: Callable[[str], Path], cdi: ContainerEdits | None,
                           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The CDI edits' mounts and device nodes, for the container's root (rootfs.py), with host
    paths where `host_view` says the node has them."""
    mounts, devices = [], []
    for m in cdi.mounts if cdi else []:
        mounts.append({"source": str(host_view(m.host_path)), "target": m.container_path,
                       "readonly": "ro" in (m.options or [])})
    for d in cdi.device_nodes if cdi else []:
        major, minor, kind = d.major, d.minor, d.type
        if major is None and (host := host_view(d.host_path or d.path)).exists():
            rdev = host.stat().st_rdev
            major, minor, kind = os.major(rdev), os.minor(rdev), kind or "c"
        if major is not None:
            devices.append({"path": d.path, "type": kind or "c", "major": major, "minor": minor or 0,
                            "fileMode": d.file_mode})
    return mounts, devices


def image_mounts(image: str, program: ImageProgram) -> list[dict[str, Any]]:
    """The image's files (images.py), read-only at their image paths; FileNotFoundError (the pod's
    FailedSync event) naming the one that is not on this machine."""
    for target, source in sorted(program.files.items()):
        if not os.path.exists(source):
            raise FileNotFoundError(f"image {image}: its file {target} is {source} on this machine, which does not "
                                    "exist (nvlfabric-sim up --images)")
    return [{"source": source, "target": target, "readonly": True} for target, source in sorted(program.files.items())]


def start_pod_process(*, node: SimNode, pod: Pod, container: Container, program: ImageProgram, api_server: str,
                      files: dict[str, volumes.Files], shim: Path, extra_env: dict[str, str] | None = None,
                      cdi: ContainerEdits | None = None, pidns: str | None = None, own_pidns: bool = False,
                      pod_ip: str = "", netns: Path | None = None, resolv: str | None = None) -> PodProcess:
    """Start the container in a mount namespace of its own (rootfs.py): its volumes at their
    mount paths, the CDI edits of its claims applied (env, mounts, device nodes), the pod's
    /etc/hosts; its command and args as Kubernetes runs them. Nothing is rewritten. `netns`: the
    pod's network namespace at `pod_ip` (podnetwork.py); None: the node's (hostNetwork). `pidns`:
    the PID namespace it is made in; with `own_pidns` in a new one inside that (rootfs.py).
    `resolv`: the pod's /etc/resolv.conf (None: the machine's)."""
    pod_ip = pod_ip or node.address
    assert pod.metadata is not None
    dirs = volume_dirs(node, pod, files)
    api = urlparse(api_server)
    pod_dir = node.pod_dir(pod.metadata.uid or "")
    env: dict[str, str] = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **program.env,  # the image's ENV, under what the kubelet and the pod set
        "HOME": str(pod_dir),
        "HOSTNAME": pod.metadata.name or "",
        "KUBERNETES_SERVICE_HOST": api.hostname or "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port or 443),
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    for e in container.env or []:
        env[e.name] = env_value(pod, node, pod_ip, e, env)
    # Kubernetes' rules: `command` replaces the image's ENTRYPOINT, `args` its CMD; `$(VAR)` expanded.
    argv = program.argv([expand(c, env) for c in container.command or []],
                        [expand(a, env) for a in container.args or []])
    # The CDI env edits of its claims' devices, applied by the runtime over the spec's env (after
    # the kubelet's `$(VAR)` expansion, which knows only the spec's).
    env.update(dict(e.split("=", 1) for e in (cdi.env if cdi else []) if "=" in e))
    pod_dir.mkdir(parents=True, exist_ok=True)
    cdi_mounts, devices = cdi_mounts_and_devices(node.host_view, cdi)
    mounts = [{"source": str(dirs[m.name] / (m.subPath or "")), "target": m.mountPath, "readonly": bool(m.readOnly)}
              for m in container.volumeMounts or [] if m.name in dirs]
    image_files = image_mounts(container.image or "", program)
    hosts = pod_dir / "etc-hosts"
    hosts.write_text(hosts_file(pod, pod_ip))
    resolv_path = pod_dir / "etc-resolv.conf"
    if resolv is not None:
        resolv_path.write_text(resolv)
    root = pod_dir / "rootfs" / container.name
    root.mkdir(parents=True, exist_ok=True)
    spec = {"root": str(root), "mounts": [*image_files, *mounts, *cdi_mounts], "devices": devices, "hosts": str(hosts),
            "resolv": str(resolv_path) if resolv is not None else None,
            "cwd": container.workingDir or str(pod_dir), "argv": argv, "env": env, "pidns": pidns,
            "own_pidns": own_pidns, "netns": str(netns) if netns else None,
            "pid_file": str(pod_dir / f"{container.name}.pid"), "shim": str(shim),
            "proc_driver_nvidia": str(node.host_dir("/proc/driver/nvidia")), "proc_devices": str(node.proc_devices)}
    spec_path = pod_dir / f"{container.name}.container.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    launcher = [sys.executable, "-m", "nvlfabric.sim.kubelet.rootfs", str(spec_path)]
    return launch(pod_uid=pod.metadata.uid or "", pod_name=pod.metadata.name or "",
                  namespace=pod.metadata.namespace or "default", container=container, argv=launcher, env=env,
                  cwd=pod_dir, log_path=pod_dir / f"{container.name}.log")


def launch(*, pod_uid: str, pod_name: str, namespace: str, container: Container, argv: list[str],
           env: dict[str, str], cwd: Path, log_path: Path) -> PodProcess:
    """Start `argv` as the container's process, its output appended to `log_path`."""
    with contextlib.suppress(FileNotFoundError):  # the last instance's: its container is gone
        (cwd / f"{container.name}.pid").unlink()
    with log_path.open("ab") as fh:
        offset = fh.tell()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)
    # (`nvlfabric-sim fault agent-killed` finds the container through its pid file, which the
    # proxy writes with the container's own pid: rootfs.py.)
    return PodProcess(pod_uid=pod_uid, pod_name=pod_name, namespace=namespace, container=container, proc=proc,
                      log_path=log_path, argv=argv, env=env, cwd=cwd, log_offset=offset)
