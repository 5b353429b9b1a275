"""The addons' controllers started beside the control plane (which addons there are, and their
CRDs, RBAC and webhooks: nvlfabric/sim/addons.py)."""

from __future__ import annotations

from pathlib import Path

from nvlfabric.sim import addons as catalog
from nvlfabric.sim import processes
from nvlfabric.sim.paths import Tools
from nvlfabric.testbed.apihttp import http_ok
from nvlfabric.testbed.launcher import Launcher


def start(run: Launcher, tools: Tools, name: str, *, kubeconfig: Path) -> None:
    """Its objects applied, then its controller; returns once the controller says it is ready."""
    addon = catalog.ADDONS[name]
    webhook_port, health_port = processes.free_loopback_ports(2)
    client = catalog.admin_client(kubeconfig)
    try:
        prepared = catalog.prepare(addon, state_dir=run.state_dir, client=client, binary=tools.binary(addon.binary),
                                   webhook_port=webhook_port, health_port=health_port)
    finally:
        client.close()
    run.launch(name, prepared.argv)
    run.wait(f"addon {name} to be ready", lambda: http_ok(prepared.ready_url))
