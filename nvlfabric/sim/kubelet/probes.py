"""Container probes as the kubelet runs them, for the containers the simulated kubelet runs as processes.

A container's `startupProbe` runs first; until it passes neither of the others runs, and its
`failureThreshold` consecutive failures kill the container (which is then restarted as after a
crash). Then `readinessProbe` decides the container's `ready` (and so the pod's Ready condition:
a container with a readiness probe starts not ready) and `livenessProbe` kills the container after
`failureThreshold` consecutive failures. Each probe waits `initialDelaySeconds`, runs every
`periodSeconds`, gives up on one try after `timeoutSeconds`, and turns from failing to passing
after `successThreshold` passes; the defaults are the API's (0, 10, 1, 1, 3). Every failed try is
a Warning event `Unhealthy` ("Readiness probe failed: ..."), as the kubelet writes it.

The four handlers: `exec` (the command, its `$(VAR)`s expanded from the container's plain env
values as the kubelet does, inside the container: in its mount namespace, root and working
directory, by `nsenter`, with its environment; exit 0 passes), `httpGet` (a status from
200 to 399 passes; host: the pod's IP), `tcpSocket` (the connection opens) and `grpc` (the
standard health service answers SERVING). Containers that run nothing here have nothing to
probe: their probes are not run (their log says they are simulated).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvlfabric.sim.kubelet.processes import expand

KINDS = ("startup", "readiness", "liveness")


@dataclass(frozen=True)
class Probe:
    kind: str
    spec: Any
    """The container's probe (lightkube's model)."""
    env: tuple[Any, ...] = ()
    """The container's env entries (lightkube's EnvVar): what an exec probe's command expands."""

    @property
    def initial_delay_s(self) -> float:
        return float(self.spec.initialDelaySeconds or 0)

    @property
    def period_s(self) -> float:
        return float(self.spec.periodSeconds or 10)

    @property
    def timeout_s(self) -> float:
        return float(self.spec.timeoutSeconds or 1)

    @property
    def success_threshold(self) -> int:
        return int(self.spec.successThreshold or 1)

    @property
    def failure_threshold(self) -> int:
        return int(self.spec.failureThreshold or 3)

    @property
    def title(self) -> str:
        return self.kind.capitalize()


def probes_of(container: Any) -> dict[str, Probe]:
    """The container's probes by kind."""
    return {kind: Probe(kind, spec, tuple(getattr(container, "env", None) or ()))
            for kind in KINDS if (spec := getattr(container, f"{kind}Probe", None))}


@dataclass
class Counter:
    """Consecutive results of one probe and the verdict they give (pure)."""

    passing: bool
    successes: int = 0
    failures: int = 0

    def observe(self, ok: bool, probe: Probe) -> bool | None:
        """Record one try; the new verdict when it changes, else None."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if not self.passing and self.successes >= probe.success_threshold:
                self.passing = True
                return True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.passing and self.failures >= probe.failure_threshold:
                self.passing = False
                return False
        return None


def _port(value: Any, ports: dict[str, int]) -> int:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    if value in ports:
        return ports[value]
    raise ValueError(f"port {value!r} is not a port of the container")


async def _exec(command: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[bool, str]:
    proc = await asyncio.create_subprocess_exec(*command, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return False, f"command timed out after {timeout_s:g}s"
    text = out.decode(errors="replace").strip()
    if proc.returncode == 0:
        return True, text
    # The kubelet's event is the probe's own output (how it runs the command is no one's business:
    # ours is an nsenter); its exit status only when it printed nothing.
    return False, text[:1024] if text else f"command exited with {proc.returncode}"


async def _http(spec: Any, host: str, port: int, timeout_s: float) -> tuple[bool, str]:
    scheme = (spec.scheme or "HTTP").upper()
    ctx = None
    if scheme == "HTTPS":  # the kubelet does not verify a probe's certificate
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    reader, writer = await asyncio.wait_for(asyncio.open_connection(spec.host or host, port, ssl=ctx), timeout_s)
    try:
        headers = "".join(f"{h.name}: {h.value}\r\n" for h in spec.httpHeaders or [])
        writer.write(f"GET {spec.path or '/'} HTTP/1.1\r\nHost: {spec.host or host}:{port}\r\n"
                     f"User-Agent: kube-probe/1.37\r\n{headers}Connection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout_s)
    finally:
        writer.close()
    parts = status_line.decode(errors="replace").split(" ", 2)
    code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if 200 <= code < 400:
        return True, f"HTTP probe succeeded with statuscode: {code}"
    return False, f"HTTP probe failed with statuscode: {code}"


async def _grpc(spec: Any, host: str, timeout_s: float) -> tuple[bool, str]:
    async with grpc.aio.insecure_channel(f"{host}:{spec.port}") as channel:
        try:
            resp = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=spec.service or ""), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return False, f"failed to connect service {host}:{spec.port} within {timeout_s:g}s: {exc.code().name}"
    if resp.status == health_pb2.HealthCheckResponse.SERVING:
        return True, "SERVING"
    return False, f"service unhealthy (responded with {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)})"


async def check(probe: Probe, *, host: str, ports: dict[str, int], env: dict[str, str], cwd: Path,
                enter: int | None = None) -> tuple[bool, str]:
    """Run one try of the probe: (passed, what it saw). `host`: the pod's IP. `enter`: the
    container's pid, whose mount and network namespaces, root and working directory an exec probe
    runs in."""
    spec = probe.spec
    try:
        if spec.exec is not None:
            # As the kubelet's prober (ExpandContainerCommandOnlyStatic): `$(VAR)` from the
            # container's env entries with a plain `value` only, not the downward API's.
            static = {v.name: v.value or "" for v in probe.env if v.valueFrom is None}
            command = [expand(a, static) for a in spec.exec.command or []]
            if enter is not None:
                command = ["nsenter", "-t", str(enter), "-m", "-n", "-r", "-w", "--", *command]
            return await _exec(command, env, cwd, probe.timeout_s)
        if spec.httpGet is not None:
            return await _http(spec.httpGet, host, _port(spec.httpGet.port, ports), probe.timeout_s)
        if spec.tcpSocket is not None:
            port = _port(spec.tcpSocket.port, ports)
            _, writer = await asyncio.wait_for(asyncio.open_connection(spec.tcpSocket.host or host, port),
                                               probe.timeout_s)
            writer.close()
            return True, f"connected to {host}:{port}"
        if spec.grpc is not None:
            return await _grpc(spec.grpc, host, probe.timeout_s)
    except TimeoutError:
        return False, f"timed out after {probe.timeout_s:g}s"
    except (OSError, ValueError) as exc:
        return False, str(exc)
    return False, "the probe has no handler (exec, httpGet, tcpSocket or grpc)"
