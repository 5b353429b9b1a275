"""Prepare and unprepare of ComputeDomain channel claims on this node.

Prepare, per claim (all calls serialised under one lock; the kubelet may call concurrently):
0. the claim reference must be well-formed (namespace, name and UID as the API server makes them);
1. already PrepareCompleted in the checkpoint under this UID, answered before by this process, CDI
   spec and channel node present → return the same devices, without calling the API server (warm
   prepare, well under a millisecond). The UID is the proof: UIDs are never reused, the kubelet
   fetched the claim and compared its UID itself before calling, and the entry records that this
   agent validated exactly that object; a claim deleted and re-created has a new UID and takes the
   full path. (After a restart the first answer per claim takes the full path, which rebuilds the
   answer and anything missing on disk.)
2. GET the claim: it must still have the requested UID ("got replaced" otherwise), be allocated,
   hold a result of our driver from a clique pool, and that clique must be this node's;
3. decode our opaque config strictly (nvlfabric/api/channelconfig.py);
4. record PrepareStarted in the checkpoint (before any side effect);
5. make sure the IMEX domain the claim needs runs here and is READY. Clique-scoped: the clique's
   persistent domain on the default ports, members = the clique's Nodes. Dedicated: the domain's
   own daemon `cd-<uid>` on the port slot the controller recorded in `status.imexPortSlot`,
   members = the addresses in the domain's `status.nodes` (this agent first reports its own entry,
   not ready, so the others learn its address; membership changes reach running daemons by
   SIGUSR1 within `DEDICATED_SYNC_S`). Allocation mode All hands every channel 0..2047 to the pod
   (only in a dedicated domain, where no other domain's memory is reachable);
6. create the channel device node under the driver root (major from /proc/devices), write the CDI
   spec atomically;
7. record PrepareCompleted, report this node's entry for the ComputeDomain (an annotation of its
   own Node, `nvlfabric.io/cd-<hash>`, which the controller copies into the domain's `status.nodes`).
Every failure becomes that claim's error string, which the kubelet retries; a step that cannot
finish inside the kubelet's 45 s budget gives up early with a message saying so.

Unprepare: unknown claim → success; started → its side effects undone, then aborted (a stale
prepare retry is then refused); completed → CDI spec removed, the channel node released when no
other claim uses that channel, this node's status entry withdrawn, and only then the checkpoint
entry removed, so an agent killed at any point finishes the job when the kubelet retries.

At start the agent removes temporary files of interrupted writes. The IMEX daemons are not its
children: the node's IMEX keeper runs them (imexkeeper.py), so an agent restart finds them running
and takes them as they are; `housekeeping` (re)starts only the domains whose daemon is gone and
follows membership changes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.api.channelconfig import ChannelConfig
from nvlfabric.api.names import DRIVER
from nvlfabric.nodeagent import cdi, checkpoint, imex, imexkeeper, kubeapi
from nvlfabric.nodeagent.kubeapi import Client
from nvlfabric.nodeagent.server import ClaimRef, PreparedDevice

log = logging.getLogger("nvlfabric.nodeagent.driver")
KUBELET_BUDGET_S = 45.0
DEDICATED_SYNC_S = 2.0  # how often dedicated domains' membership is re-read while any runs here
SLOT_WAIT_S = 10.0  # how long a prepare waits for the controller to assign a dedicated domain's port slot
IMEX_READY_BUDGET_S = 30.0  # leaves the rest of the kubelet's 45 s for the other steps
CREDENTIALS_WAIT_S = 10.0  # how long a renewal between prepares waits for the controller to sign
_UID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.\-]{0,126}[A-Za-z0-9])?$")


def _show(value: str, limit: int = 80) -> str:
    """`value` for an error message: quoted when odd, cut when long (a request may carry anything)."""
    text = value if _UID.match(value) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(value)} characters)"


@dataclass(frozen=True)
class DedicatedView:
    """A dedicated domain as its members read it from its status."""

    slot: int | None
    members: list[str]
    tls_target: str
    """imexAuthentication TLS: the name its certificates carry; "" without authentication."""
    bundle: str
    """TLS: the domain authority's certificate(s), status.imexCABundle ("" until the controller set it)."""

    @property
    def complete(self) -> bool:
        return self.slot is not None and (not self.tls_target or bool(self.bundle))


def claim_name(c: ClaimRef) -> str:
    return f"{_show(c.namespace)}/{_show(c.name)}"


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


RESOURCE_API = "resource.k8s.io/v1"


def _now() -> datetime:
    return datetime.now(UTC)


