"""What one program declares, for the checks at preview that span components.

A registry per program run holds exactly what that run declared so far:
- the Kubernetes objects taken by name: two components with the same ComputeDomain or workload
  name in one namespace would manage one object from two resources (at `up`: a field conflict, or
  "this stack did not create it"); the second is refused, naming the first;
- the domains' channel claims (`<name>-channel`, or `spec.channelClaim.name`; `<claim>-<group>`
  for each clique group of a MultiClique domain): two domains of other names can still name one
  claim in one namespace, and `up` failed on it (their pods would share one IMEX channel); the
  second is refused, naming the first and the field to change;
- the IMEX modes each NvlfabricDriver allows and each ComputeDomain needs: a domain whose mode no
  declared driver allows would hold its channel while every prepare fails.
- the taints of the declared racks: workloads declared after a rack tolerate its taints; a rack
  whose taint a workload declared before it does not tolerate is refused, naming both;
- the declared racks' capacity (capacity.py), and the cluster's racked Nodes as the first rack
  read them (each rack reads only what that one list lacks);
- what the cluster answered about the APIs it serves (clusterprobes.py), asked once per run.
Checked both ways (a domain declared before the driver is judged when the driver comes).

Which run: a program run by the CLI is a process of its own, but the Automation API runs an inline
program again and again in one process (each `up`, `preview`, `refresh`), where a process-wide
registry refused the second run's components as "already declared" by the first. So a run is
its root Stack resource (a new one each run; Pulumi keeps it in a context variable), and the
registry lives as long as that Stack does. Where there is none (the component provider, one
process per engine operation whose Construct calls each reset the root; unit tests with mocks),
the process is the run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulumi

from nvlfabric.components.args import ComponentArgsError

if TYPE_CHECKING:
    from nvlfabric.clusterview.scheduling import WorkloadApis
    from nvlfabric.components.capacity import DeclaredRack


@dataclass
class Declared:
    names: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    """(kind, namespace, name) → (component, resource)"""
    claims: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    """(kind, namespace, claim) → (ComputeDomain resource, its domain's name)"""
    driver_modes: dict[str, set[str]] = field(default_factory=dict)  # driver resource → its imex_modes
    domain_modes: dict[str, tuple[str, str]] = field(default_factory=dict)  # domain resource → (name, imexMode)
    taints: list[dict[str, str]] = field(default_factory=list)  # what the declared racks taint their Nodes with
    workloads: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # BoundJob → its pods' tolerations
    nvidia_domains: list[str] = field(default_factory=list)  # domains on NVIDIA's backend (said once)
    racks: list[DeclaredRack] = field(default_factory=list)  # capacity.py's
    rack_nodes: dict[str, Any] | None = None
    """The cluster's racked Nodes (labelled nvlfabric.io/rack) by name, listed once per run by the
    first rack that reads its Nodes (rack.py): 64 racks read 1,152 Nodes with one request."""
    served: dict[tuple[str, str, str, str], bool | None] = field(default_factory=dict)
    """(kubeconfig source, namespace, apiVersion, kind) → whether the cluster serves it (None: unreadable)."""
    scheduling: dict[tuple[str, str], WorkloadApis | None] = field(default_factory=dict)
    """(kubeconfig source, namespace) → the cluster's workload scheduling APIs (None: it has none)."""


_RUNS: weakref.WeakKeyDictionary[pulumi.Resource, Declared] = weakref.WeakKeyDictionary()
_PROCESS = Declared()


def current() -> Declared:
    """The registry of the program run this is called from."""
    root = pulumi.runtime.settings.get_root_resource()
    if root is None:
        return _PROCESS
    return _RUNS.setdefault(root, Declared())


def take(kind: str, namespace: str, name: str, *, component: str, resource_name: str) -> None:
    """Record that `resource_name` manages the `kind` object `namespace/name`; refuse a second."""
    key, names = (kind, namespace, name), current().names
    if key in names:
        first_component, first = names[key]
        raise ComponentArgsError(
            f"{component} {resource_name!r}: invalid arguments\n  name: {kind} {namespace}/{name} is already "
            f"declared by {first_component} {first!r} in this program; two resources cannot manage one object: "
            "give one of them another name (or namespace)")
    names[key] = (component, resource_name)


def channel_claims(kind: str, namespace: str, claims: list[str], *, resource_name: str, domain: str,
                   claim: str | None) -> None:
    """Record the channel claims (`kind`: ResourceClaim, on NVIDIA's backend ResourceClaimTemplate)
    of ComputeDomain `resource_name` (domain `domain`, in `namespace`); refuse one that another
    domain of this program already has. `claim`: the domain's spec.channelClaim.name, None when it
    takes the default `<name>-channel` (then `name` is the field the message names)."""
    taken = current().claims
    for group, name in enumerate(claims):
        if (kind, namespace, name) not in taken:
            continue
        first, first_domain = taken[(kind, namespace, name)]
        loc: tuple[str, ...] = ("name",) if claim is None else ("spec", "channelClaim", "name")
        how = f", the channel claim of its clique group {group}" if len(claims) > 1 else \
            ", its default channel claim <name>-channel" if claim is None else ""
        text = (f"{claim if claim is not None else domain!r} makes {kind} {namespace}/{name}{how}, which "
                f"ComputeDomain {first!r} (domain {namespace}/{first_domain}) already has as its channel claim in this "
                "program; two domains cannot share one claim (their pods would share one IMEX channel, and `pulumi "
                "up` would fail on the claim): give one of them a spec.channelClaim.name of its own")
        raise ComponentArgsError(f"ComputeDomain {resource_name!r}: invalid arguments\n  {'.'.join(loc)}: {text}",
                                 [(loc, text)])
    taken.update({(kind, namespace, name): (resource_name, domain) for name in claims})


def driver_modes(resource_name: str, modes: set[str]) -> None:
    declared = current()
    declared.driver_modes[resource_name] = modes
    for domain, (name, mode) in declared.domain_modes.items():
        _check(domain, name, mode)


def domain_mode(resource_name: str, name: str, mode: str) -> None:
    current().domain_modes[resource_name] = (name, mode)
    _check(resource_name, name, mode)


def _check(resource_name: str, name: str, mode: str) -> None:
    driver_modes = current().driver_modes
    if driver_modes and not any(mode in modes for modes in driver_modes.values()):
        allowed = sorted({m for modes in driver_modes.values() for m in modes})
        drivers = ", ".join(repr(d) for d in driver_modes)
        raise ComponentArgsError(
            f"ComputeDomain {resource_name!r}: invalid arguments\n  spec.imexMode: {mode} (domain {name}) is not "
            f"allowed by the program's NvlfabricDriver {drivers} (imex_modes: {', '.join(allowed)}); every prepare "
            f"of its channel would fail: use imexMode {allowed[0]}, or add {mode} to the driver's imex_modes")


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """Whether one of `tolerations` tolerates `taint` (Kubernetes' matching: Exists matches any
    value, an empty key with Exists every taint, an empty effect every effect)."""
    for h in tolerations:
        if h.get("operator") == "Exists":
            key = h.get("key") in (None, "", taint["key"])
        else:
            key = h.get("key") == taint["key"] and h.get("value", "") == taint.get("value", "")
        if key and h.get("effect") in (None, "", taint["effect"]):
            return True
    return False


def rack_taints(taints: list[dict[str, str]], resource_name: str = "") -> None:
    """Record a rack's taints: the workloads declared after it tolerate them, or their pods could
    never be placed on the rack they were declared for. A workload declared before it, whose
    pods do not tolerate one of them, is an error: it was created without the toleration."""
    declared = current()
    for workload, tolerations in declared.workloads.items():
        missing = [t for t in taints if not tolerates(tolerations, t)]
        if missing:
            t = missing[0]
            taint = f"{t['key']}={t.get('value', '')}:{t['effect']}"
            raise ComponentArgsError(
                f"Nvl72Rack {resource_name!r}: invalid arguments\n  taints: {taint} is not tolerated by BoundJob "
                f"{workload!r}, declared before this rack, so its pods could never run on it: declare the rack "
                "before the workloads that run on it (they then tolerate its taints), or add the toleration to "
                f"{workload!r}'s pod_template")
    declared.taints.extend(t for t in taints if t not in declared.taints)


def workload_tolerations(resource_name: str, tolerations: list[dict[str, str]]) -> None:
    """Record a BoundJob's pod tolerations, for the racks declared after it."""
    current().workloads[resource_name] = tolerations


def nvidia_domain(name: str) -> list[str]:
    """Record a ComputeDomain on NVIDIA's backend; the program's such domains so far."""
    domains = current().nvidia_domains
    domains.append(name)
    return list(domains)


def rack_nodes(read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The run's snapshot of racked Nodes, read with `read` the first time."""
    declared = current()
    if declared.rack_nodes is None:
        declared.rack_nodes = read()
    return declared.rack_nodes


def declared_taints() -> list[dict[str, str]]:
    return list(current().taints)


def reset() -> None:
    """Forget everything (a test's fresh program)."""
    global _PROCESS
    _PROCESS = Declared()
    _RUNS.clear()
