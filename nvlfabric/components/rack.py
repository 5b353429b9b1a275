"""`Nvl72Rack`: a GB200 NVL72 rack as code: its nodes, the clique they should form, their labels
and taints, and what the cluster says about them.

The clique is discovered by the node agents (NVML) and written to the Nodes' `nvlfabric.io/clique`
label; `expected_clique`, when given, is recorded on the nodes as `nvlfabric.io/expected-clique`
so a mismatch (a miscabled tray, a tray in the wrong rack) is visible with one label selector.

At every preview and update the component also reads the rack's Nodes (nvlfabric/clusterview/racks.py): its
outputs `discovered_cliques`, `clique_mismatches` and `free_gpus` say what the agents found, and a
mismatch with the declared clique (or a rack whose nodes report more than one clique) is a
warning in the `pulumi up` output naming the nodes. These are read when the program runs, before
the update's own changes.

Labels and taints are applied by one resource for the whole rack (nvlfabric/provider/racknodes.py:
server-side apply of each Node's metadata and spec.taints under the rack's own field manager).
A Node's taint list is one atomic field: the rack's taints replace the list, so declare every
taint a rack's nodes should carry (the kubelet's and the node controller's own taints come back
by themselves).

Hot spares (issue 51): GB200 operators run a rack's jobs on 16 of its 18 trays and keep 2 free to
replace a lost tray. `spares=2` says so: it is written on each of the rack's Nodes as
`nvlfabric.io/spares: "2"` (nothing is written for 0, the default), and the controller keeps that
many of the clique's nodes free of new ComputeDomains, placing only replacements of a running
domain's lost members (and growing domains) there. It is a count, not named nodes: any fully free
node of the clique is a spare. `kubectl get nodes -L nvlfabric.io/spares` shows it per node; the
rack's outputs `spares` and `free_nodes` (its nodes fully free now) sit beside `free_gpus`, and the
preview report's rack table has a spares column once a rack declares any.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import pulumi
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from nvlfabric.api.names import (
    DNS_LABEL,
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_MAX,
    EXPECTED_CLIQUE_LABEL,
    GPU_RESOURCE,
    GPUS_PER_NODE,
    NODES_PER_CLIQUE,
    RACK_LABEL,
    SPARES_LABEL,
    is_dns_subdomain,
)
from nvlfabric.clusterview import racks
from nvlfabric.components import capacity, program, served
from nvlfabric.components.args import ComponentArgsError, validate
from nvlfabric.provider import kube, racknodes
from nvlfabric.provider.racknodes import RackNodesArgs

NODE_NAME_RULE: Final = (f"a Kubernetes Node name is a DNS subdomain: at most {DNS_SUBDOMAIN_MAX} characters, "
                         "lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with "
                         "a letter or digit")


def _node_name(name: str) -> str:
    if not is_dns_subdomain(name):
        raise ValueError(f"not a Node name: {NODE_NAME_RULE}; a Node of this name cannot exist, so the rack could "
                         "never label it: write the name as `kubectl get nodes` shows it")
    return name


#: A Node name (checked as the API server checks it; the JSON schema says so too).
NodeName = Annotated[str, AfterValidator(_node_name),
                     WithJsonSchema({"type": "string", "pattern": DNS_SUBDOMAIN, "maxLength": DNS_SUBDOMAIN_MAX})]


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
                     description="a label-style key, e.g. nvidia.com/gpu")
    # Kubernetes limits a taint's value as a label value: a DNS label's length, not its pattern.
    value: str = Field("", max_length=DNS_LABEL_MAX, description="the taint's value (may be empty)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="NoSchedule (default), PreferNoSchedule or NoExecute")


class Nvl72RackArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX,
                      description="the rack's name (a DNS label), e.g. rack-0")
    nodes: list[NodeName] = Field(min_length=1, max_length=NODES_PER_CLIQUE,
                                  description=f"the rack's Kubernetes node names (DNS subdomains), "
                                              f"1..{NODES_PER_CLIQUE} compute trays")
    expected_clique: str | None = Field(None, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
                                        description="<clusterUuid>.<cliqueId> the rack's trays should report "
                                                    "(a label value of at most 63 characters), or None")
    label_nodes: bool = Field(True, description="label the rack's Nodes (nvlfabric.io/rack, expected clique, "
                                                "spares)")
    taints: list[Taint] = Field(default_factory=list, description="taints for the rack's Nodes, e.g. "
                                "[{key: nvidia.com/gpu, value: present, effect: NoSchedule}] (they replace the "
                                "Nodes' taint lists; needs label_nodes)")
    spares: int = Field(0, ge=0, le=NODES_PER_CLIQUE - 1,
                        description=f"how many of the rack's nodes to keep free as hot spares for replacements of "
                                    f"lost members of running ComputeDomains (new domains are not placed on them; "
                                    f"any fully free node counts), 0..{NODES_PER_CLIQUE - 1} and fewer than the "
                                    f"rack's nodes, e.g. 2 of 18; written on the Nodes as {SPARES_LABEL} (needs "
                                    f"label_nodes)")
    observe: bool = Field(True, description="read the rack's Nodes at preview and up: discovered cliques, "
                                            "mismatches, free GPUs and nodes")
    gpu_resource: str = Field(GPU_RESOURCE, description="the resource name free GPUs are counted in")

    @field_validator("nodes")
    @classmethod
    def _unique(cls, nodes: list[str]) -> list[str]:
        if len(set(nodes)) != len(nodes):
            raise ValueError("node names must be unique")
        return nodes

    @field_validator("taints")
    @classmethod
    def _one_per_key_effect(cls, taints: list[Taint]) -> list[Taint]:
        seen = [(t.key, t.effect) for t in taints]
        if len(set(seen)) != len(seen):
            raise ValueError("two taints with the same key and effect")
        return taints

    @model_validator(mode="after")
    def _spares_fit(self) -> Nvl72RackArgs:
        # (each message names `spares` first: that is the field the error is reported under)
        if self.spares >= len(self.nodes):
            raise ValueError(f"spares {self.spares} would keep every one of the rack's {len(self.nodes)} node(s) "
                             "free, and no new ComputeDomain could be placed on the rack: declare fewer spares than "
                             f"nodes (at most {len(self.nodes) - 1} here), or 0")
        if self.spares and not self.label_nodes:
            raise ValueError(f"spares {self.spares} is written on the rack's Nodes ({SPARES_LABEL}), the one place "
                             "the controller reads it, and label_nodes=False writes nothing there: set label_nodes="
                             "True (the default), or leave spares at 0")
        return self


class Nvl72Rack(pulumi.ComponentResource):
    """One NVL72 rack: up to 18 nodes x 4 GPUs on one NVLink fabric."""

    nodes: pulumi.Output[list[str]]
    gpus: pulumi.Output[int]
    expected_clique: pulumi.Output[str | None]
    discovered_cliques: pulumi.Output[dict[str, str | None] | None]
    clique_mismatches: pulumi.Output[list[str] | None]
    free_gpus: pulumi.Output[int | None]
    spares: pulumi.Output[int]
    free_nodes: pulumi.Output[int | None]

    def __init__(self, resource_name: str, *, nodes: list[str], name: str | None = None,
                 expected_clique: str | None = None, label_nodes: bool = True,
                 taints: list[dict[str, str]] | None = None, spares: int = 0, observe: bool = True,
                 gpu_resource: str = GPU_RESOURCE, opts: pulumi.ResourceOptions | None = None,
                 **unknown: Any) -> None:
        self.args = validate(Nvl72RackArgs, "Nvl72Rack", resource_name, {
            "name": name if name is not None else resource_name, "nodes": nodes,
            "expected_clique": expected_clique, "label_nodes": label_nodes, "taints": taints or [],
            "spares": spares, "observe": observe, "gpu_resource": gpu_resource}, unknown)
        super().__init__("nvlfabric:index:Nvl72Rack", resource_name, None, opts)
        a = self.args
        view = self._observe() if a.observe else None
        # A patch of a Node that does not exist would create one (server-side apply): a typo in
        # `nodes` must not add a Node the scheduler then counts. So an observed rack patches only
        # the Nodes it found (the others are named in the warning and in clique_mismatches);
        # unobserved, every declared node is patched, as the user asked.
        missing = {n.name for n in view.nodes if not n.exists} if view else set()
        refused, warned = racks.rack_conflicts(view.nodes, a.name) if view and a.label_nodes else ([], [])
        if refused:
            raise ComponentArgsError(f"Nvl72Rack {resource_name!r}: invalid arguments\n"
                                     + "\n".join(f"  nodes: {r}" for r in refused))
        for w in warned:
            pulumi.log.warn(f"rack {a.name}: {w}", resource=self)
        self.labelled_nodes: list[str] = []
        """The Nodes the rack labels (those found, when observed)."""
        if a.label_nodes:
            for n in a.nodes:  # a node labelled by two racks: two owners of its nvlfabric.io/rack label
                program.take("Node", "", n, component="Nvl72Rack", resource_name=resource_name)
            program.rack_taints([t.model_dump() for t in a.taints], resource_name)
            node_labels = {RACK_LABEL: a.name}
            if a.expected_clique:
                node_labels[EXPECTED_CLIQUE_LABEL] = a.expected_clique
            if a.spares:  # none for 0: a rack without spares applies what it did before
                node_labels[SPARES_LABEL] = str(a.spares)
            # One resource for the rack's nodes, not a NodePatch per node: see provider/racknodes.py.
            labelled = RackNodesArgs(rack=a.name, manager=racknodes.field_manager(resource_name),
                                     nodes=[n for n in a.nodes if n not in missing], labels=node_labels,
                                     taints=[t.model_dump() for t in a.taints])
            self.labelled_nodes = labelled.nodes
            (served.RackNodes if served.serving() else racknodes.RackNodes)(
                f"{resource_name}-nodes", labelled, opts=pulumi.ResourceOptions(parent=self))
        self.nodes = pulumi.Output.from_input(list(a.nodes))
        self.gpus = pulumi.Output.from_input(len(a.nodes) * GPUS_PER_NODE)
        self.expected_clique = pulumi.Output.from_input(a.expected_clique)
        self.discovered_cliques = pulumi.Output.from_input(view.cliques if view else None)
        self.clique_mismatches = pulumi.Output.from_input(list(view.mismatches) if view else None)
        self.free_gpus = pulumi.Output.from_input(view.free_gpus if view else None)
        self.spares = pulumi.Output.from_input(a.spares)
        self.free_nodes = pulumi.Output.from_input(view.free_nodes if view else None)
        capacity.declare(capacity.DeclaredRack(a.name, len(a.nodes) * GPUS_PER_NODE, view.free_gpus if view else None,
                                               view.held_gpus if view else {}, spare_gpus=a.spares * GPUS_PER_NODE))
        self.register_outputs({"nodes": self.nodes, "gpus": self.gpus, "expected_clique": self.expected_clique,
                               "discovered_cliques": self.discovered_cliques,
                               "clique_mismatches": self.clique_mismatches, "free_gpus": self.free_gpus,
                               "spares": self.spares, "free_nodes": self.free_nodes})

    def _observe(self) -> racks.RackView | None:
        """Read the rack's Nodes now; a cluster that cannot be read is a warning, not a failure."""
        a = self.args
        try:
            client = kube.client(kube.kubeconfig_source(pulumi.Config("kubernetes").get("kubeconfig")))
            known = program.rack_nodes(lambda: racks.racked_nodes(client))
            view = racks.summarize(racks.observe(client, a.nodes, gpu_resource=a.gpu_resource, known=known),
                                   a.expected_clique)
        except Exception as exc:  # any failure to read costs only these outputs
            pulumi.log.warn(f"rack {a.name}: could not read its Nodes ({type(exc).__name__}: {exc}); discovered "
                            "cliques and free GPUs are unknown", resource=self)
            return None
        if view.mismatches:
            pulumi.log.warn(f"rack {a.name}: the nodes do not form the declared NVLink clique: "
                            + "; ".join(view.mismatches), resource=self)
        return view
