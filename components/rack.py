"""`Nvl72Rack`: a GB200 NVL72 rack as code: its nodes, the clique they should form, their labels.

The clique is discovered by the node agents (NVML) and written to the Nodes' `nvlfabric.io/clique`
label; `expected_clique`, when given, is recorded on the nodes as `nvlfabric.io/expected-clique`
so a mismatch (a miscabled tray, a tray in the wrong rack) is visible with one label selector.
"""

from __future__ import annotations

from typing import Final

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict, Field, field_validator

from components._args import DNS_LABEL, validate

NODES_PER_RACK: Final = 18
GPUS_PER_NODE: Final = 4
RACK_LABEL: Final = "nvlfabric.io/rack"
EXPECTED_CLIQUE_LABEL: Final = "nvlfabric.io/expected-clique"


class Nvl72RackArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="the rack's name (a DNS label), e.g. rack-0")
    nodes: list[str] = Field(min_length=1, max_length=NODES_PER_RACK,
                             description=f"the rack's Kubernetes node names, 1..{NODES_PER_RACK} compute trays")
    expected_clique: str | None = Field(None, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,40}[A-Za-z0-9])?$",
                                        description="<clusterUuid>.<cliqueId> the rack's trays should report "
                                                    "(a label value of at most 42 characters), or None")
    label_nodes: bool = Field(True, description="label the rack's Nodes (nvlfabric.io/rack, expected clique)")

    @field_validator("nodes")
    @classmethod
    def _unique(cls, nodes: list[str]) -> list[str]:
        if len(set(nodes)) != len(nodes):
            raise ValueError("node names must be unique")
        return nodes


class Nvl72Rack(pulumi.ComponentResource):
    """One NVL72 rack: up to 18 nodes x 4 GPUs on one NVLink fabric."""

    nodes: pulumi.Output[list[str]]
    gpus: pulumi.Output[int]
    expected_clique: pulumi.Output[str | None]

    def __init__(self, resource_name: str, *, nodes: list[str], name: str | None = None,
                 expected_clique: str | None = None, label_nodes: bool = True,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        self.args = validate(Nvl72RackArgs, "Nvl72Rack", resource_name, {
            "name": name if name is not None else resource_name, "nodes": nodes,
            "expected_clique": expected_clique, "label_nodes": label_nodes})
        super().__init__("nvlfabric:index:Nvl72Rack", resource_name, None, opts)
        a = self.args
        if a.label_nodes:
            node_labels = {RACK_LABEL: a.name}
            if a.expected_clique:
                node_labels[EXPECTED_CLIQUE_LABEL] = a.expected_clique
            self.patches = [k8s.core.v1.NodePatch(f"{resource_name}-{n}", metadata={"name": n, "labels": node_labels},
                                                  opts=pulumi.ResourceOptions(parent=self))
                            for n in a.nodes]
        self.nodes = pulumi.Output.from_input(list(a.nodes))
        self.gpus = pulumi.Output.from_input(len(a.nodes) * GPUS_PER_NODE)
        self.expected_clique = pulumi.Output.from_input(a.expected_clique)
        self.register_outputs({"nodes": self.nodes, "gpus": self.gpus, "expected_clique": self.expected_clique})
