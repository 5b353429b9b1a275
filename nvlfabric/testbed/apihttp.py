"""The harness's few HTTP(S) calls, with urllib: whether a health endpoint answers 200, and as the
admin (bearer token, the cluster CA) whether an API path answers, which simulated Nodes are Ready
and schedulable, and a Node status patch.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def http_ok(url: str, *, token: str | None = None, cafile: Path | None = None, insecure: bool = False) -> bool:
    ctx: ssl.SSLContext | None = None
    if url.startswith("https"):
        if insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@dataclass(frozen=True)
class Admin:
    """The API server as its admin calls it."""

    server: str
    token: str
    cafile: Path

    def ok(self, path: str) -> bool:
        return http_ok(self.server + path, token=self.token, cafile=self.cafile)

    def ready_nodes(self) -> set[str]:
        """Nodes that are Ready and no longer carry the not-ready taint (i.e. schedulable)."""
        req = urllib.request.Request(self.server + "/api/v1/nodes?labelSelector=nvlfabric.io%2Fsimulated%3Dtrue")
        req.add_header("Authorization", f"Bearer {self.token}")
        ctx = ssl.create_default_context(cafile=str(self.cafile))
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                items = json.load(resp)["items"]
        except (urllib.error.URLError, OSError, ValueError):
            return set()
        out = set()
        for item in items:
            conditions = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
            taints = [t["key"] for t in item.get("spec", {}).get("taints", [])]
            if conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                out.add(item["metadata"]["name"])
        return out

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        req = urllib.request.Request(f"{self.server}/api/v1/nodes/{name}/status", data=json.dumps(patch).encode(),
                                     method="PATCH", headers={"Content-Type": "application/merge-patch+json",
                                                              "Authorization": f"Bearer {self.token}"})
        ctx = ssl.create_default_context(cafile=str(self.cafile))
        with urllib.request.urlopen(req, timeout=10, context=ctx):
            pass
