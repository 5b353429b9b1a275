"""A rack's labels and taints on its Nodes: one dynamic resource per rack (`nvlfabric:RackNodes`).

Until this, `Nvl72Rack` made one pulumi-kubernetes `NodePatch` per node. The engine, the Python
SDK and the state pay per resource (a 64-rack program had 1,152 NodePatches, each with a whole Node
in its outputs): at 32 racks 14 s of every preview and 41 s of a `pulumi up` went by before the
first ComputeDomain was created (bench/scale.py). One resource per rack applies the same fields
the same way, server-side apply under a field manager of the rack's own
(`nvlfabric-rack-<its resource name>`), and its diff is a comparison of inputs, with no cluster round trip.

- **Apply**: each node gets `metadata.labels` (the rack's) and, when the rack declares taints,
  `spec.taints` (an atomic list: the rack's taints replace it, as before), with the Node's
  `resourceVersion` as a precondition so that a Node deleted since the preview is not created again
  by the apply. Nodes are written 16 at a time.
- **Relinquish** (a node taken out of the rack, the rack deleted): an apply of nothing under the
  rack's field manager, which removes what it alone owns and leaves what another manager owns too.
- **Upgrade from NodePatch children**: the new resource applies the same values first (co-owned
  with the NodePatch's manager), then the engine deletes the NodePatches, whose manager lets go of
  its share; the labels and taints never leave the Node (tests/provider/test_racknodes.py).
- **Refresh** reports in `drift` the nodes whose labels or taints are no longer what the rack
  applied (someone's `kubectl label`, a Node re-registered), and the next `up` applies them again.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightkube.resources.core_v1 import Node
from pulumi import ResourceOptions
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    UpdateResult,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api import errors as api_errors
from nvlfabric.api.names import DNS_LABEL, DNS_LABEL_MAX, RACK_FIELD_MANAGER_PREFIX
from nvlfabric.kube.errors import api_call
from nvlfabric.provider import host, kube

IN_FLIGHT = 16
CONFLICT_TRIES = 3


class RackNodesArgs(BaseModel):
    """Inputs of a rack's node labelling."""

    model_config = ConfigDict(extra="forbid")

    rack: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="the rack's name")
    manager: str = Field(min_length=1, max_length=128, description="the field manager its fields are applied with")
    nodes: list[str] = Field(description="the Nodes to label (those that exist)")
    labels: dict[str, str] = Field(description="labels every node gets")
    taints: list[dict[str, str]] = Field(default_factory=list,
                                         description="the nodes' taint list; empty: the rack leaves taints alone")


def field_manager(resource_name: str) -> str:
    """The field manager of a rack's fields: its component's resource name, which a rename of the
    rack (`name=`) keeps, so the renamed rack updates its own labels in place."""
    if len(resource_name) <= 100 and resource_name.isprintable() and "/" not in resource_name:
        return f"{RACK_FIELD_MANAGER_PREFIX}{resource_name}"
    return f"{RACK_FIELD_MANAGER_PREFIX}{hashlib.sha256(resource_name.encode()).hexdigest()[:16]}"


