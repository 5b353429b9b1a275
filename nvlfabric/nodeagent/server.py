"""The node agent's gRPC surface: kubelet plugin registration and the DRA service (v1, v1beta1).

Layout, as the kubelet expects it (all under a configurable kubelet root):
    <root>/plugins/<driver>/dra.sock            DRA v1 + v1beta1 on one socket
    <root>/plugins_registry/<driver>-reg.sock   registration (GetInfo, NotifyRegistrationStatus)

The DRA server starts before the registration socket appears (the kubelet dials the endpoint as
soon as it sees the registration socket). Sockets are owner-only (0600): only root, i.e. the
kubelet, may talk to the agent. GetInfo does nothing but return constants, because the kubelet
gives it 1 s. On stop, the agent removes exactly its own sockets.

This module knows nothing about IMEX or claims: it translates between the wire and a `Driver`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from nvlfabric.api import names
from nvlfabric.api.kubelet import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.nodeagent import metrics, probes

__all__ = ["ClaimRef", "DeviceHealth", "Driver", "PluginServer", "PreparedDevice", "SocketPaths"]

log = logging.getLogger("nvlfabric.nodeagent.server")

# v1 first: kubelets 1.34+ take the first entry they know, in our order; 1.32-1.33 know v1beta1.
# The health service is advertised only when the agent has a health source.
DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_VERSION = "v1alpha1.DRAResourceHealth"
HEALTH_INTERVAL_S = 10.0  # a full list at least this often; the kubelet's default timeout is 30 s


@dataclass(frozen=True)
class DeviceHealth:
    pool_name: str
    device_name: str
    healthy: bool
    message: str = ""


HealthSource = Callable[[], list[DeviceHealth]]




class Driver(Protocol):
    """What the server needs from the agent: per-claim results, never an exception per claim."""

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        """Claim UID → prepared devices, or an error string the kubelet will retry on."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID → '' on success, else an error string."""
        ...


@dataclass(frozen=True)
class SocketPaths:
    kubelet_root: Path
    driver: str

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration(self) -> Path:
        return self.kubelet_root / "plugins_registry" / f"{self.driver}-reg.sock"

    def check(self) -> None:
        for path in (self.endpoint, self.registration):
            size = len(os.fsencode(path))  # bytes, as sun_path holds them: not characters
            if size > names.MAX_UNIX_SOCKET_PATH:
                raise ValueError(f"socket path {path} is {size} bytes; unix sockets allow "
                                 f"{names.MAX_UNIX_SOCKET_PATH}. Use a shorter kubelet root (--kubelet-root) or "
                                 "driver name.")


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _prepare_response(pb: Any, results: dict[str, list[PreparedDevice] | str], claims: list[ClaimRef]) -> Any:
    resp = pb.NodePrepareResourcesResponse()
    for claim in {c.uid: c for c in claims}.values():  # a claim named twice is answered once
        result = results.get(claim.uid, "internal error: the driver returned no result for this claim")
        entry = resp.claims[claim.uid]
        if isinstance(result, str):
            entry.error = result
            continue
        for d in result:
            entry.devices.append(pb.Device(request_names=list(d.request_names), pool_name=d.pool_name,
                                           device_name=d.device_name, cdi_device_ids=list(d.cdi_device_ids)))
    return resp


def _unprepare_response(pb: Any, results: dict[str, str], claims: list[ClaimRef]) -> Any:
    resp = pb.NodeUnprepareResourcesResponse()
    for claim in claims:
        resp.claims[claim.uid].error = results.get(claim.uid, "internal error: no result for this claim")
    return resp


def _observe(histogram: Any, seconds: float, claims: list[ClaimRef], errors: int, operation: str) -> None:
    for _ in claims:
        histogram.observe(seconds / len(claims))
    if errors:
        metrics.CLAIM_ERRORS.labels(operation).inc(errors)