def _check_ref(c: ClaimRef) -> None:
    """The kubelet sends what the API server stored; anything else is refused before it is used in a
    URL or a file name."""
    if not names.is_dns_label(c.namespace):
        raise PrepareError(f"claim {claim_name(c)}: namespace {_show(c.namespace)} is not a valid namespace name")
    if not names.is_dns_subdomain(c.name):
        raise PrepareError(f"claim {claim_name(c)}: name {_show(c.name)} is not a valid ResourceClaim name")
    if not _UID.match(c.uid):
        raise PrepareError(f"claim {claim_name(c)}: UID {_show(c.uid)} is not a valid object UID")


class ChannelDriver:
    def __init__(self, *, client: Client, node: NodeIdentity, paths: Paths,
                 clock: Callable[[], datetime] = _now,
                 imex_modes: frozenset[api.IMEXMode] = frozenset(api.IMEXMode),
                 imex_keeper: Path | None = None) -> None:
        """`imex_keeper`: the IMEX keeper's socket, which runs the daemons (the agent's way: they
        outlive this process); None runs them as children of this process (tests of this class)."""
        self.client = client
        self.imex_keeper = imex_keeper
        self.imex_modes = imex_modes
        self.node = node
        self.paths = paths
        self.clock = clock
        self._lock = threading.Lock()
        self._domains: dict[str, imex.ImexDomain] = {}
        """The IMEX domains this process has used; with a keeper, handles on the keeper's daemons."""
        self._unreported: dict[tuple[str, str], tuple[bool, str | None]] = {}
        """ComputeDomain (namespace, name) → the node entry whose write failed, to be tried again."""
        self._held: dict[tuple[str, str], tuple[str, str] | None] = {}
        """TLS ComputeDomain (namespace, name) → the credentials this node reports it holds (imexauth.held)."""
        self._answers: dict[str, str] = {}
        """Completed claims this process has answered, with the request name they were answered for:
        the warm path rebuilds its reply from the entry (see the module doc). Only the (interned)
        name is kept: the agent holds one of these per claim, under a memory budget."""
        paths.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.state, report = checkpoint.load(paths.checkpoint, paths.boot_id, clock=clock)
        if not report.ok:
            log.warning("checkpoint: %s", report)
        removed = cdi.remove_temp_files(paths.cdi_dir, paths.driver_root)
        removed_imex = imex.clean_workdir(paths.imex_workdir)
        if removed or removed_imex:
            log.info("removed %d temporary file(s) of interrupted writes", len(removed) + len(removed_imex))
        self._major: int | None = None
        self._recovered = False

    # -- the kubelet's calls ----------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        if not claims:  # the health check's probe: answer at once, not after a prepare in progress
            return {}
        deadline = time.monotonic() + KUBELET_BUDGET_S - 5
        out: dict[str, list[PreparedDevice] | str] = {}
        with self._lock:
            for c in claims:
                try:
                    _check_ref(c)
                    out[c.uid] = self._prepare_one(c, deadline)
                except PrepareError as exc:
                    out[c.uid] = str(exc)
                except (errors.ApiStatusError, OSError, checkpoint.CheckpointError, imex.ImexError) as exc:
                    log.warning("prepare %s: %s", claim_name(c), exc)
                    out[c.uid] = f"prepare of claim {claim_name(c)} failed: {exc}"
                except Exception as exc:  # one claim's bug must not cost every other claim its answer
                    log.exception("prepare %s: internal error", claim_name(c))
                    out[c.uid] = (f"prepare of claim {claim_name(c)} failed (internal error): "
                                  f"{type(exc).__name__}: {exc}")
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        if not claims:
            return {}
        out: dict[str, str] = {}
        with self._lock:
            for c in claims:
                try:
                    self._unprepare_one(c)
                    out[c.uid] = ""
                except (errors.ApiStatusError, OSError, checkpoint.CheckpointError) as exc:
                    log.warning("unprepare %s: %s", claim_name(c), exc)
                    out[c.uid] = f"unprepare of claim {claim_name(c)} failed: {exc}"
                except Exception as exc:
                    log.exception("unprepare %s: internal error", claim_name(c))
                    out[c.uid] = (f"unprepare of claim {claim_name(c)} failed (internal error): "
                                  f"{type(exc).__name__}: {exc}")
        return out

    # -- prepare ---------------------------------------------------------------------------------

    def _devices(self, entry: checkpoint.ClaimEntry, pool: str, device: str, request: str) -> list[PreparedDevice]:
        return [PreparedDevice((request,), pool, device, entry.cdi_device_ids)]

    def _prepare_one(self, c: ClaimRef, deadline: float) -> list[PreparedDevice]:
        entry = self.state.get(c.uid)
        completed = entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED
        if completed and entry is not None and (entry.claim.namespace, entry.claim.name) == (c.namespace, c.name):
            answered = self._answers.get(c.uid)
            if answered is not None and entry.allocation.device and self._on_disk(entry):
                pool, _, dev = entry.allocation.device.partition("/")
                return self._devices(entry, pool, dev, answered)
        claim = self._get_claim(c)
        pool, device, request, config = self._validate(c, claim)
        channel, clique = names.channel_of_device(device), names.clique_of_pool(pool) or ""  # _validate parsed both
        if config.imex_mode not in self.imex_modes:
            raise PrepareError(
                f"claim {claim_name(c)}: imexMode {config.imex_mode.value} is not enabled in this cluster's nvlfabric "
                f"driver (it allows {', '.join(sorted(m.value for m in self.imex_modes))}: NvlfabricDriver "
                "imex_modes); recreate the ComputeDomain with an allowed imexMode")
        allocation = self._allocation(c, pool, device, config)
        dedicated = config.imex_mode is api.IMEXMode.DEDICATED
        domain_id = allocation.imex_domain_id
        if entry is not None and entry.state is not checkpoint.ClaimState.PREPARE_ABORTED \
                and not entry.allocation.same_as(allocation):
            # Deallocated and allocated anew (same UID) while prepared or half-prepared here: the old
            # channel's node and spec go, the new allocation is prepared from scratch.
            log.warning("claim %s: allocation changed from channels %s to %s; preparing the new one", claim_name(c),
                        list(entry.allocation.channels), [channel])
            self._undo(entry)
            self._save(checkpoint.remove(self.state, c.uid))
            self._answers.pop(c.uid, None)
            entry, completed = None, False
        if completed and entry is not None:
            self._restore(entry)
            self._answers[entry.uid] = sys.intern(request)
            return self._devices(entry, pool, device, request)
        ref = checkpoint.ClaimRef(uid=c.uid, namespace=sys.intern(c.namespace), name=c.name)
        try:
            self._save(checkpoint.start_prepare(self.state, ref, allocation, now=self.clock()))
        except checkpoint.StalePrepareRejected as exc:
            raise PrepareError(f"claim {claim_name(c)}: {exc}") from exc
        cd = config.compute_domain
        if dedicated:
            self._ensure_dedicated_domain(cd.namespace, cd.name, cd.uid, domain_id, deadline)
        else:
            self._ensure_clique_domain(clique, domain_id, deadline)
        written = self._write_files(c.uid, allocation)
        self._save(checkpoint.complete_prepare(self.state, c.uid, cdi_spec_file=str(written.path),
                                               cdi_device_ids=written.device_ids, now=self.clock()))
        self._report(cd.namespace, cd.name, ready=True, message=None)
        entry = self.state.get(c.uid)
        assert entry is not None
        self._answers[entry.uid] = sys.intern(request)
        return self._devices(entry, pool, device, request)

    def _allocation(self, c: ClaimRef, pool: str, device: str, config: ChannelConfig) -> checkpoint.Allocation:
        """What the validated claim gives this node: channels, IMEX domain, pool device."""
        dedicated = config.imex_mode is api.IMEXMode.DEDICATED
        every = config.channel_allocation_mode is api.ChannelAllocationMode.ALL
        if every and not dedicated:  # the CRD refuses this too; a hand-made claim is refused here
            raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config: channelAllocationMode All needs "
                               "imexMode Dedicated (in the clique's shared IMEX domain channels isolate domains)")
        channel, clique = names.channel_of_device(device), names.clique_of_pool(pool)
        if channel is None or clique is None:  # _validate checked both
            raise PrepareError(f"claim {claim_name(c)}: device {pool}/{device} is not a channel")
        return checkpoint.Allocation(
            compute_domain_uid=config.compute_domain.uid, compute_domain_name=config.compute_domain.name,
            channels=tuple(range(names.IMEX_CHANNEL_COUNT)) if every else (channel,),
            imex_domain_id=sys.intern(f"cd-{config.compute_domain.uid}" if dedicated else f"clique-{clique}"),
            device=f"{pool}/{device}")

    def _on_disk(self, entry: checkpoint.ClaimEntry) -> bool:
        """The completed claim's CDI spec and channel nodes are still there (two stats)."""
        return os.path.exists(entry.cdi_spec_file) and all(
            os.path.exists(cdi.host_channel_path(self.paths.driver_root, ch)) for ch in entry.allocation.channels)

    def _write_files(self, uid: str, allocation: checkpoint.Allocation) -> cdi.SpecWrite:
        """The claim's channel device nodes under the driver root and its CDI spec (idempotent)."""
        major = self._channel_major()
        for ch in allocation.channels:
            cdi.channel_device_node(self.paths.driver_root, ch, major)
        return cdi.write_claim_spec(self.paths.cdi_dir, uid, cdi.claim_spec(
            claim_uid=uid, channels=allocation.channels, major=major, compute_domain=allocation.compute_domain_name))

    def _restore(self, entry: checkpoint.ClaimEntry) -> None:
        """Put back a completed claim's channel nodes and CDI spec if something removed them (idempotent)."""
        written = self._write_files(entry.uid, entry.allocation)
        if written.changed:
            log.warning("claim %s: its CDI spec %s was missing or different; rewritten", entry.uid, written.path)

    def _get_claim(self, c: ClaimRef) -> dict[str, Any]:
        try:
            claim = self.client.get(kubeapi.path(RESOURCE_API, "resourceclaims", c.name, namespace=c.namespace))
        except errors.NotFound as exc:
            raise PrepareError(f"claim {claim_name(c)} does not exist (any more)") from exc
        live_uid = (claim.get("metadata") or {}).get("uid")
        if live_uid != c.uid:
            raise PrepareError(f"claim {claim_name(c)} got replaced: its UID is {live_uid}, "
                               f"not the requested {c.uid}")
        return claim

    def _validate(self, c: ClaimRef, claim: dict[str, Any]) -> tuple[str, str, str, ChannelConfig]:
        alloc = (claim.get("status") or {}).get("allocation") or {}
        devices = alloc.get("devices")
        if not devices:
            raise PrepareError(f"claim {claim_name(c)} is not allocated")
        ours = [r for r in devices.get("results") or [] if r.get("driver") == DRIVER]
        if not ours:
            raise PrepareError(f"claim {claim_name(c)} has no device of driver {DRIVER}")
        pool, device, request = (str(ours[0].get(k) or "") for k in ("pool", "device", "request"))
        clique = names.clique_of_pool(pool)
        if clique is None or names.channel_of_device(device) is None:
            raise PrepareError(f"claim {claim_name(c)}: device {pool}/{device} is not a channel")
        if clique != self.node.clique:
            raise PrepareError(f"claim {claim_name(c)} was allocated in clique {clique}, but node "
                               f"{self.node.name} is in clique {self.node.clique or '(none: fabric not ready)'}")
        raw = [(cfg.get("opaque") or {}).get("parameters") for cfg in devices.get("config") or []
               if (cfg.get("opaque") or {}).get("driver") == DRIVER]
        if not raw:
            raise PrepareError(f"claim {claim_name(c)} carries no {DRIVER} configuration; create "
                               "ComputeDomains with nvlfabric (its claim names the ComputeDomain)")
        try:
            config = ChannelConfig.model_validate(raw[-1])
        except ValidationError as exc:
            errors = exc.errors()
            found = "; ".join(f"at {'.'.join(str(p) for p in e['loc']) or '(config)'}: {e['msg']}" for e in errors[:3])
            more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
            raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config {found}{more}") from exc
        cd = config.compute_domain
        # The agent writes this ComputeDomain's status with its own credentials: only the claim's own
        # namespace, and only a name the API server could have given an object.
        if cd.namespace != c.namespace:
            raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config at computeDomain.namespace: "
                               f"{_show(cd.namespace)} is not the claim's namespace {c.namespace}")
        if not names.is_dns_subdomain(cd.name):
            raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config at computeDomain.name: "
                               f"{_show(cd.name)} is not a valid ComputeDomain name")
        if not _UID.match(cd.uid):
            raise PrepareError(f"claim {claim_name(c)}: invalid {DRIVER} config at computeDomain.uid: "
                               f"{_show(cd.uid)} is not a valid object UID")
        return pool, device, request.split("/")[0], config

    def _channel_major(self) -> int:
        if self._major is None:
            self._major = cdi.read_major(self.paths.proc_devices, "nvidia-caps-imex-channels")
        return self._major

    def _clique_members(self, clique: str) -> list[str]:
        members = []
        for n in self.client.list(kubeapi.path("v1", "nodes"), label_selector=f"{names.CLIQUE_LABEL}={clique}"):
            addrs = {a.get("type"): a.get("address") for a in (n.get("status") or {}).get("addresses") or []}
            if "InternalIP" in addrs:
                members.append(addrs["InternalIP"])
        if self.node.address not in members:
            members.append(self.node.address)
        return members

    def _domain(self, domain_id: str, slot: int = 0, tls_target: str = "") -> imex.ImexDomain:
        domain = self._domains.get(domain_id)
        ports = imex.ports_for_slot(slot)
        if domain is not None and (ports.server, tls_target) != (domain.config.SERVER_PORT, domain.tls_target):
            domain.stop()  # cannot happen while the controller keeps slots; if it did, follow the status
            domain = None
        if domain is None:
            domain = self._domains[domain_id] = self._new_domain(domain_id, ports, tls_target)
        return domain

    def _new_domain(self, domain_id: str, ports: imex.DomainPorts, tls_target: str = "") -> imex.ImexDomain:
        if self.imex_keeper is not None:
            return imexkeeper.KeeperDomain(self.imex_keeper, domain_id=domain_id, workdir=self.paths.imex_workdir,
                                           driver_root=self.paths.driver_root, bind_address=self.node.address,
                                           server_port=ports.server, cmd_port=ports.cmd, tls_target=tls_target)
        return imex.ImexDomain(domain_id=domain_id, workdir=self.paths.imex_workdir, driver_root=self.paths.driver_root,
                               bind_address=self.node.address, server_port=ports.server, cmd_port=ports.cmd,
                               tls_target=tls_target)

    def _dedicated_view(self, namespace: str, name: str, uid: str) -> DedicatedView:
        """A dedicated domain as its members need it, from its status (slot, members, authentication)."""
        try:
            obj = self.client.get(kubeapi.path(api.API_VERSION, api.PLURAL, name, namespace=namespace))
        except errors.NotFound as exc:
            raise PrepareError(f"ComputeDomain {namespace}/{name} does not exist (any more)") from exc
        if (obj.get("metadata") or {}).get("uid") != uid:
            raise PrepareError(f"ComputeDomain {namespace}/{name} got replaced: its UID is not {uid}")
        status = api.ComputeDomainStatus.model_validate(obj.get("status") or {})
        members = {n.address for n in status.nodes if n.address} | {self.node.address}
        wants = (obj.get("spec") or {}).get("imexAuthentication")
        tls = status.imex_authentication is api.IMEXAuthentication.TLS or wants == api.IMEXAuthentication.TLS.value
        return DedicatedView(status.imex_port_slot, sorted(members), names.imex_target(uid) if tls else "",
                             status.imex_ca_bundle or "" if tls else "")

    def _ensure_dedicated_domain(self, namespace: str, name: str, uid: str, domain_id: str, deadline: float) -> None:
        # Our entry first (not ready): the address is how the other members learn of this node.
        self._report(namespace, name, ready=False, message="joining the ComputeDomain's dedicated IMEX domain")
        view = self._dedicated_view(namespace, name, uid)
        waited_until = time.monotonic() + min(SLOT_WAIT_S, deadline - time.monotonic())
        while not view.complete and time.monotonic() < waited_until:
            time.sleep(0.25)
            view = self._dedicated_view(namespace, name, uid)
        if view.slot is None:
            raise PrepareError(f"ComputeDomain {namespace}/{name} has no IMEX port slot yet (status.imexPortSlot, set "
                               "by the nvlfabric controller; is it running?); the kubelet will retry")
        if not view.complete:
            raise PrepareError(f"ComputeDomain {namespace}/{name} wants imexAuthentication TLS, but its status has no "
                               "IMEX authority yet (status.imexCABundle, set by the nvlfabric controller of release "
                               "0.2 or later; is it running?); the kubelet will retry")
        domain = self._domain(domain_id, view.slot, view.tls_target)
        held = self._credentials(domain, uid, view.bundle, deadline, namespace, name) if view.tls_target else None
        self._run_until_ready(domain, view.members, deadline,
                              f"dedicated IMEX daemon of ComputeDomain {namespace}/{name}")
        self._held[(namespace, name)] = held

    def _credentials(self, domain: imex.ImexDomain, uid: str, bundle: str, deadline: float, namespace: str,
                     name: str) -> tuple[str, str] | None:
        """This node's key, certificate and the domain's authorities in the domain's tls/ (a new
        certificate when it has none, or one not of the signing authority, or one due for
        renewal); returns what it then holds (imexauth.held), which the daemon loads at its next
        `_run`."""
        from nvlfabric.nodeagent import imexauth  # cryptography: only where a TLS domain runs

        files = imexauth.Files.of(domain.dir)
        try:
            if imexauth.write_bundle(files, bundle):
                log.info("IMEX domain %s: trusts %d authorit%s now", domain.domain_id, bundle.count("BEGIN CERT"),
                         "y" if bundle.count("BEGIN CERT") == 1 else "ies")
            why = imexauth.due(files, bundle)
            if why is not None:
                log.info("IMEX domain %s: asking for a certificate (%s)", domain.domain_id, why)
                imexauth.obtain(self.client, self.node.name, uid, files, deadline=deadline)
        except (imexauth.CredentialsError, errors.ApiStatusError, OSError, ValueError) as exc:
            raise PrepareError(f"IMEX credentials of ComputeDomain {namespace}/{name} on node {self.node.name}: "
                               f"{exc}") from exc
        return imexauth.held(files)

    def _release_domain(self, entry: checkpoint.ClaimEntry) -> None:
        """Stop a dedicated domain's daemon once no claim here needs it (the clique's domain stays)."""
        domain_id = entry.allocation.imex_domain_id
        if not domain_id.startswith("cd-") or any(
                e.allocation.imex_domain_id == domain_id and e.uid != entry.uid
                and e.state is not checkpoint.ClaimState.PREPARE_ABORTED for e in self.state.claims):
            return
        # Not in _domains when an earlier agent process started it: the keeper knows it by its id.
        domain = self._domains.pop(domain_id, None) or self._new_domain(domain_id, imex.ports_for_slot(0))
        domain.stop()
        shutil.rmtree(self.paths.imex_workdir / domain_id, ignore_errors=True)

    def sync_dedicated(self) -> None:
        """Between resyncs, while dedicated domains run here: follow their membership (SIGUSR1);
        and report the entries a failed write left out."""
        with self._lock:
            self._keep_domains_running(dedicated_only=True)
            self._report_owed()

    def _report_owed(self) -> None:
        for (namespace, name), (ready, message) in sorted(self._unreported.items()):
            self._report(namespace, name, ready=ready, message=message)

    def _ensure_clique_domain(self, clique: str, domain_id: str, deadline: float) -> None:
        self._run_until_ready(self._domain(domain_id), self._clique_members(clique), deadline,
                              f"IMEX daemon for clique {clique}")

    @staticmethod
    def _run(domain: imex.ImexDomain, members: Sequence[str]) -> str | None:
        return domain.run(members)

    def _run_until_ready(self, domain: imex.ImexDomain, members: Sequence[str], deadline: float, what: str) -> None:
        """`_run`, then wait for READY within what is left of the kubelet's budget."""
        try:
            self._run(domain, members)
            budget = min(IMEX_READY_BUDGET_S, deadline - time.monotonic())
            if budget <= 0:
                raise imex.ImexNotReady("no time left in the kubelet's 45 s budget", domain.query())
            domain.wait_ready(budget)
        except imex.ImexError as exc:
            raise PrepareError(f"{what} on node {self.node.name} is not ready yet ({exc}); "
                               "the kubelet will retry") from exc

    def _save(self, cp: checkpoint.Checkpoint) -> None:
        checkpoint.save(self.paths.checkpoint, cp)
        self.state = cp

    def _report(self, namespace: str, name: str, *, ready: bool, message: str | None) -> None:
        """This node's entry for the ComputeDomain, as an annotation of its own Node, which the
        controller copies into the domain's `status.nodes`. Not a write of the domain itself: 72
        agents applying their entries to one object made the API server retry each apply many
        times over (bench/e2e job288: 110 applies, ~1200 s of summed latency, the domain Ready
        only 17 s after its last pod ran); a write of one's own Node never contends."""
        held = self._held.get((namespace, name))
        report = api.node_report(namespace, name, api.NodeStatus(
            name=self.node.name, address=self.node.address, clique=self.node.clique, ready=ready, message=message,
            imex_trusts=held[0] if held else None, imex_issuer=held[1] if held and held[1] else None))
        try:
            self.client.patch(kubeapi.path("v1", "nodes", self.node.name), {"metadata": {"annotations": report}})
        except errors.NotFound:
            self._unreported.pop((namespace, name), None)  # the node is gone: nothing to report on
        except (errors.ApiStatusError, OSError) as exc:
            # Status is a report, not a step of prepare: the workload may run without it. But a
            # domain waiting for numNodes would never be Ready without this node's entry, so the
            # report is owed and tried again (every DEDICATED_SYNC_S, and at each resync). Found
            # with 72 agents on 2 cores: an API read timed out after the claim was prepared, the
            # kubelet's retry was answered from the checkpoint, and 12 entries never came.
            log.warning("ComputeDomain %s/%s: could not report node status, trying again: %s", namespace, name,
                        getattr(exc, "message", None) or exc)
            self._unreported[(namespace, name)] = (ready, message)
        else:
            self._unreported.pop((namespace, name), None)

    # -- unprepare -------------------------------------------------------------------------------

    def _unprepare_one(self, c: ClaimRef) -> None:
        entry = self.state.get(c.uid)
        self._answers.pop(c.uid, None)
        if entry is None:
            # Not in the checkpoint (it was lost, or rebuilt without this claim): whatever of the
            # claim is still on disk goes, so nothing leaks. (A malformed UID names no file.)
            if _UID.match(c.uid) and cdi.remove_claim_spec(self.paths.cdi_dir, c.uid):
                log.warning("claim %s was not in the checkpoint but its CDI spec was on disk; removed it",
                            claim_name(c))
                self._sweep_channel_nodes()
            return
        if entry.state is checkpoint.ClaimState.PREPARE_ABORTED:
            return
        # Side effects first, the checkpoint entry last: killed anywhere in between, the entry is
        # still there and the kubelet's retry finishes the job (nothing is left that no entry names).
        self._undo(entry)
        self._release_domain(entry)
        if entry.state is checkpoint.ClaimState.PREPARE_STARTED:
            self._save(checkpoint.abort(self.state, c.uid, now=self.clock()))
            return
        a = entry.allocation
        if not any(e.allocation.compute_domain_uid == a.compute_domain_uid and e.uid != c.uid
                   for e in self.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED)):
            self._withdraw(entry.claim.namespace, a.compute_domain_name)
        self._save(checkpoint.remove(self.state, c.uid))

    def _undo(self, entry: checkpoint.ClaimEntry) -> None:
        """Remove the claim's CDI spec and the channel nodes no other (started or completed) claim uses."""
        cdi.remove_claim_spec(self.paths.cdi_dir, entry.uid)
        still_used = {ch for e in self.state.claims if e.uid != entry.uid
                      and e.state is not checkpoint.ClaimState.PREPARE_ABORTED for ch in e.allocation.channels}
        for ch in entry.allocation.channels:
            if ch not in still_used:
                cdi.release_channel_device_node(self.paths.driver_root, ch)

    def _withdraw(self, namespace: str, cd_name: str) -> None:
        """Remove this node's report for the domain from its Node (the controller drops the entry)."""
        self._unreported.pop((namespace, cd_name), None)
        self._held.pop((namespace, cd_name), None)
        body = {"metadata": {"annotations": {api.node_report_key(namespace, cd_name): None}}}
        try:
            self.client.patch(kubeapi.path("v1", "nodes", self.node.name), body)
        except errors.NotFound:
            pass  # the node is gone: nothing to withdraw
        except errors.ApiStatusError as exc:
            log.warning("ComputeDomain %s/%s: could not withdraw node status: %s", namespace, cd_name, exc.message)

    # -- recovery of a lost checkpoint ----------------------------------------------------------

    def _sweep_channel_nodes(self) -> list[int]:
        """Remove channel nodes under the driver root that no (started or completed) claim uses:
        the agent is their only creator, so an unused one is a leftover."""
        used = {ch for e in self.state.claims if e.state is not checkpoint.ClaimState.PREPARE_ABORTED
                for ch in e.allocation.channels}
        gone = [ch for ch in cdi.channel_device_nodes(self.paths.driver_root) if ch not in used]
        for ch in gone:
            cdi.release_channel_device_node(self.paths.driver_root, ch)
        return gone

    def _held_here(self, claim: dict[str, Any]) -> bool:
        """A pod on this node is among the claim's consumers, itself or through its PodGroup (a
        claim Kubernetes reserved for a whole pod group)."""
        namespace = (claim.get("metadata") or {}).get("namespace", "")
        for consumer in (claim.get("status") or {}).get("reservedFor") or []:
            if consumer.get("resource") == "podgroups" and consumer.get("name"):
                if self._group_here(namespace, consumer["name"]):
                    return True
                continue
            if consumer.get("resource") != "pods" or not consumer.get("name"):
                continue
            try:
                pod = self.client.get(kubeapi.path("v1", "pods", consumer["name"], namespace=namespace))
            except errors.NotFound:
                continue
            if (pod.get("spec") or {}).get("nodeName") == self.node.name and \
                    (pod.get("metadata") or {}).get("uid") == consumer.get("uid"):
                return True
        return False

    def _group_here(self, namespace: str, group: str) -> bool:
        pods = self.client.list(kubeapi.path("v1", "pods", namespace=namespace),
                                field_selector=f"spec.nodeName={self.node.name}")
        return any(((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") == group for p in pods)

    def _recover(self) -> None:
        """Rebuild the checkpoint from the API server for claims whose CDI spec is on disk but which
        it does not know (a corrupt file moved aside, a lost or hand-deleted one): a claim a pod on
        this node still holds is validated like a prepare and recorded as completed (its files
        rewritten, its IMEX domain started by housekeeping), so the kubelet's unprepare later
        finds it; any other spec is removed. Then channel nodes no claim uses are removed."""
        known = {e.uid for e in self.state.claims}
        orphans = [uid for uid in cdi.claim_spec_uids(self.paths.cdi_dir) if uid not in known]
        adopted, removed = [], []
        if orphans:
            claims = {(c.get("metadata") or {}).get("uid"): c
                      for c in self.client.list(kubeapi.path(RESOURCE_API, "resourceclaims"))}
            for uid in orphans:
                claim = claims.get(uid)
                meta = (claim or {}).get("metadata") or {}
                ref = ClaimRef(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=uid)
                try:
                    if claim is None or not self._held_here(claim):
                        raise PrepareError("no pod on this node holds it")
                    pool, device, _, config = self._validate(ref, claim)
                    allocation = self._allocation(ref, pool, device, config)
                    cref = checkpoint.ClaimRef(uid=uid, namespace=ref.namespace, name=ref.name)
                    cp = checkpoint.start_prepare(self.state, cref, allocation, now=self.clock())
                    written = self._write_files(uid, allocation)
                    self._save(checkpoint.complete_prepare(cp, uid, cdi_spec_file=str(written.path),
                                                           cdi_device_ids=written.device_ids, now=self.clock()))
                    adopted.append(uid)
                except (PrepareError, checkpoint.CheckpointError, ValueError) as exc:
                    cdi.remove_claim_spec(self.paths.cdi_dir, uid)
                    removed.append(f"{uid} ({exc})")
        swept = self._sweep_channel_nodes()
        if adopted or removed or swept:
            log.warning("checkpoint rebuilt from the API server: %d claim(s) adopted (%s), %d CDI spec(s) removed "
                        "(%s), %d unused channel node(s) removed (%s)", len(adopted), ", ".join(adopted) or "-",
                        len(removed), "; ".join(removed) or "-", len(swept), ", ".join(map(str, swept)) or "-")

    def housekeeping(self, *, clique: str | None) -> None:
        """Periodic (and once at start): follow a changed clique; rebuild what a lost checkpoint
        forgot (until that succeeds once); drop aborted entries whose stale-prepare window ended;
        keep the IMEX domains of prepared claims running."""
        with self._lock:
            if clique != self.node.clique:
                self.node = NodeIdentity(self.node.name, self.node.address, clique)
                self._answers.clear()  # re-validated against the new clique at their next prepare
            if not self._recovered:
                try:
                    self._recover()
                    self._recovered = True
                except (errors.ApiStatusError, OSError) as exc:
                    log.warning("checkpoint recovery from the API server failed, retrying at the next resync: %s", exc)
            cp = checkpoint.expire_aborted(self.state, now=self.clock())
            if cp != self.state:
                self._save(cp)
            self._keep_domains_running()
            self._report_owed()

    def _keep_domains_running(self, *, dedicated_only: bool = False) -> None:
        """The IMEX domains of prepared claims run here, with their current members (started again
        after an agent restart or a daemon crash, SIGUSR1 on a membership change)."""
        needed: dict[str, checkpoint.ClaimEntry] = {}
        for e in self.state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED):
            needed.setdefault(e.allocation.imex_domain_id, e)
        for domain_id, entry in sorted(needed.items()):
            reported: tuple[str, str] | None = None
            held: tuple[str, str] | None = None
            try:
                if domain_id.startswith("cd-"):
                    a = entry.allocation
                    view = self._dedicated_view(entry.claim.namespace, a.compute_domain_name, a.compute_domain_uid)
                    if not view.complete or view.slot is None:
                        continue
                    domain, members = self._domain(domain_id, view.slot, view.tls_target), view.members
                    if view.tls_target:  # renewal, new authorities: new files here, SIGUSR1 in _run below
                        held = self._credentials(domain, a.compute_domain_uid, view.bundle,
                                                 time.monotonic() + CREDENTIALS_WAIT_S, entry.claim.namespace,
                                                 a.compute_domain_name)
                        reported = (entry.claim.namespace, a.compute_domain_name)
                elif dedicated_only:
                    continue
                else:
                    clique = domain_id.removeprefix("clique-")
                    if clique != self.node.clique:
                        continue  # a former clique has no members here
                    domain, members = self._domain(domain_id), self._clique_members(clique)
                status = domain.poll()
                done = self._run(domain, members)
                if reported is not None and self._held.get(reported) != held:
                    # The daemon has loaded them: the controller paces an authority rotation by this.
                    self._held[reported] = held
                    self._report(*reported, ready=True, message=None)
                if done == "started":
                    log.warning("IMEX domain %s: daemon was not running (exit status %s); started it", domain_id,
                                status)
                elif done == "credentials changed":
                    log.info("IMEX domain %s: the daemon loaded its new credentials", domain_id)
                elif done:
                    log.info("IMEX domain %s: members now %s", domain_id, ", ".join(domain.members))
            except (errors.ApiStatusError, OSError, ValueError, imex.ImexError, PrepareError) as exc:
                log.warning("IMEX domain %s: %s", domain_id, exc)

    def stop(self) -> None:
        """Agent shutdown. The keeper's daemons keep running: they serve prepared claims, and the next
        agent process takes them over as they are. Daemons of this process's own (no keeper) stop."""
        if self.imex_keeper is None:
            for d in self._domains.values():
                d.stop()
