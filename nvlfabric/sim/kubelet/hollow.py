"""Hollow nodes: simulated nodes that cost a few hundred kilobytes instead of ~90 MB of processes.

A rack of real simulated nodes runs, per node, nvlfabric's node agent (a Python process with gRPC
and NVML, ~60 MB), its IMEX keeper (C, ~2 MB; a Python process of ~30 MB before 0.2) and the
keeper's IMEX daemons: 144 nodes take ~9 GB, so a few dozen racks never fit on a 24 GB machine.
Kubernetes' own scalability tests have the same wall and answer it with hollow nodes (kubemark):
a kubelet whose container runtime is a stand-in, so the control plane sees thousands of nodes that
cost almost nothing. A hollow node here is the
same idea one layer down, for the per-node software of *our* driver:

- its kubelet is the simulated kubelet (Node, Lease heartbeats, pod status, DRA prepare and
  unprepare), exactly as on every simulated node;
- the pods of a DaemonSet (the node-level software: nvlfabric's agent and IMEX keeper, or anyone
  else's) run nothing and are Running and Ready as soon as their claims are prepared, as kubemark
  runs every pod; every other pod whose image maps to a local program runs for real (the
  controller's Deployment may land on a hollow node), and only then does the node get its PID
  namespace and its kubelet API;
- once nvlfabric's agent pod runs there, `HollowAgent` stands in for the agent process: it writes
  what the agent writes to the API server, with the contract's names and models
  (`nvlfabric.api`): the clique label and `fabric-ready` label from the node's NVML topology, the
  `NVLinkFabricReady` condition, and per ComputeDomain the node report annotation that the
  controller copies into the domain's `status.nodes`; it answers the kubelet's prepare and
  unprepare as the agent does for a healthy fabric, with no IMEX daemon and no files.

So what the central components see of a hollow node (ResourceSlices, claim allocation and
reservation, the per-node status entries the controller summarises, Node labels and conditions)
is what they see of a real one; tests/sim/test_hollow_nodes.py compares a hollow node with a real
agent's node in one cluster. What a hollow node lacks: IMEX daemons, CDI specs and device nodes
(its containers get no channel device), fabric faults (`nvlfabric-sim fault` on NVML), and
`kubectl logs` of its DaemonSet pods. Production code never knows: it sees an API server.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim
from pydantic import ValidationError

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.api.channelconfig import ChannelConfig
from nvlfabric.api.kubelet.types import ClaimRef, PreparedDevice
from nvlfabric.api.nodereports import node_report, node_report_key
from nvlfabric.kube.errors import api_call
from nvlfabric.sim.images import AGENT_IMAGE, image_name
from nvlfabric.sim.nodes import SimNode

log = logging.getLogger("nvlfabric.sim.kubelet.hollow")

AGENT_ROLE = "agent"
"""`python -m nvlfabric agent`: the node agent's argument to nvlfabric's image."""
REGISTERED_REASON = "FabricRegistered"
"""The reason the node agent gives `NVLinkFabricReady` for a healthy, registered fabric."""


def is_agent(image: str, argv: Sequence[str]) -> bool:
    """Whether a container is nvlfabric's node agent: nvlfabric's image run with `agent`."""
    return image_name(image) == AGENT_IMAGE and AGENT_ROLE in argv[-1:]


class HollowAgent:
    """nvlfabric's node agent on a hollow node, as the kubelet and the API server see it. Has the
    kubelet's plugin interface (`prepare`, `unprepare`, `close`), so the kubelet calls it where it
    would call the agent over gRPC."""

    driver = names.DRIVER
    service = "hollow"
    health_service = ""
    socket_id = (0, 0)

    def __init__(self, client: AsyncClient, node: SimNode, clique: str) -> None:
        self.client = client
        self.node = node
        self.clique = clique
        self.endpoint = f"hollow://{node.name}"
        self.registration_socket = Path(self.endpoint)
        self._claims: dict[str, tuple[str, str]] = {}
        """Claim UID → the (namespace, name) of its ComputeDomain, for every claim prepared here."""

    async def start(self) -> None:
        """What the agent writes when it starts on a healthy node: its clique, then its condition."""
        with api_call(f"label Node {self.node.name}"):
            await self.client.patch(Node, self.node.name, {"metadata": {"labels": {
                names.CLIQUE_LABEL: self.clique, names.FABRIC_READY_LABEL: "true"}}})
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with api_call(f"write the {names.FABRIC_CONDITION} condition of Node {self.node.name}"):
            await self.client.patch(Node.Status, self.node.name, {"status": {"conditions": [{
                "type": names.FABRIC_CONDITION, "status": "True", "reason": REGISTERED_REASON,
                "message": f"NVLink clique {self.clique}, {names.GPUS_PER_NODE} GPUs healthy",
                "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]}})
        log.info("node %s: hollow agent up in clique %s", self.node.name, self.clique)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        out: dict[str, list[PreparedDevice] | str] = {}
        for c in claims:
            try:
                out[c.uid] = await self._prepare_one(c)
            except errors.NvlfabricError as exc:
                out[c.uid] = str(exc)
            except ValueError as exc:
                out[c.uid] = f"claim {c.namespace}/{c.name}: {exc}"
        return out

    async def _prepare_one(self, c: ClaimRef) -> list[PreparedDevice]:
        with api_call(f"read claim {c.namespace}/{c.name}"):
            claim = (await self.client.get(ResourceClaim, c.name, namespace=c.namespace)).to_dict()
        if (claim.get("metadata") or {}).get("uid") != c.uid:
            raise ValueError("got replaced (another UID)")
        devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        ours = [r for r in devices.get("results") or [] if r.get("driver") == names.DRIVER]
        if not ours or names.clique_of_pool(ours[0].get("pool", "")) != self.clique:
            raise ValueError(f"not allocated a channel of clique {self.clique} (node {self.node.name})")
        raw = [(cfg.get("opaque") or {}).get("parameters") for cfg in devices.get("config") or []
               if (cfg.get("opaque") or {}).get("driver") == names.DRIVER]
        try:
            config = ChannelConfig.model_validate(raw[-1] if raw else None)
        except ValidationError as exc:
            raise ValueError(f"no valid {names.DRIVER} configuration: {exc.errors()[0]['msg']}") from None
        cd = config.compute_domain
        if cd.namespace != c.namespace:
            raise ValueError(f"computeDomain.namespace {cd.namespace} is not the claim's namespace")
        self._claims[c.uid] = (cd.namespace, cd.name)
        await self._report(cd.namespace, cd.name, ready=True)
        r = ours[0]
        return [PreparedDevice(request_names=(str(r.get("request", "")).split("/")[0],), pool_name=r["pool"],
                               device_name=r["device"], cdi_device_ids=())]

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        for c in claims:
            domain = self._claims.pop(c.uid, None)
            if domain is not None and domain not in self._claims.values():
                await self._report(*domain, ready=None)  # the node's last claim of it: withdrawn
        return {c.uid: "" for c in claims}

    async def _report(self, namespace: str, name: str, *, ready: bool | None) -> None:
        """This node's report for the domain (the contract's annotation), or its withdrawal."""
        report: dict[str, Any]
        if ready is None:
            report = {node_report_key(namespace, name): None}
        else:
            report = dict(node_report(namespace, name, api.NodeStatus(
                name=self.node.name, address=self.node.address, clique=self.clique, ready=ready)))
        with api_call(f"report node {self.node.name} for ComputeDomain {namespace}/{name}"):
            await self.client.patch(Node, self.node.name, {"metadata": {"annotations": report}})

    async def close(self) -> None:
        return None