def _dra_servicer(base: type, pb: Any, driver: Driver) -> Any:
    class Servicer(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            claims = _claims(request)
            t0 = time.perf_counter()
            results = driver.prepare(claims)
            _observe(metrics.PREPARE_SECONDS, time.perf_counter() - t0, claims,
                     sum(isinstance(r, str) for r in results.values()), "prepare")
            return _prepare_response(pb, results, claims)

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            claims = _claims(request)
            t0 = time.perf_counter()
            results = driver.unprepare(claims)
            _observe(metrics.UNPREPARE_SECONDS, time.perf_counter() - t0, claims,
                     sum(bool(r) for r in results.values()), "unprepare")
            return _unprepare_response(pb, results, claims)

    return Servicer()


class _Health(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """Streams the complete device list with its health, on change and every HEALTH_INTERVAL_S."""

    def __init__(self, source: HealthSource, stopping: threading.Event) -> None:
        self.source = source
        self.stopping = stopping

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb = dra_health_v1alpha1_pb2
        last: list[DeviceHealth] | None = None
        sent_at = 0.0
        while context.is_active() and not self.stopping.is_set():
            current = self.source()
            if (current is not last and current != last) or time.monotonic() - sent_at >= HEALTH_INTERVAL_S:
                yield pb.NodeWatchResourcesResponse(devices=[pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                    health=pb.HEALTHY if d.healthy else pb.UNHEALTHY, last_updated_time=int(time.time()),
                    health_check_timeout_seconds=int(3 * HEALTH_INTERVAL_S), message=d.message[:1024])
                    for d in current])
                last, sent_at = current, time.monotonic()
            self.stopping.wait(1.0)


class _Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver_name: str, endpoint: Path, versions: Sequence[str]) -> None:
        self._info = pluginregistration_pb2.PluginInfo(
            type="DRAPlugin", name=driver_name, endpoint=str(endpoint), supported_versions=list(versions))
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            log.info("registered with the kubelet")
            self.error = ""
            self.registered.set()
        else:
            log.error("the kubelet refused the registration: %s", request.error)
            self.error = request.error
        return pluginregistration_pb2.RegistrationStatusResponse()


def _listen(server: grpc.Server, address: str, failure: str) -> None:
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio ≥ 1.60 raises where older ones returned 0
        raise OSError(f"{failure} ({exc})") from None
    if bound == 0:
        raise OSError(failure)


class PluginServer:
    """The agent's kubelet-facing gRPC server (registration and DRA sockets); `start()` then `stop()`."""

    def __init__(self, *, paths: SocketPaths, driver: Driver, workers: int = 8,
                 health: HealthSource | None = None, health_port: int = 0, listen_address: str = "") -> None:
        """`health`: the devices' health for the kubelet's DRA health stream; `health_port`
        (0: none): serve the standard gRPC health service for the probes on listen_address:port.
        `workers` covers a health stream per kubelet connection, two probes at once, the calls
        each probe makes back into this server, and the kubelet's own calls."""
        paths.check()
        self.paths = paths
        self.driver = driver
        self.health = health
        self._stopping = threading.Event()
        versions = (*DRA_VERSIONS, HEALTH_VERSION) if health is not None else DRA_VERSIONS
        self.registration = _Registration(paths.driver, paths.endpoint, versions)
        self._workers = workers
        self._liveness = (health_port, listen_address)
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        """One gRPC server listening on both sockets (the DRA endpoint, then the registration
        socket the kubelet's plugin watcher looks for) and the probes' health port: one completion
        queue and thread pool, not three, in a process with a memory budget whose every gRPC server
        polls. Both sockets are the kubelet's, owner-only."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1_pb2_grpc.DRAPluginServicer, dra_v1_pb2, self.driver), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1beta1_pb2_grpc.DRAPluginServicer, dra_v1beta1_pb2, self.driver), server)
        if self.health is not None:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                _Health(self.health, self._stopping), server)
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
        port, address = self._liveness
        if port > 0:  # first: a port in use fails the start before a socket appears
            probes.add_to(server, registration=self.paths.registration, endpoint=self.paths.endpoint,
                            registered=self.registration.registered)
            _listen(server, f"{address or '[::]'}:{port}",
                    f"health service: cannot listen on {address or '*'}:{port}; choose another --health-port")
        # The sockets are created by bind() with the umask; 0600 from the first moment, not chmod'ed later.
        old = os.umask(0o177)
        try:
            for path in (self.paths.endpoint, self.paths.registration):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.unlink(missing_ok=True)  # a stale socket of a previous instance of *this* agent
                _listen(server, f"unix:{path}", f"could not listen on {path}")
            server.start()
        finally:
            os.umask(old)
        self._servers.append(server)
        log.info("serving DRA on %s, registration on %s", self.paths.endpoint, self.paths.registration)

    def stop(self, grace: float = 5.0) -> None:
        self._stopping.set()  # ends open health streams
        # The registration socket goes first: the kubelet's plugin watcher deregisters the driver
        # and stops routing calls before the endpoint closes (in-flight calls get `grace`).
        self.paths.registration.unlink(missing_ok=True)
        for server in self._servers:
            server.stop(grace).wait()
        self._servers.clear()
        for path in (self.paths.registration, self.paths.endpoint):
            path.unlink(missing_ok=True)
