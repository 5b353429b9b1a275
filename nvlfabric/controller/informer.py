"""A list-then-watch cache of one kind of object: what the controller's passes read instead of the
API server.

Why: a pass that reads the cluster each time (every agent's Node, each clique's pool slices, every
domain's claims, every bound pod for a placement) costs O(nodes + domains) requests, and passes
come O(changes) times, so the controller's cost grows with the square of the fleet. With one list
and one watch per kind, a pass is a walk over memory and the API server sees O(changes) events, as
client-go's informers do it (docs/architecture.md, Scale).

An `Informer` keeps `slim(obj)` of each object by key (what the readers need, parsed once per
change), tells its listeners of every change (kind, key, old, new), and is level-based like the
rest of the controller: a failed or expired watch lists again and reports the difference. Not
watching (a test calling a pass by hand, or before `run` started), `fresh()` lists on demand, so a
pass always reads the cluster as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from lightkube import Client

from nvlfabric.controller import endpoint

log = logging.getLogger("nvlfabric.controller")

T = TypeVar("T")
Key = tuple[str, str]  # (namespace or "", name)
Listener = Callable[[str, Key, Any, Any], None]  # (kind, key, old slim or None, new slim or None)
WATCH_TIMEOUT_S = 60


def key_of(obj: Any) -> Key:
    meta = obj.metadata
    return (meta.namespace or "", meta.name or "") if meta is not None else ("", "")


class Informer(Generic[T]):
    def __init__(self, client: Client, resource: Any, *, slim: Callable[[Any], T], namespaced: bool = True,
                 labels: Mapping[str, Any] | None = None, fields: Mapping[str, Any] | None = None,
                 name: str | None = None) -> None:
        self.client, self.resource, self.slim = client, resource, slim
        self.name: str = name or str(getattr(resource, "__name__", resource))
        self._scope: dict[str, Any] = {"namespace": "*"} if namespaced else {}
        self._selector: dict[str, Any] = {k: v for k, v in (("labels", labels), ("fields", fields)) if v}
        self._items: dict[Key, T] = {}
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self.watching = False
        self.synced = threading.Event()
        self.events = 0  # watch events applied (tests, logs)

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # -- reading --------------------------------------------------------------------------------

    def fresh(self) -> dict[Key, T]:
        """The cache, listed now unless a watch keeps it current."""
        if not self.watching:
            self.refresh()
        return self.items()

    def sync(self) -> None:
        """List now unless a watch keeps the cache current (what `fresh` does, without the copy:
        for readers of an index its listeners keep)."""
        if not self.watching:
            self.refresh()

    def items(self) -> dict[Key, T]:
        with self._lock:
            return dict(self._items)

    def get(self, key: Key) -> T | None:
        with self._lock:
            return self._items.get(key)

    # -- writing --------------------------------------------------------------------------------

    def put(self, obj: Any) -> None:
        """What a write of ours returned: readers see it before the watch brings it back."""
        self._apply("MODIFIED", obj)

    def refresh(self) -> str | None:
        """List, replace the cache, tell the listeners what changed; the list's resourceVersion."""
        listing = self.client.list(self.resource, **self._scope, **self._selector)
        new = {key_of(obj): self.slim(obj) for obj in listing}
        with self._lock:
            old, self._items = self._items, new
        for key in old.keys() | new.keys():
            before, after = old.get(key), new.get(key)
            if before != after:
                self._tell("DELETED" if after is None else "ADDED" if before is None else "MODIFIED", key, before,
                           after)
        self.synced.set()
        return getattr(listing, "resourceVersion", None)

    def _apply(self, kind: str, obj: Any) -> None:
        key = key_of(obj)
        after = None if kind == "DELETED" else self.slim(obj)
        with self._lock:
            before = self._items.pop(key, None) if after is None else self._items.get(key)
            if after is not None:
                self._items[key] = after
        if before != after:
            self._tell(kind, key, before, after)

    def _tell(self, kind: str, key: Key, before: Any, after: Any) -> None:
        for listener in self._listeners:
            try:
                listener(kind, key, before, after)
            except Exception:  # a listener's bug must not stop the watch
                log.exception("%s informer: a listener failed on %s %s", self.name, kind, key)

    def run(self, stop: Callable[[], bool]) -> None:
        """List, then watch from the list's resourceVersion, until `stop()`. A watch that ends at
        its server timeout is watched again from the last version it showed; after a failure (a
        410 Gone among them) the cache is listed again, backing off as every watch of the
        controller does (counted and logged: endpoint.watch_failed)."""
        failures, rv = 0, None
        while not stop():
            try:
                if rv is None:
                    rv = self.refresh()
                    self.watching = True
                for kind, obj in self.client.watch(self.resource, **self._scope, **self._selector,
                                                   resource_version=rv, server_timeout=WATCH_TIMEOUT_S):
                    failures = 0
                    if stop():
                        break
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.events += 1
                        self._apply(kind, obj)
                        rv = (obj.metadata.resourceVersion if obj.metadata else None) or rv
            except Exception as exc:  # a failed list or watch is listed again, never fatal
                self.watching, rv = False, None
                failures += 1
                time.sleep(endpoint.watch_failed(self.name, exc, failures, log))
        self.watching = False

    def start(self, stop: Callable[[], bool]) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name=f"informer-{self.name}", daemon=True)
        thread.start()
        return thread
