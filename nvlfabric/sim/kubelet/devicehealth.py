"""The kubelet's side of DRA device health: the cache the plugins' health streams fill, and the
pods' `status.containerStatuses[].allocatedResourcesStatus` written from it.

As the real kubelet 1.37 does (pkg/kubelet/cm/dra: healthinfo.go, manager.go
UpdateAllocatedResourcesStatus, plugin/dra_plugin_manager.go):
- a registered plugin advertising a health service gets one `NodeWatchResources` stream, opened
  again 5 s after it ends; each message is the driver's complete device list;
- a device is Healthy/Unhealthy as last reported, and Unknown when never reported, when its
  report is older than its `health_check_timeout_seconds` (≤ 0: 30 s), or after the stream ended
  (the driver's entries are dropped);
- a change of a device's health re-writes the status of the pods whose prepared claims hold it;
- per container, for each of its `resources.claims`, an entry `claim:<name>` (or
  `claim:<name>/<request>`) lists the claim's prepared devices of that request, each with
  `resourceID` = its first CDI device ID (else `<driver>/<pool>/<device>`), `health`, and
  `message` (gate ResourceHealthStatusMessage, on since 1.36; at most 1024 characters);
  entries without devices are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube.resources.core_v1 import Pod

from nvlfabric.api.kubelet.types import PreparedDevice

DEFAULT_TIMEOUT_S = 30.0
STREAM_RETRY_S = 5.0
MESSAGE_MAX = 1024
HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"

DeviceKey = tuple[str, str, str]  # driver, pool, device
Prepared = Mapping[str, Mapping[str, Sequence[PreparedDevice]]]
"""ResourceClaim name → driver → the devices its NodePrepareResources returned (one pod's claims)."""


@dataclass(frozen=True)
class Reported:
    """One device in a plugin's health message."""

    pool: str
    device: str
    health: str  # HEALTHY, UNHEALTHY or UNKNOWN
    message: str = ""
    timeout_s: float = 0.0  # ≤ 0: DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class _Entry:
    health: str
    message: str
    at: float
    timeout_s: float

    def stale(self, now: float) -> bool:
        return now - self.at > (self.timeout_s if self.timeout_s > 0 else DEFAULT_TIMEOUT_S)


class HealthCache:
    """Device health per driver, as the plugins reported it; `now` is a monotonic clock reading."""

    def __init__(self) -> None:
        self._entries: dict[DeviceKey, _Entry] = {}

    def get(self, driver: str, pool: str, device: str, now: float) -> tuple[str, str]:
        """(health, message); Unknown without a message when never reported or stale."""
        e = self._entries.get((driver, pool, device))
        if e is None or e.stale(now):
            return UNKNOWN, ""
        return e.health, e.message

    def update(self, driver: str, devices: Iterable[Reported], now: float) -> set[DeviceKey]:
        """Take one complete report; returns the devices whose health or message changed (those
        reported differently, and those of the driver gone stale, which turn Unknown)."""
        changed: set[DeviceKey] = set()
        seen: set[DeviceKey] = set()
        for d in devices:
            key = (driver, d.pool, d.device)
            seen.add(key)
            old = self._entries.get(key)
            new = _Entry(d.health, d.message[:MESSAGE_MAX], now, d.timeout_s)
            if old is None or old.stale(now) or (old.health, old.message) != (new.health, new.message):
                changed.add(key)
            self._entries[key] = new
        for key, e in list(self._entries.items()):
            if key[0] == driver and key not in seen and e.stale(now):
                del self._entries[key]  # absent reads as Unknown
                if e.health != UNKNOWN:
                    changed.add(key)
        return changed

    def clear(self, driver: str) -> set[DeviceKey]:
        """The driver's stream ended: its devices turn Unknown; returns those that were not."""
        gone = {k for k in self._entries if k[0] == driver}
        changed = {k for k in gone if self._entries[k].health != UNKNOWN}
        for k in gone:
            del self._entries[k]
        return changed


def uses(prepared: Prepared, keys: set[DeviceKey]) -> bool:
    """Whether one pod's prepared claims hold any of these devices."""
    return any((driver, d.pool_name, d.device_name) in keys
               for by_driver in prepared.values() for driver, devices in by_driver.items() for d in devices)


def _claim_names(pod: Pod) -> dict[str, str]:
    """Pod-level claim name → ResourceClaim name (status first, then the spec's direct reference)."""
    out = {s.name: s.resourceClaimName for s in (pod.status.resourceClaimStatuses or []) if s.resourceClaimName} \
        if pod.status else {}
    for rc in (pod.spec.resourceClaims or []) if pod.spec else []:
        if rc.resourceClaimName and rc.name not in out:
            out[rc.name] = rc.resourceClaimName
    return out


def allocated_resources_status(pod: Pod, prepared: Prepared, cache: HealthCache,
                               now: float) -> dict[str, list[dict[str, Any]]]:
    """Container name → its `allocatedResourcesStatus` (containers without one are left out)."""
    claim_names = _claim_names(pod)
    out: dict[str, list[dict[str, Any]]] = {}
    for container in pod.spec.containers if pod.spec else []:
        entries = []
        for ref in (container.resources.claims or []) if container.resources else []:
            actual = claim_names.get(ref.name)
            if actual is None or actual not in prepared:
                continue
            base_request = (ref.request or "").split("/", 1)[0]  # a subrequest reports as its request
            resources: list[dict[str, Any]] = []
            seen: set[str] = set()
            for driver, devices in prepared[actual].items():
                for d in devices:
                    if ref.request and d.request_names and base_request not in d.request_names:
                        continue
                    rid = d.cdi_device_ids[0] if d.cdi_device_ids else f"{driver}/{d.pool_name}/{d.device_name}"
                    if rid in seen:
                        continue
                    seen.add(rid)
                    health, message = cache.get(driver, d.pool_name, d.device_name, now)
                    resources.append({"resourceID": rid, "health": health, **({"message": message} if message else {})})
            if resources:
                entries.append({"name": f"claim:{ref.name}" + (f"/{ref.request}" if ref.request else ""),
                                "resources": resources})
        if entries:
            out[container.name] = entries
    return out
