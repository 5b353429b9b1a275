"""What one program declares, for the checks at preview that span components.

A Pulumi program (a Python program, or the component provider serving one engine operation) runs
in a process of its own, so this registry holds exactly what the program declared so far:
- the Kubernetes objects taken by name: two components with the same ComputeDomain or workload
  name in one namespace would manage one object from two resources (at `up`: a field conflict, or
  "this stack did not create it"); the second is refused, naming the first;
- the IMEX modes each NvlfabricDriver allows and each ComputeDomain needs: a domain whose mode no
  declared driver allows would hold its channel while every prepare fails.
- the taints of the declared racks: workloads declared after a rack tolerate its taints; a rack
  whose taint a workload declared before it does not tolerate is refused, naming both.
Checked both ways (a domain declared before the driver is judged when the driver comes).
"""

from __future__ import annotations

from nvlfabric.components._args import ComponentArgsError

_NAMES: dict[tuple[str, str, str], tuple[str, str]] = {}  # (kind, namespace, name) → (component, resource)
_DRIVER_MODES: dict[str, set[str]] = {}  # driver resource → its imex_modes
_DOMAIN_MODES: dict[str, tuple[str, str]] = {}  # ComputeDomain resource → (its name, imexMode)
_TAINTS: list[dict[str, str]] = []  # what the declared racks taint their Nodes with
_WORKLOADS: dict[str, list[dict[str, str]]] = {}  # BoundJob resource → its pods' tolerations
_NVIDIA_DOMAINS: list[str] = []  # the domains on NVIDIA's backend (what they share is said once)


def take(kind: str, namespace: str, name: str, *, component: str, resource_name: str) -> None:
    """Record that `resource_name` manages the `kind` object `namespace/name`; refuse a second."""
    key = (kind, namespace, name)
    if key in _NAMES:
        first_component, first = _NAMES[key]
        raise ComponentArgsError(
            f"{component} {resource_name!r}: invalid arguments\n  name: {kind} {namespace}/{name} is already "
            f"declared by {first_component} {first!r} in this program; two resources cannot manage one object: "
            "give one of them another name (or namespace)")
    _NAMES[key] = (component, resource_name)


def driver_modes(resource_name: str, modes: set[str]) -> None:
    _DRIVER_MODES[resource_name] = modes
    for domain, (name, mode) in _DOMAIN_MODES.items():
        _check(domain, name, mode)


def domain_mode(resource_name: str, name: str, mode: str) -> None:
    _DOMAIN_MODES[resource_name] = (name, mode)
    _check(resource_name, name, mode)


def _check(resource_name: str, name: str, mode: str) -> None:
    if _DRIVER_MODES and not any(mode in modes for modes in _DRIVER_MODES.values()):
        allowed = sorted({m for modes in _DRIVER_MODES.values() for m in modes})
        drivers = ", ".join(repr(d) for d in _DRIVER_MODES)
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
    for workload, tolerations in _WORKLOADS.items():
        missing = [t for t in taints if not tolerates(tolerations, t)]
        if missing:
            t = missing[0]
            taint = f"{t['key']}={t.get('value', '')}:{t['effect']}"
            raise ComponentArgsError(
                f"Nvl72Rack {resource_name!r}: invalid arguments\n  taints: {taint} is not tolerated by BoundJob "
                f"{workload!r}, declared before this rack, so its pods could never run on it: declare the rack "
                "before the workloads that run on it (they then tolerate its taints), or add the toleration to "
                f"{workload!r}'s pod_template")
    _TAINTS.extend(t for t in taints if t not in _TAINTS)


def workload_tolerations(resource_name: str, tolerations: list[dict[str, str]]) -> None:
    """Record a BoundJob's pod tolerations, for the racks declared after it."""
    _WORKLOADS[resource_name] = tolerations


def nvidia_domain(name: str) -> list[str]:
    """Record a ComputeDomain on NVIDIA's backend; the program's such domains so far."""
    _NVIDIA_DOMAINS.append(name)
    return list(_NVIDIA_DOMAINS)


def declared_taints() -> list[dict[str, str]]:
    return list(_TAINTS)


def reset() -> None:
    """Forget everything (a test's fresh program)."""
    _TAINTS.clear()
    _NVIDIA_DOMAINS.clear()
    _WORKLOADS.clear()
    _NAMES.clear()
    _DRIVER_MODES.clear()
    _DOMAIN_MODES.clear()
