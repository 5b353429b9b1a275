"""The agent's side of IMEX supervision: which IMEX domains run on this node, with which members.

Clique-scoped: the clique's persistent domain on the default ports, members = the clique's Nodes.
Dedicated: the domain's own daemon `cd-<uid>` on the port slot the controller recorded in
`status.imexPortSlot`, members = the addresses in the domain's `status.nodes` (this agent first
reports its own entry, not ready, so the others learn its address; membership changes reach running
daemons by SIGUSR1 within `DEDICATED_SYNC_S`). A TLS domain's credentials are this node's key and a
certificate the controller signs (imexauth.py).

The daemons are not the agent's children: the node's IMEX keeper runs them (imexkeeper.py), so an
agent restart finds them running and takes them as they are; `keep_running` (re)starts only the
domains whose daemon is gone and follows membership changes. Not thread-safe: the driver's lock
serialises every call.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.nodeagent import checkpoint, imex, imexconfig, imexkeeper, kubeapi, metrics
from nvlfabric.nodeagent.claims import NodeIdentity, PrepareError
from nvlfabric.nodeagent.kubeapi import Client
from nvlfabric.nodeagent.status import Held, StatusReporter

__all__ = ["CREDENTIALS_WAIT_S", "DEDICATED_SYNC_S", "IMEX_READY_BUDGET_S", "SLOT_WAIT_S", "DedicatedView",
           "ImexSupervisor"]

log = logging.getLogger("nvlfabric.nodeagent.driver")  # the driver's log: its lines keep their logger name
DEDICATED_SYNC_S = 2.0  # how often dedicated domains' membership is re-read while any runs here
SLOT_WAIT_S = 10.0  # how long a prepare waits for the controller to assign a dedicated domain's port slot
IMEX_READY_BUDGET_S = 30.0  # leaves the rest of the kubelet's names.KUBELET_PREPARE_TIMEOUT_S for the other steps
CREDENTIALS_WAIT_S = 10.0  # how long a renewal between prepares waits for the controller to sign


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


class _Target(NamedTuple):
    """A domain `keep_running` looks after: its handle, members, and for TLS what it reports holding."""

    domain: imexkeeper.KeeperDomain
    members: list[str]
    reported: tuple[str, str] | None = None
    held: Held = None


class ImexSupervisor:
    """The IMEX domains this agent uses, through the node's keeper."""

    def __init__(self, *, client: Client, workdir: Path, driver_root: Path, status: StatusReporter,
                 keeper: Path) -> None:
        """`keeper`: the IMEX keeper's socket; the keeper runs the daemons, so they outlive this process."""
        self.client = client
        self.workdir = workdir
        self.driver_root = driver_root
        self.status = status
        self.keeper = keeper
        self._domains: dict[str, imexkeeper.KeeperDomain] = {}
        """Handles on the keeper's daemons of the domains this process has used."""

    @property
    def node(self) -> NodeIdentity:
        """This node, as its status reports it (one record: a clique change reaches both)."""
        return self.status.node

    def _counted(self) -> None:
        metrics.IMEX_DOMAINS.set(len(self._domains))

    # -- handles -------------------------------------------------------------------------------

    def domain(self, domain_id: str, slot: int = 0, tls_target: str = "") -> imexkeeper.KeeperDomain:
        """The handle on `domain_id`'s daemon with these ports and authentication (a new one if they changed)."""
        domain = self._domains.get(domain_id)
        ports = imexconfig.ports_for_slot(slot)
        if domain is not None and (ports.server, tls_target) != (domain.server_port, domain.tls_target):
            domain.stop()  # cannot happen while the controller keeps slots; if it did, follow the status
            domain = None
        if domain is None:
            domain = self._domains[domain_id] = self._new_domain(domain_id, ports, tls_target)
            self._counted()
        return domain

    def _new_domain(self, domain_id: str, ports: imexconfig.DomainPorts,
                    tls_target: str = "") -> imexkeeper.KeeperDomain:
        return imexkeeper.KeeperDomain(self.keeper, domain_id=domain_id, workdir=self.workdir,
                                       driver_root=self.driver_root, bind_address=self.node.address,
                                       server_port=ports.server, cmd_port=ports.cmd, tls_target=tls_target)

    def release(self, entry: checkpoint.ClaimEntry, cp: checkpoint.Checkpoint) -> None:
        """Stop a dedicated domain's daemon once no claim in `cp` but `entry` needs it (the clique's
        domain stays)."""
        domain_id = entry.allocation.imex_domain_id
        if not imexconfig.is_dedicated(domain_id) or any(
                e.allocation.imex_domain_id == domain_id and e.uid != entry.uid
                and e.state is not checkpoint.ClaimState.PREPARE_ABORTED for e in cp.claims):
            return
        # Not in _domains when an earlier agent process started it: the keeper knows it by its id.
        domain = self._domains.pop(domain_id, None) or self._new_domain(domain_id, imexconfig.ports_for_slot(0))
        self._counted()
        domain.stop()
        shutil.rmtree(self.workdir / domain_id, ignore_errors=True)

    # -- members -------------------------------------------------------------------------------

    def clique_members(self, clique: str) -> list[str]:
        members = []
        for n in self.client.list(kubeapi.path("v1", "nodes"), label_selector=f"{names.CLIQUE_LABEL}={clique}"):
            addrs = {a.get("type"): a.get("address") for a in (n.get("status") or {}).get("addresses") or []}
            if "InternalIP" in addrs:
                members.append(addrs["InternalIP"])
        if self.node.address not in members:
            members.append(self.node.address)
        return members

    def dedicated_view(self, namespace: str, name: str, uid: str, obj: dict[str, Any] | None = None) -> DedicatedView:
        """A dedicated domain as its members need it, from its status (slot, members, authentication):
        from `obj` when the caller has just read the domain, else read now."""
        if obj is None:
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

    # -- prepare: the domain a claim needs runs here and is READY --------------------------------

    def ensure_clique_domain(self, clique: str, domain_id: str, deadline: float) -> None:
        self._run_until_ready(self.domain(domain_id), self.clique_members(clique), deadline,
                              f"IMEX daemon for clique {clique}")

    def ensure_dedicated_domain(self, namespace: str, name: str, uid: str, domain_id: str, deadline: float,
                                read: dict[str, Any] | None = None) -> None:
        """`read`: the ComputeDomain as the prepare just read it (its first view costs no request)."""
        # Our entry first (not ready): the address is how the other members learn of this node.
        self.status.report(namespace, name, ready=False, message="joining the ComputeDomain's dedicated IMEX domain")
        view = self._wait_for_view(namespace, name, uid, deadline, read)
        assert view.slot is not None  # _wait_for_view raised otherwise
        domain = self.domain(domain_id, view.slot, view.tls_target)
        held = self._credentials(domain, uid, view.bundle, deadline, namespace, name) if view.tls_target else None
        self._run_until_ready(domain, view.members, deadline,
                              f"dedicated IMEX daemon of ComputeDomain {namespace}/{name}")
        self.status.set_held(namespace, name, held)

    def _wait_for_view(self, namespace: str, name: str, uid: str, deadline: float,
                       first: dict[str, Any] | None = None) -> DedicatedView:
        """The domain's view once the controller completed it (port slot, TLS authority), waiting up to
        SLOT_WAIT_S of what is left of the kubelet's budget; PrepareError saying what is missing.
        `first`: the domain as just read, for the first look."""
        view = self.dedicated_view(namespace, name, uid, first)
        waited_until = time.monotonic() + min(SLOT_WAIT_S, deadline - time.monotonic())
        while not view.complete and time.monotonic() < waited_until:
            time.sleep(0.25)
            view = self.dedicated_view(namespace, name, uid)
        if view.slot is None:
            raise PrepareError(f"ComputeDomain {namespace}/{name} has no IMEX port slot yet (status.imexPortSlot, set "
                               "by the nvlfabric controller; is it running?); the kubelet will retry")
        if not view.complete:
            raise PrepareError(f"ComputeDomain {namespace}/{name} wants imexAuthentication TLS, but its status has no "
                               "IMEX authority yet (status.imexCABundle, set by the nvlfabric controller of release "
                               "0.2 or later; is it running?); the kubelet will retry")
        return view

    def _run_until_ready(self, domain: imexkeeper.KeeperDomain, members: Sequence[str], deadline: float,
                         what: str) -> None:
        """`run`, then wait for READY within what is left of the kubelet's budget."""
        try:
            domain.run(members)
            budget = min(IMEX_READY_BUDGET_S, deadline - time.monotonic())
            if budget <= 0:
                raise imex.ImexNotReady(f"no time left in the kubelet's {names.KUBELET_PREPARE_TIMEOUT_S:g} s budget",
                                        domain.query())
            domain.wait_ready(budget)
        except imex.ImexError as exc:
            raise PrepareError(f"{what} on node {self.node.name} is not ready yet ({exc}); "
                               "the kubelet will retry") from exc

    def _credentials(self, domain: imexkeeper.KeeperDomain, uid: str, bundle: str, deadline: float, namespace: str,
                     name: str) -> Held:
        """This node's key, certificate and the domain's authorities in the domain's tls/ (a new
        certificate when it has none, or one not of the signing authority, or one due for
        renewal); returns what it then holds (imexauth.held), which the daemon loads at its next
        `run`."""
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

    # -- housekeeping --------------------------------------------------------------------------

    def keep_running(self, cp: checkpoint.Checkpoint, *, dedicated_only: bool = False) -> None:
        """The IMEX domains of `cp`'s prepared claims run here, with their current members (started
        again after an agent restart or a daemon crash, SIGUSR1 on a membership change)."""
        needed: dict[str, checkpoint.ClaimEntry] = {}
        for e in cp.by_state(checkpoint.ClaimState.PREPARE_COMPLETED):
            needed.setdefault(e.allocation.imex_domain_id, e)
        for domain_id, entry in sorted(needed.items()):
            try:
                target = self._target(domain_id, entry, dedicated_only=dedicated_only)
                if target is not None:
                    self._keep(domain_id, target)
            except (errors.ApiStatusError, OSError, ValueError, imex.ImexError, PrepareError) as exc:
                log.warning("IMEX domain %s: %s", domain_id, exc)

    def _target(self, domain_id: str, entry: checkpoint.ClaimEntry, *, dedicated_only: bool) -> _Target | None:
        """What `domain_id` should run with now; None to leave it for now."""
        if not imexconfig.is_dedicated(domain_id):
            clique = imexconfig.clique_of_domain(domain_id)
            if dedicated_only or clique != self.node.clique:
                return None  # a former clique has no members here
            return _Target(self.domain(domain_id), self.clique_members(clique))
        a = entry.allocation
        view = self.dedicated_view(entry.claim.namespace, a.compute_domain_name, a.compute_domain_uid)
        if not view.complete or view.slot is None:
            return None
        domain = self.domain(domain_id, view.slot, view.tls_target)
        if not view.tls_target:
            return _Target(domain, view.members)
        # Renewal, new authorities: new files here, SIGUSR1 at the run in _keep.
        held = self._credentials(domain, a.compute_domain_uid, view.bundle, time.monotonic() + CREDENTIALS_WAIT_S,
                                 entry.claim.namespace, a.compute_domain_name)
        return _Target(domain, view.members, (entry.claim.namespace, a.compute_domain_name), held)

    def _keep(self, domain_id: str, target: _Target) -> None:
        domain = target.domain
        status = domain.poll()
        done = domain.run(target.members)
        if target.reported is not None and self.status.held(*target.reported) != target.held:
            # The daemon has loaded them: the controller paces an authority rotation by this.
            self.status.set_held(*target.reported, target.held)
            self.status.report(*target.reported, ready=True, message=None)
        if done == "started":
            log.warning("IMEX domain %s: daemon was not running (exit status %s); started it", domain_id, status)
        elif done == "credentials changed":
            log.info("IMEX domain %s: the daemon loaded its new credentials", domain_id)
        elif done:
            log.info("IMEX domain %s: members now %s", domain_id, ", ".join(domain.members))
