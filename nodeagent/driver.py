"""Prepare and unprepare of ComputeDomain channel claims on this node.

Prepare, per claim (all calls serialised under one lock; the kubelet may call concurrently):
1. already PrepareCompleted in the checkpoint → return the stored devices (idempotent, fast);
2. GET the claim: it must still have the requested UID ("got replaced" otherwise), be allocated,
   hold a result of our driver from a clique pool, and that clique must be this node's;
3. decode our opaque config strictly (provider/api/channelconfig.py);
4. record PrepareStarted in the checkpoint (before any side effect);
5. make sure the IMEX domain the claim needs runs here and is READY (clique-scoped: the clique's
   persistent domain, members = the clique's Nodes; dedicated: not built yet → clear error);
6. create the channel device node under the driver root (major from /proc/devices), write the CDI
   spec atomically;
7. record PrepareCompleted, report this node's entry in the ComputeDomain's status.
Every failure becomes that claim's error string, which the kubelet retries; a step that cannot
finish inside the kubelet's 45 s budget gives up early with a message saying so.

Unprepare: unknown claim → success; started → aborted (a stale prepare retry is then refused);
completed → CDI spec and checkpoint entry removed, the channel node released when no other
prepared claim uses that channel, this node's status entry withdrawn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType
from pydantic import ValidationError

from nodeagent import cdi, checkpoint, imex, pools
from nodeagent.controller import ComputeDomainResource
from nodeagent.server import ClaimRef, PreparedDevice
from provider.api import computedomain as api
from provider.api.channelconfig import DRIVER, ChannelConfig

log = logging.getLogger("nvlfabric.nodeagent.driver")
KUBELET_BUDGET_S = 45.0
IMEX_READY_BUDGET_S = 30.0  # leaves the rest of the kubelet's 45 s for the other steps


class PrepareError(Exception):
    """This claim cannot be prepared now; the message is what the kubelet (and the user) sees."""


@dataclass(frozen=True)
class NodeIdentity:
    name: str
    address: str
    clique: str | None


@dataclass(frozen=True)
class Paths:
    plugin_dir: Path
    cdi_dir: Path
    driver_root: Path
    proc_devices: Path = Path("/proc/devices")
    boot_id: Path = checkpoint.DEFAULT_BOOT_ID_PATH

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def imex_workdir(self) -> Path:
        return self.plugin_dir / "imex"


def _now() -> datetime:
    return datetime.now(UTC)


class ChannelDriver:
    def __init__(self, *, client: Client, node: NodeIdentity, paths: Paths,
                 clock: Callable[[], datetime] = _now) -> None:
        self.client = client
        self.node = node
        self.paths = paths
        self.clock = clock
        self._lock = threading.Lock()
        self._domains: dict[str, imex.ImexDomain] = {}
        paths.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.state, report = checkpoint.load(paths.checkpoint, paths.boot_id, clock=clock)
        if not report.ok:
            log.warning("checkpoint: %s", report)
        self._major: int | None = None

    # -- the kubelet's calls ----------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        deadline = time.monotonic() + KUBELET_BUDGET_S - 5
        out: dict[str, list[PreparedDevice] | str] = {}
        with self._lock:
            for c in claims:
                try:
                    out[c.uid] = self._prepare_one(c, deadline)
                except PrepareError as exc:
                    out[c.uid] = str(exc)
                except (ApiError, OSError, checkpoint.CheckpointError, imex.ImexError) as exc:
                    log.warning("prepare %s/%s: %s", c.namespace, c.name, exc)
                    out[c.uid] = f"prepare of claim {c.namespace}/{c.name} failed: {exc}"
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._lock:
            for c in claims:
                try:
                    self._unprepare_one(c)
                    out[c.uid] = ""
                except (ApiError, OSError, checkpoint.CheckpointError) as exc:
                    out[c.uid] = f"unprepare of claim {c.namespace}/{c.name} failed: {exc}"
        return out

    # -- prepare ---------------------------------------------------------------------------------

    def _devices(self, entry: checkpoint.ClaimEntry, pool: str, device: str, request: str) -> list[PreparedDevice]:
        return [PreparedDevice((request,), pool, device, entry.cdi_device_ids)]

    def _prepare_one(self, c: ClaimRef, deadline: float) -> list[PreparedDevice]:
        claim = self._get_claim(c)
        pool, device, request, config = self._validate(c, claim)
        channel = int(device.removeprefix("channel-"))
        entry = self.state.get(c.uid)
        if entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED:
            return self._devices(entry, pool, device, request)
        clique = pool.removeprefix("clique-")
        domain_id = f"clique-{clique}" if config.imex_mode is api.IMEXMode.CLIQUE_SCOPED else \
            f"cd-{config.compute_domain.uid}"
        allocation = checkpoint.Allocation(
            compute_domain_uid=config.compute_domain.uid, compute_domain_name=config.compute_domain.name,
            channels=(channel,), imex_domain_id=domain_id)
        ref = checkpoint.ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name)
        try:
            self._save(checkpoint.start_prepare(self.state, ref, allocation, now=self.clock()))
        except checkpoint.StalePrepareRejected as exc:
            raise PrepareError(f"claim {c.namespace}/{c.name}: {exc}") from exc

        if config.imex_mode is api.IMEXMode.DEDICATED:
            raise PrepareError("imexMode Dedicated is not supported by this agent version yet; "
                               "use CliqueScoped (the default)")
        self._ensure_clique_domain(clique, domain_id, deadline)
        major = self._channel_major()
        cdi.channel_device_node(self.paths.driver_root, channel, major)
        spec = cdi.claim_spec(claim_uid=c.uid, channels=[channel], major=major,
                              compute_domain=config.compute_domain.name)
        written = cdi.write_claim_spec(self.paths.cdi_dir, c.uid, spec)
        self._save(checkpoint.complete_prepare(self.state, c.uid, cdi_spec_file=str(written.path),
                                               cdi_device_ids=written.device_ids, now=self.clock()))
        self._report(config, ready=True, message=None)
        entry = self.state.get(c.uid)
        assert entry is not None
        return self._devices(entry, pool, device, request)

    def _get_claim(self, c: ClaimRef) -> ResourceClaim:
        try:
            claim = self.client.get(ResourceClaim, c.name, namespace=c.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                raise PrepareError(f"claim {c.namespace}/{c.name} does not exist (any more)") from exc
            raise
        live_uid = claim.metadata.uid if claim.metadata else None
        if live_uid != c.uid:
            raise PrepareError(f"claim {c.namespace}/{c.name} got replaced: its UID is {live_uid}, "
                               f"not the requested {c.uid}")
        return claim

    def _validate(self, c: ClaimRef, claim: ResourceClaim) -> tuple[str, str, str, ChannelConfig]:
        alloc = claim.status.allocation if claim.status else None
        if alloc is None or alloc.devices is None:
            raise PrepareError(f"claim {c.namespace}/{c.name} is not allocated")
        ours = [r for r in alloc.devices.results or [] if r.driver == DRIVER]
        if not ours:
            raise PrepareError(f"claim {c.namespace}/{c.name} has no device of driver {DRIVER}")
        result = ours[0]
        if not (result.pool.startswith("clique-") and result.device.startswith("channel-")):
            raise PrepareError(f"claim {c.namespace}/{c.name}: device {result.pool}/{result.device} is not a channel")
        clique = result.pool.removeprefix("clique-")
        if clique != self.node.clique:
            raise PrepareError(f"claim {c.namespace}/{c.name} was allocated in clique {clique}, but node "
                               f"{self.node.name} is in clique {self.node.clique or '(none: fabric not ready)'}")
        raw = [cfg.opaque.parameters for cfg in alloc.devices.config or []
               if cfg.opaque is not None and cfg.opaque.driver == DRIVER]
        if not raw:
            raise PrepareError(f"claim {c.namespace}/{c.name} carries no {DRIVER} configuration; create "
                               "ComputeDomains with nvlfabric (its claim names the ComputeDomain)")
        try:
            config = ChannelConfig.model_validate(raw[-1])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(config)"
            raise PrepareError(f"claim {c.namespace}/{c.name}: invalid {DRIVER} config at {where}: "
                               f"{first['msg']}") from exc
        return result.pool, result.device, result.request.split("/")[0], config

    def _channel_major(self) -> int:
        if self._major is None:
            self._major = cdi.read_major(self.paths.proc_devices, "nvidia-caps-imex-channels")
        return self._major

    def _clique_members(self, clique: str) -> list[str]:
        members = []
        for n in self.client.list(Node, labels={pools.CLIQUE_LABEL: clique}):
            addrs = {a.type: a.address for a in (n.status.addresses or [])} if n.status else {}
            if "InternalIP" in addrs:
                members.append(addrs["InternalIP"])
        if self.node.address not in members:
            members.append(self.node.address)
        return members

    def _ensure_clique_domain(self, clique: str, domain_id: str, deadline: float) -> None:
        domain = self._domains.get(domain_id)
        if domain is None:
            domain = imex.ImexDomain(domain_id=domain_id, workdir=self.paths.imex_workdir,
                                     driver_root=self.paths.driver_root, bind_address=self.node.address)
            self._domains[domain_id] = domain
        members = self._clique_members(clique)
        if domain.poll() is not None or domain.pid is None:
            domain.ensure_running(members)
        else:
            domain.update_members(members)
        budget = min(IMEX_READY_BUDGET_S, deadline - time.monotonic())
        try:
            if budget <= 0:
                raise imex.ImexNotReady("no time left in the kubelet's 45 s budget", domain.query())
            domain.wait_ready(budget)
        except imex.ImexError as exc:
            raise PrepareError(f"IMEX daemon for clique {clique} on node {self.node.name} is not ready yet "
                               f"({exc}); the kubelet will retry") from exc

    def _save(self, cp: checkpoint.Checkpoint) -> None:
        checkpoint.save(self.paths.checkpoint, cp)
        self.state = cp

    def _report(self, config: ChannelConfig, *, ready: bool, message: str | None) -> None:
        """This node's own entry in the ComputeDomain's status (server-side apply, own manager)."""
        body = api.node_status_apply(config.compute_domain.name, config.compute_domain.namespace, api.NodeStatus(
            name=self.node.name, address=self.node.address, clique=self.node.clique, ready=ready, message=message))
        try:
            self.client.patch(ComputeDomainResource.Status, config.compute_domain.name, body,
                              namespace=config.compute_domain.namespace, patch_type=PatchType.APPLY,
                              field_manager=f"nvlfabric-agent-{self.node.name}", force=True)
        except ApiError as exc:
            # Status is a report, not a step of prepare: the workload may run without it.
            log.warning("ComputeDomain %s/%s: could not report node status: %s", config.compute_domain.namespace,
                        config.compute_domain.name, exc.status.message)

    # -- unprepare -------------------------------------------------------------------------------

    def _unprepare_one(self, c: ClaimRef) -> None:
        entry = self.state.get(c.uid)
        if entry is None:
            return
        if entry.state is checkpoint.ClaimState.PREPARE_STARTED:
            self._save(checkpoint.abort(self.state, c.uid, now=self.clock()))
            return
        if entry.state is checkpoint.ClaimState.PREPARE_ABORTED:
            return
        cdi.remove_claim_spec(self.paths.cdi_dir, c.uid)
        self._save(checkpoint.remove(self.state, c.uid))
        still_used = {ch for e in self.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED)
                      for ch in e.allocation.channels}
        for ch in entry.allocation.channels:
            if ch not in still_used:
                cdi.release_channel_device_node(self.paths.driver_root, ch)
        a = entry.allocation
        if not any(e.allocation.compute_domain_uid == a.compute_domain_uid
                   for e in self.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED)):
            self._withdraw(c.namespace, a.compute_domain_name)

    def _withdraw(self, namespace: str, cd_name: str) -> None:
        body: dict[str, Any] = {"apiVersion": api.API_VERSION, "kind": api.KIND,
                                "metadata": {"name": cd_name, "namespace": namespace}, "status": {"nodes": []}}
        try:
            self.client.patch(ComputeDomainResource.Status, cd_name, body, namespace=namespace,
                              patch_type=PatchType.APPLY, field_manager=f"nvlfabric-agent-{self.node.name}", force=True)
        except ApiError as exc:
            if exc.status.code != 404:
                log.warning("ComputeDomain %s/%s: could not withdraw node status: %s", namespace, cd_name,
                            exc.status.message)

    def housekeeping(self, *, clique: str | None) -> None:
        """Periodic: follow a changed clique; drop aborted entries whose stale-prepare window ended."""
        with self._lock:
            if clique != self.node.clique:
                self.node = NodeIdentity(self.node.name, self.node.address, clique)
            cp = checkpoint.expire_aborted(self.state, now=self.clock())
            if cp != self.state:
                self._save(cp)

    def stop(self) -> None:
        """Agent shutdown: daemons keep running only as long as the agent (the kubelet restarts it)."""
        for d in self._domains.values():
            d.stop()
