"""The agents' reports per ComputeDomain, their fabric health and the Nodes per clique, kept up to
date from the Node informer's changes.

Why: a domain's summary is made from its members' entries (on their Nodes) and their
NVLinkFabricReady condition. Collected from every agent Node at every pass, a pass costs
O(nodes), and while a fleet starts passes come as fast as the debounce allows, so the controller's
CPU grew faster than the fleet (2.3x from 8 to 16 racks in bench/scale.py). Kept here per change
of a Node, a pass costs O(domains): each domain's members carry a version that changes exactly when
its entries or their health do, and an unchanged version is not summarised again.

The index replaces a node's whole contribution with what its latest record says, so a change told
twice (a seed racing a watch event) is harmless.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from nvlfabric.api import computedomain as api
from nvlfabric.controller.cache import AgentNode
from nvlfabric.controller.informer import Key, Listener

DomainKey = tuple[str, str]  # (namespace, name)


class NodeSource(Protocol):
    """What the index reads of the Node informer (informer.Informer[AgentNode])."""

    def listen(self, listener: Listener) -> None: ...

    def items(self) -> Mapping[Key, AgentNode]: ...


class Members:
    def __init__(self, nodes: NodeSource) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, AgentNode] = {}
        self._entries: dict[DomainKey, dict[str, api.NodeStatus]] = {}
        self._version: dict[DomainKey, int] = {}
        self._sorted: dict[DomainKey, tuple[int, list[api.NodeStatus]]] = {}
        self._unhealthy: dict[str, str] = {}
        self._down: dict[str, str] = {}
        self._cliques: dict[str, int] = {}
        self._tick = itertools.count(1)
        nodes.listen(self._changed)
        # The controller makes its index before its informers list; Nodes already held (an
        # informer shared with an earlier pass, tests) are seeded, unless a watch event told of
        # them first: that record is the newer one.
        for key, node in nodes.items().items():
            with self._lock:
                told = key[1] in self._nodes
            if not told:
                self._changed("ADDED", key, None, node)

    def _changed(self, kind: str, key: Any, old: AgentNode | None, new: AgentNode | None) -> None:
        name = key[1]
        with self._lock:
            before = self._nodes.pop(name, None)
            if new is not None:
                self._nodes[name] = new
            if before is not None and before.clique:
                self._count(before.clique, -1)
            if new is not None and new.clique:
                self._count(new.clique, +1)
            sick_before = self._unhealthy.pop(name, None)
            if new is not None and new.unhealthy is not None:
                self._unhealthy[name] = new.unhealthy
            down_before = self._down.pop(name, None)
            if new is not None and new.down is not None:
                self._down[name] = new.down
            health_changed = (sick_before, down_before) != ((new.unhealthy, new.down) if new is not None
                                                            else (None, None))
            was = {(ns, n): e for ns, n, e in before.reports} if before is not None else {}
            now = {(ns, n): e for ns, n, e in new.reports} if new is not None else {}
            for domain in was.keys() | now.keys():
                entry = now.get(domain)
                held = self._entries.setdefault(domain, {})
                if entry is None:
                    held.pop(name, None)
                else:
                    held[name] = entry
                if not held:
                    del self._entries[domain]
                if health_changed or entry != was.get(domain):
                    self._version[domain] = next(self._tick)

    def _count(self, clique: str, by: int) -> None:
        n = self._cliques.get(clique, 0) + by
        if n > 0:
            self._cliques[clique] = n
        else:
            self._cliques.pop(clique, None)

    def of(self, domain: DomainKey) -> tuple[int, list[api.NodeStatus]]:
        """The domain's member entries sorted by node name, with their version (0: none ever)."""
        with self._lock:
            version = self._version.get(domain, 0)
            cached = self._sorted.get(domain)
            if cached is not None and cached[0] == version:
                return cached
            entries = sorted(self._entries.get(domain, {}).values(), key=lambda e: e.name)
            self._sorted[domain] = (version, entries)
            return version, entries

    def forget(self, live: set[DomainKey]) -> None:
        """Drop the sorted copies of domains no longer served (their entries stay while reported)."""
        with self._lock:
            for domain in self._sorted.keys() - live:
                del self._sorted[domain]

    def unhealthy(self) -> dict[str, str]:
        """Node name → why its agent reports the NVLink fabric unhealthy (sick nodes only)."""
        with self._lock:
            return dict(self._unhealthy)

    def down(self) -> dict[str, str]:
        """Node name → why its Ready condition is not True (down nodes only)."""
        with self._lock:
            return dict(self._down)

    def known(self) -> frozenset[str]:
        """The agent Nodes that exist (as the Node informer holds them)."""
        with self._lock:
            return frozenset(self._nodes)

    def cliques(self) -> dict[str, int]:
        """Clique → agent Nodes labelled with it."""
        with self._lock:
            return dict(self._cliques)