def _body(name: str, rv: str | None, labels: dict[str, str] | None,
          taints: list[dict[str, str]] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if rv:
        meta["resourceVersion"] = rv
    if labels:
        meta["labels"] = labels
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if taints:
        body["spec"] = {"taints": taints}
    return body


def _each(nodes: Sequence[str], fn: Callable[[str], Any]) -> list[Any]:
    if not nodes:
        return []
    with ThreadPoolExecutor(min(IN_FLIGHT, len(nodes)), thread_name_prefix="rack-nodes") as pool:
        return list(pool.map(fn, nodes))


host.install()  # in the dynamic provider host: our errors as their message, no traceback


class RackNodesProvider(kube.KubeProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        try:
            RackNodesArgs.model_validate({k: v for k, v in news.items() if k in RackNodesArgs.model_fields})
        except ValidationError as exc:
            return CheckResult(news, [CheckFailure(".".join(str(p) for p in e["loc"]) or "(inputs)", str(e["msg"]))
                                      for e in exc.errors()])
        return CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        if olds.get("manager") != news.get("manager"):  # another owner: apply anew, then let go of the old
            return DiffResult(changes=True, replaces=["manager"], delete_before_replace=False)
        changed = [k for k in ("rack", "nodes", "labels", "taints") if (olds.get(k) or None) != (news.get(k) or None)]
        return DiffResult(changes=bool(changed or olds.get("drift")))

    def create(self, props: dict[str, Any]) -> CreateResult:
        args = self._args(props)
        return CreateResult(args.rack, self._outputs(args, self._apply(args, args.nodes)))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        args = self._args(news)
        missing = self._apply(args, args.nodes)
        self._relinquish(args.manager, [n for n in olds.get("nodes") or [] if n not in args.nodes])
        return UpdateResult(self._outputs(args, missing))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        self._relinquish(str(props.get("manager")), list(props.get("nodes") or []))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        args = self._args(props)
        client = self._client()

        def drifted(name: str) -> bool:
            try:
                with api_call(f"read Node {name}"):
                    node = client.get(Node, name)
            except api_errors.NotFound:
                return False  # gone: nothing to apply to (a Node that comes back is a new preview's)
            labels = (node.metadata.labels if node.metadata else None) or {}
            taints = [{k: v for k, v in t.to_dict().items() if k in ("key", "value", "effect")}
                      for t in ((node.spec.taints if node.spec else None) or [])]
            return any(labels.get(k) != v for k, v in args.labels.items()) or \
                (bool(args.taints) and any(t not in taints for t in args.taints))

        drift = [n for n, d in zip(args.nodes, _each(args.nodes, drifted), strict=True) if d]
        return ReadResult(id_, self._outputs(args, list(props.get("missing") or []), drift), props | {"drift": drift})

    # -- the writes ---------------------------------------------------------------------------------

    @staticmethod
    def _args(props: dict[str, Any]) -> RackNodesArgs:
        return RackNodesArgs.model_validate({k: v for k, v in props.items() if k in RackNodesArgs.model_fields})

    @staticmethod
    def _outputs(args: RackNodesArgs, missing: list[str], drift: list[str] | None = None) -> dict[str, Any]:
        return args.model_dump() | {"missing": missing, "drift": drift or []}

    def _apply(self, args: RackNodesArgs, nodes: Sequence[str]) -> list[str]:
        """Apply the rack's fields to each node; returns the nodes that do not exist."""
        client, manager = self._client(), args.manager

        def one(name: str) -> str | None:
            for attempt in range(CONFLICT_TRIES):
                try:
                    with api_call(f"read Node {name}"):
                        node = client.get(Node, name)
                except api_errors.NotFound:
                    return name
                rv = node.metadata.resourceVersion if node.metadata else None
                try:
                    with api_call(f"label Node {name} for rack {args.rack}"):
                        client.apply(Node.from_dict(_body(name, rv, args.labels, args.taints)), field_manager=manager)
                    return None
                except api_errors.Conflict:  # changed since read (the precondition), or gone: read again
                    if attempt == CONFLICT_TRIES - 1:
                        raise
            return None

        return [n for n in _each(nodes, one) if n is not None]

    def _relinquish(self, manager: str, nodes: Sequence[str]) -> None:
        """Give up the rack's share of each node's labels and taints (fields another manager owns
        too stay); a node that is gone has nothing to give up."""
        client = self._client()

        def one(name: str) -> None:
            for attempt in range(CONFLICT_TRIES):
                try:
                    with api_call(f"read Node {name}"):
                        node = client.get(Node, name)
                except api_errors.NotFound:
                    return
                rv = node.metadata.resourceVersion if node.metadata else None
                try:
                    with contextlib.suppress(api_errors.NotFound), api_call(f"unlabel Node {name} ({manager})"):
                        client.apply(Node.from_dict(_body(name, rv, None, None)), field_manager=manager)
                    return
                except api_errors.Conflict:
                    if attempt == CONFLICT_TRIES - 1:
                        raise

        _each(nodes, one)


class RackNodes(Resource, module="nvlfabric", name="RackNodes"):
    """The labels (and taints) one rack applies to its Nodes."""

    missing: Any
    drift: Any

    def __init__(self, resource_name: str, args: RackNodesArgs, opts: ResourceOptions | None = None) -> None:
        super().__init__(RackNodesProvider(), resource_name, args.model_dump() | {"missing": None, "drift": None},
                         opts)
