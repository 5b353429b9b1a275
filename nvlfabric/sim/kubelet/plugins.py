"""The kubelet's side of the DRA plugin contract: discovery, registration, prepare, unprepare.

Behaviour follows the real kubelet (1.34 to 1.37):
- plugins are discovered as sockets in `<kubelet root>/plugins_registry/` (names starting with '.'
  are ignored); `GetInfo` has a 1 s timeout; the first of the plugin's `supported_versions` that
  this kubelet knows (v1.DRAPlugin, v1beta1.DRAPlugin) is used, none is a registration error;
  `NotifyRegistrationStatus` tells the plugin the outcome;
- `NodePrepareResources` / `NodeUnprepareResources` are called once per driver with that driver's
  claims, with a 45 s timeout; a gRPC error discards the whole response; a claim missing from the
  response is an error; per-claim `error` strings fail just those claims;
- a plugin that advertises `v1alpha1.DRAResourceHealth` is watched with `NodeWatchResources`
  (devicehealth.py: what the kubelet does with the reports).
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

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
from nvlfabric.sim.kubelet.devicehealth import HEALTHY, UNHEALTHY, UNKNOWN, Reported

GET_INFO_TIMEOUT_S = 1.0
CALL_TIMEOUT_S = names.KUBELET_PREPARE_TIMEOUT_S
# In the kubelet's order of knowledge; the plugin's own order decides which is used.
KNOWN_SERVICES = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
                  "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
# 1.37 prefers v1.DRAResourceHealth when advertised; its messages are v1alpha1's, and we have only those.
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
_HEALTH = {dra_health_v1alpha1_pb2.HEALTHY: HEALTHY, dra_health_v1alpha1_pb2.UNHEALTHY: UNHEALTHY}


class RegistrationError(Exception):
    pass


class PluginCallError(Exception):
    """The call failed as a whole (gRPC error, timeout, missing claims)."""




@dataclass
class Plugin:
    driver: str
    endpoint: str
    service: str
    registration_socket: Path
    health_service: str = ""
    """HEALTH_SERVICE when the plugin advertised it, else ''."""
    socket_id: tuple[int, int] = (0, 0)
    """The registration socket's (inode, ctime) when it was registered: a plugin restarted on the same
    path between two scans is a new socket, registered again (the kubelet's watcher sees its create)."""
    _channel: grpc.aio.Channel | None = field(default=None, repr=False)

    def _stub(self) -> Any:
        if self._channel is None:
            # Dialled lazily, as the kubelet does, with insecure credentials over the unix socket.
            self._channel = grpc.aio.insecure_channel(f"unix:{self.endpoint}")
        _, grpc_mod = KNOWN_SERVICES[self.service]
        return grpc_mod.DRAPluginStub(self._channel)

    def _pb(self) -> Any:
        return KNOWN_SERVICES[self.service][0]

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        """Per claim UID: the prepared devices, or the plugin's error string for that claim."""
        pb = self._pb()
        req = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims])
        try:
            resp = await self._stub().NodePrepareResources(req, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise PluginCallError(f"NodePrepareResources on {self.driver}: {exc.code().name}: {exc.details()}") from exc
        missing = [c.uid for c in claims if c.uid not in resp.claims]
        if missing:
            raise PluginCallError(f"NodePrepareResources skipped {len(missing)} ResourceClaims")
        out: dict[str, list[PreparedDevice] | str] = {}
        for c in claims:
            result = resp.claims[c.uid]
            out[c.uid] = result.error or [
                PreparedDevice(request_names=tuple(d.request_names), pool_name=d.pool_name,
                               device_name=d.device_name, cdi_device_ids=tuple(d.cdi_device_ids))
                for d in result.devices]
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID: the plugin's error string ('' on success)."""
        pb = self._pb()
        req = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims])
        try:
            resp = await self._stub().NodeUnprepareResources(req, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise PluginCallError(f"NodeUnprepareResources on {self.driver}: {exc.code().name}: "
                                  f"{exc.details()}") from exc
        missing = [c.uid for c in claims if c.uid not in resp.claims]
        if missing:
            raise PluginCallError(f"NodeUnprepareResources skipped {len(missing)} ResourceClaims")
        return {c.uid: resp.claims[c.uid].error for c in claims}

    async def watch_health(self) -> AsyncIterator[list[Reported]]:
        """The plugin's health reports, one complete device list each, until the stream ends
        (a gRPC error is raised as grpc.aio.AioRpcError)."""
        self._stub()  # dials the channel
        stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self._channel)
        async for resp in stub.NodeWatchResources(dra_health_v1alpha1_pb2.NodeWatchResourcesRequest()):
            yield [Reported(pool=d.device.pool_name, device=d.device.device_name, health=_HEALTH.get(d.health, UNKNOWN),
                            message=d.message, timeout_s=float(d.health_check_timeout_seconds))
                   for d in resp.devices]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


async def register(socket: Path, *, registered_endpoints: set[str],
                   host_view: Callable[[str], str] = str) -> Plugin:
    """Run the kubelet's registration handshake against one registry socket. `host_view`: where
    the endpoint the plugin names (a path of the node's host, as a plugin in a container sees it
    through its hostPath volume) is for this process."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        try:
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(f"GetInfo on {socket}: {exc.code().name}: {exc.details()}") from exc
        error = ""
        service = next((v for v in info.supported_versions if v in KNOWN_SERVICES), "")
        endpoint = host_view(info.endpoint) if info.endpoint else str(socket)
        if info.type != "DRAPlugin":
            error = f"unsupported plugin type {info.type!r}"
        elif not info.name:
            error = "plugin did not report a driver name"
        elif not service:
            error = (f"none of the plugin's supported versions {list(info.supported_versions)} is known "
                     f"to this kubelet ({', '.join(KNOWN_SERVICES)})")
        elif not Path(endpoint).is_absolute():
            error = f"endpoint {endpoint!r} is not an absolute path"
        elif endpoint in registered_endpoints:
            error = f"endpoint {endpoint} already registered"
        status = pluginregistration_pb2.RegistrationStatus(plugin_registered=not error, error=error)
        try:
            await stub.NotifyRegistrationStatus(status, timeout=GET_INFO_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(f"NotifyRegistrationStatus on {socket}: {exc.code().name}") from exc
        if error:
            raise RegistrationError(f"{socket}: {error}")
        return Plugin(driver=info.name, endpoint=endpoint, service=service, registration_socket=socket,
                      health_service=HEALTH_SERVICE if HEALTH_SERVICE in info.supported_versions else "")


def registry_sockets(registry_dir: Path) -> dict[Path, tuple[int, int]]:
    """The registration sockets present, each with its (inode, ctime) identity."""
    found: dict[Path, tuple[int, int]] = {}
    try:
        entries = list(registry_dir.iterdir())
    except FileNotFoundError:
        return found
    for p in entries:
        if p.name.startswith("."):
            continue
        try:
            st = p.stat()
        except FileNotFoundError:  # removed while listing
            continue
        if stat.S_ISSOCK(st.st_mode):
            found[p] = (st.st_ino, st.st_ctime_ns)
    return found


async def sleep_until(deadline: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, deadline - loop.time()))
