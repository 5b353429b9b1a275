"""Prepare and unprepare of ComputeDomain channel claims on this node: the order of the steps.

The steps live beside it, one concern each: the claim checks in claims.py, the checkpoint and the
claim's files in prepared.py, the IMEX domains in imexdomains.py, this node's status entry in
status.py, the rebuild of a lost checkpoint in recovery.py. This module holds the lock and the order.

Prepare, per claim (all calls serialised under one lock; the kubelet may call concurrently):
0. the claim reference must be well-formed (claims.check_ref);
1. answered before by this process and still on disk → the same devices, without calling the API
   server (the warm path, PreparedClaims.answered);
2. GET the claim and validate it: same UID, allocated, our driver, this node's clique, a strict config;
   then GET the ComputeDomain its config names (in the claim's namespace) and check the claim is that
   domain's own (claims.check_owner: the domain's UID, its owner reference, one of its claim names);
   a Dedicated claim's IMEX view starts from that same read;
3. record PrepareStarted in the checkpoint (before any side effect);
4. make sure the IMEX domain the claim needs runs here and is READY (ImexSupervisor);
5. create the channel device nodes and write the CDI spec, record PrepareCompleted;
6. report this node's entry for the ComputeDomain (StatusReporter).
Every failure becomes that claim's error string, which the kubelet retries; a step that cannot
finish inside the kubelet's budget (names.KUBELET_PREPARE_TIMEOUT_S) gives up early with a message
saying so.

At start, before the kubelet can call, the entries an agent before issue 49 recorded for allocation
mode All (every channel of the node, 0..2047) are narrowed to the claim's own channel, CDI spec first
(PreparedClaims.narrow_every_channel).

Unprepare: unknown claim → success (whatever is on disk of it goes); started → its side effects
undone, then aborted (a stale prepare retry is then refused); completed → CDI spec removed, the
channel node released when no other claim uses that channel, the dedicated daemon stopped when no
claim needs it, this node's status entry withdrawn, and only then the checkpoint entry removed, so
an agent killed at any point finishes the job when the kubelet retries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.nodeagent import cdi, checkpoint, claims, imex, recovery
from nvlfabric.nodeagent.claims import NodeIdentity, PrepareError, claim_name
from nvlfabric.nodeagent.imexdomains import DEDICATED_SYNC_S, ImexSupervisor
from nvlfabric.nodeagent.kubeapi import Client
from nvlfabric.nodeagent.prepared import Paths, PreparedClaims
from nvlfabric.nodeagent.status import StatusReporter

__all__ = ["DEDICATED_SYNC_S", "ChannelDriver", "NodeIdentity", "Paths", "PrepareError",
           "claim_name"]

log = logging.getLogger("nvlfabric.nodeagent.driver")
ANSWER_MARGIN_S = 5.0
"""A prepare stops its steps this long before the kubelet's deadline, so that its answer (an error
naming the step) still arrives in time."""


def _now() -> datetime:
    return datetime.now(UTC)


class ChannelDriver:
    """The kubelet plugin's two calls and the agent's periodic upkeep, under one lock."""

    def __init__(self, *, client: Client, node: NodeIdentity, paths: Paths,
                 clock: Callable[[], datetime] = _now,
                 imex_modes: frozenset[api.IMEXMode] = frozenset(api.IMEXMode),
                 imex_keeper: Path) -> None:
        """`imex_keeper`: the node's IMEX keeper's socket; the keeper runs the daemons, so they
        outlive this process."""
        self.client = client
        self.imex_modes = imex_modes
        self.paths = paths
        self._lock = threading.Lock()
        self.claims = PreparedClaims(paths, clock)
        self.status = StatusReporter(client, node)
        self.imex = ImexSupervisor(client=client, workdir=paths.imex_workdir, driver_root=paths.driver_root,
                                   status=self.status, keeper=imex_keeper)
        removed = cdi.remove_temp_files(paths.cdi_dir, paths.driver_root)
        removed_imex = imex.clean_workdir(paths.imex_workdir)
        if removed or removed_imex:
            log.info("removed %d temporary file(s) of interrupted writes", len(removed) + len(removed_imex))
        try:  # before the kubelet can call: no claim keeps another domain's channels past an upgrade
            self.claims.narrow_every_channel()
        except (OSError, LookupError, ValueError, checkpoint.CheckpointError) as exc:
            log.warning("narrowing allocation mode All claims of an earlier agent failed (each is narrowed at its "
                        "next prepare instead): %s", exc)
        self._recovered = False

    @property
    def node(self) -> NodeIdentity:
        return self.status.node

    @property
    def state(self) -> checkpoint.Checkpoint:
        """The checkpoint as last saved."""
        return self.claims.state

    # -- the kubelet's calls ----------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        if not refs:  # the health check's probe: answer at once, not after a prepare in progress
            return {}
        deadline = time.monotonic() + names.KUBELET_PREPARE_TIMEOUT_S - ANSWER_MARGIN_S
        out: dict[str, list[PreparedDevice] | str] = {}
        with self._lock:
            for c in refs:
                try:
                    claims.check_ref(c)
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

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        if not refs:
            return {}
        out: dict[str, str] = {}
        with self._lock:
            for c in refs:
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

    def _prepare_one(self, c: ClaimRef, deadline: float) -> list[PreparedDevice]:
        warm = self.claims.answered(c)
        if warm is not None:
            return warm
        claim = claims.get_claim(self.client, c)
        valid = claims.validate(c, claim, self.node)
        claims.check_imex_mode(c, valid.config, self.imex_modes)
        allocation = claims.allocation_of(c, valid.pool, valid.device, valid.config)
        domain = claims.get_domain(self.client, c, valid.config)
        claims.check_owner(c, claim, domain, valid.config, prepared_here=self.claims.completed_as(c.uid, allocation))
        entry = self.claims.replace_changed(c, allocation)
        if entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED:
            self.claims.restore(entry)
            return self.claims.answer(entry, valid.pool, valid.device, valid.request)
        self.claims.start(c, allocation)
        cd = valid.config.compute_domain
        if valid.config.imex_mode is api.IMEXMode.DEDICATED:
            self.imex.ensure_dedicated_domain(cd.namespace, cd.name, cd.uid, allocation.imex_domain_id, deadline,
                                              domain)
        else:
            self.imex.ensure_clique_domain(names.clique_of_pool(valid.pool) or "", allocation.imex_domain_id, deadline)
        entry = self.claims.complete(c.uid, allocation)
        self.status.report(cd.namespace, cd.name, ready=True, message=None)
        return self.claims.answer(entry, valid.pool, valid.device, valid.request)

    def _unprepare_one(self, c: ClaimRef) -> None:
        entry = self.claims.state.get(c.uid)
        self.claims.forget(c.uid)
        if entry is None:
            self.claims.remove_unknown(c)
            return
        if entry.state is checkpoint.ClaimState.PREPARE_ABORTED:
            return
        # Side effects first, the checkpoint entry last: killed anywhere in between, the entry is
        # still there and the kubelet's retry finishes the job (nothing is left that no entry names).
        self.claims.undo(entry)
        self.imex.release(entry, self.claims.state)
        if entry.state is checkpoint.ClaimState.PREPARE_STARTED:
            self.claims.save(checkpoint.abort(self.claims.state, c.uid, now=self.claims.clock()))
            return
        if self.claims.last_of_domain(entry):
            self.status.withdraw(entry.claim.namespace, entry.allocation.compute_domain_name)
        self.claims.save(checkpoint.remove(self.claims.state, c.uid))

    # -- upkeep ----------------------------------------------------------------------------------

    def housekeeping(self, *, clique: str | None) -> None:
        """Periodic (and once at start): follow a changed clique; rebuild what a lost checkpoint
        forgot (until that succeeds once); drop aborted entries whose stale-prepare window ended;
        keep the IMEX domains of prepared claims running; report what is owed."""
        with self._lock:
            if clique != self.node.clique:
                self.status.node = NodeIdentity(self.node.name, self.node.address, clique)
                self.claims.forget_answers()  # re-validated against the new clique at their next prepare
            if not self._recovered:
                try:
                    recovery.recover(self.client, self.node, self.claims)
                    self._recovered = True
                except (errors.ApiStatusError, OSError) as exc:
                    log.warning("checkpoint recovery from the API server failed, retrying at the next resync: %s", exc)
            self.claims.expire_aborted()
            self.imex.keep_running(self.claims.state)
            self.status.report_owed()

    def sync_dedicated(self) -> None:
        """Between resyncs, while dedicated domains run here: follow their membership (SIGUSR1);
        and report the entries a failed write left out."""
        with self._lock:
            self.imex.keep_running(self.claims.state, dedicated_only=True)
            self.status.report_owed()

    def stop(self) -> None:
        """Agent shutdown. Nothing of the IMEX domains stops: the keeper's daemons serve prepared
        claims, and the next agent process takes them over as they are."""
