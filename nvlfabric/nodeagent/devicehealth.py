"""The DRA health stream's source: which prepared channels this node has, and whether they are
healthy. A channel is useless without the NVLink fabric, so each is as healthy as the node's
fabric is (fabrichealth's verdict); server.py streams the answer to the kubelet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from nvlfabric.api import names
from nvlfabric.nodeagent import checkpoint, discovery, fabrichealth
from nvlfabric.nodeagent.driver import ChannelDriver
from nvlfabric.nodeagent.server import DeviceHealth


def device_health(driver: ChannelDriver, monitor: fabrichealth.Monitor,
                  found: Callable[[], discovery.NodeDiscovery]) -> Callable[[], list[DeviceHealth]]:
    """The prepared channels with the fabric's verdict. Called every second per open stream, so the
    answer is rebuilt only when the checkpoint, the fabric or its verdict changed (all are replaced,
    never modified, so identity says whether they changed)."""
    cache: dict[str, object] = {}

    def health() -> list[DeviceHealth]:
        node, state, verdict = found(), driver.state, monitor.verdict
        if cache.get("node") is node and cache.get("state") is state and cache.get("verdict") is verdict:
            return cast(list[DeviceHealth], cache["value"])
        healthy, message = verdict.healthy, "" if verdict.healthy else verdict.message
        out: list[DeviceHealth] = []
        for e in state.by_state(checkpoint.ClaimState.PREPARE_COMPLETED):
            if e.allocation.device:  # the pool device the claim was allocated
                pool, _, dev = e.allocation.device.partition("/")
                out.append(DeviceHealth(pool, dev, healthy, message))
            else:  # entries from before the device was recorded (allocation mode Single)
                out.extend(DeviceHealth(names.pool_name(node.clique or ""), names.channel_device(ch), healthy, message)
                           for ch in e.allocation.channels)
        cache.update(node=node, state=state, verdict=verdict, value=out)
        return out

    return health
