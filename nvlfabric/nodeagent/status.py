"""This node's entry in each ComputeDomain's status, as the agent reports it.

The entry is an annotation of the agent's own Node, `nvlfabric.io/cd-<hash>`, which the controller
copies into the domain's `status.nodes`; not a write of the domain itself, so that many agents never
contend on one object (docs/architecture.md, Node agent). A report that fails is owed: it is tried
again at the next `report_owed` (every DEDICATED_SYNC_S and at each resync), since a domain waiting
for numNodes would never be Ready without this node's entry. (The fabric's Node condition and taint
are fabrichealth.py's.)
"""

from __future__ import annotations

import logging

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors
from nvlfabric.api.nodereports import node_report, node_report_key
from nvlfabric.nodeagent import kubeapi
from nvlfabric.nodeagent.claims import NodeIdentity
from nvlfabric.nodeagent.kubeapi import Client

__all__ = ["Held", "StatusReporter"]

log = logging.getLogger("nvlfabric.nodeagent.driver")  # the driver's log: its lines keep their logger name

Held = tuple[str, str] | None
"""The IMEX credentials this node holds for a TLS domain (imexauth.held); None without."""


class StatusReporter:
    """Writes, withdraws and owes this node's entries. Not thread-safe: the driver's lock serialises."""

    def __init__(self, client: Client, node: NodeIdentity) -> None:
        self.client = client
        self.node = node
        self._unreported: dict[tuple[str, str], tuple[bool, str | None]] = {}
        """ComputeDomain (namespace, name) → the node entry whose write failed, to be tried again."""
        self._held: dict[tuple[str, str], Held] = {}
        """TLS ComputeDomain (namespace, name) → the credentials this node reports it holds (imexauth.held)."""

    def held(self, namespace: str, name: str) -> Held:
        return self._held.get((namespace, name))

    def set_held(self, namespace: str, name: str, held: Held) -> None:
        """Record the credentials the domain's daemon runs with; they go out with the next report."""
        self._held[(namespace, name)] = held

    def report(self, namespace: str, name: str, *, ready: bool, message: str | None) -> None:
        """This node's entry for the ComputeDomain, as an annotation of its own Node (module doc).
        Status is a report, not a step of prepare: a failed write is logged and owed, not raised."""
        held = self._held.get((namespace, name))
        report = node_report(namespace, name, api.NodeStatus(
            name=self.node.name, address=self.node.address, clique=self.node.clique, ready=ready, message=message,
            imex_trusts=held[0] if held else None, imex_issuer=held[1] if held and held[1] else None))
        try:
            self.client.patch(kubeapi.path("v1", "nodes", self.node.name), {"metadata": {"annotations": report}})
        except errors.NotFound:
            self._unreported.pop((namespace, name), None)  # the node is gone: nothing to report on
        except (errors.ApiStatusError, OSError) as exc:
            # The workload may run without the report, but a domain waiting for numNodes would
            # never be Ready without this node's entry: it is owed and tried again (every
            # DEDICATED_SYNC_S, and at each resync), also when the kubelet's retry of the prepare is
            # answered from the checkpoint (docs/architecture.md, Node agent).
            log.warning("ComputeDomain %s/%s: could not report node status, trying again: %s", namespace, name,
                        getattr(exc, "message", None) or exc)
            self._unreported[(namespace, name)] = (ready, message)
        else:
            self._unreported.pop((namespace, name), None)

    def report_owed(self) -> None:
        """Try again the reports whose write failed."""
        for (namespace, name), (ready, message) in sorted(self._unreported.items()):
            self.report(namespace, name, ready=ready, message=message)

    def withdraw(self, namespace: str, cd_name: str) -> None:
        """Remove this node's report for the domain from its Node (the controller drops the entry)."""
        self._unreported.pop((namespace, cd_name), None)
        self._held.pop((namespace, cd_name), None)
        body = {"metadata": {"annotations": {node_report_key(namespace, cd_name): None}}}
        try:
            self.client.patch(kubeapi.path("v1", "nodes", self.node.name), body)
        except errors.NotFound:
            pass  # the node is gone: nothing to withdraw
        except errors.ApiStatusError as exc:
            log.warning("ComputeDomain %s/%s: could not withdraw node status: %s", namespace, cd_name, exc.message)
