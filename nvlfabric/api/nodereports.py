"""The node agents' reports on their own Nodes: one annotation per ComputeDomain the node serves.

An agent writes its entry for a domain (an `api.computedomain.NodeStatus`) only onto its own Node, as
the annotation `nvlfabric.io/cd-<hash of namespace/name>` (names.NODE_REPORT_PREFIX); the controller
reads every Node's reports and copies them into the domains' `status.nodes`, so it alone writes a
domain's status (an admission policy keeps agents to their own Node). This module is that protocol
and nothing else: the key, the value, and reading them back.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict

from nvlfabric.api.computedomain import NodeStatus
from nvlfabric.api.names import NODE_REPORT_PREFIX

__all__ = ["NodeReport", "node_report", "node_report_key", "node_reports"]


class NodeReport(BaseModel):
    """A node agent's report for one ComputeDomain, kept on its own Node as the annotation
    `node_report_key(namespace, name)` (JSON)."""

    model_config = ConfigDict(extra="ignore")
    namespace: str
    name: str
    entry: NodeStatus


def node_report_key(namespace: str, name: str) -> str:
    """The Node annotation holding an agent's report for ComputeDomain `namespace/name`: a hash,
    since an annotation's name part holds 63 characters and the two names together up to 120."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:20]
    return f"{NODE_REPORT_PREFIX}{digest}"


def node_report(namespace: str, name: str, node: NodeStatus) -> dict[str, str]:
    """The annotation (key → JSON) with which a node agent reports its entry of a ComputeDomain."""
    return {node_report_key(namespace, name):
            NodeReport(namespace=namespace, name=name, entry=node).model_dump_json(by_alias=True, exclude_none=True)}


def node_reports(annotations: dict[str, str] | None) -> list[NodeReport]:
    """The reports a Node carries (pure); an annotation that does not parse is no report."""
    out = []
    for key, value in (annotations or {}).items():
        if key.startswith(NODE_REPORT_PREFIX):
            try:
                report = NodeReport.model_validate_json(value)
            except ValueError:
                continue
            if node_report_key(report.namespace, report.name) == key:
                out.append(report)
    return out
