"""BoundJob's checks of a user's pod template (pure): what it must have, the JSON types of the parts
BoundJob extends, and the fields BoundJob sets itself, each refused with the path that is wrong.
"""

from __future__ import annotations

from typing import Any, Final

from nvlfabric.api.names import MASTER_ADDR_ENV

CLAIM_REF: Final = "channel"
"""The name of the pod-level claim reference BoundJob adds, and of each container's claim entry."""


def check_pod_template(tpl: dict[str, Any]) -> None:
    """Raise a ValueError naming the first thing wrong with `tpl` (all its mistyped parts at once)."""
    spec = tpl.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise ValueError("needs spec.containers: a non-empty list of containers")
    for i, c in enumerate(spec["containers"]):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            raise ValueError(f"spec.containers[{i}] needs a name and an image")
    problems = template_shape_problems(tpl)
    if problems:
        raise ValueError("; ".join(problems))
    if spec.get("nodeName"):
        raise ValueError("spec.nodeName is set: a pod with scheduling gates (and one whose clique nvlfabric or "
                         "Kubernetes chooses) cannot name its node; leave it unset, or use nodeSelector")
    if spec.get("schedulingGroup"):
        raise ValueError("spec.schedulingGroup is set by BoundJob (the job's PodGroup when Kubernetes schedules "
                         "it): leave it unset")
    if any(rc.get("name") == CLAIM_REF for rc in spec.get("resourceClaims") or []):
        raise ValueError(f"spec.resourceClaims already has an entry named {CLAIM_REF!r}, which BoundJob adds")
    # Rank 0's address is a pod DNS name under the workload's headless Service: another
    # hostname or subdomain would leave it resolving to nothing.
    for key in ("hostname", "subdomain"):
        if spec.get(key):
            raise ValueError(f"spec.{key} is set by BoundJob (stable pod names under the workload's headless "
                             f"Service, which {MASTER_ADDR_ENV} names): leave it unset")


#: The parts of a pod template BoundJob reads or extends, with the JSON type each must have.
_TEMPLATE_SHAPE: Final[dict[str, type]] = {"metadata": dict, "metadata.labels": dict, "metadata.annotations": dict,
                                           "spec.resourceClaims": list, "spec.schedulingGates": list,
                                           "spec.initContainers": list, "spec.tolerations": list,
                                           "spec.nodeSelector": dict}
_CONTAINER_SHAPE: Final[dict[str, type]] = {"resources": dict, "resources.limits": dict, "resources.requests": dict,
                                            "resources.claims": list, "env": list}
_TYPE_NAMES: Final[dict[type, str]] = {dict: "a mapping", list: "a list"}


def _shape_problems(obj: dict[str, Any], shape: dict[str, type], where: str) -> list[str]:
    out = []
    for path, want in shape.items():
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, want):  # null is as good as absent
            out.append(f"{where}{path} must be {_TYPE_NAMES[want]} (got {value!r})")
    return out


def template_shape_problems(tpl: dict[str, Any]) -> list[str]:
    """Parts of a pod template of the wrong JSON type, each as one line naming its path (pure):
    BoundJob extends these (labels, claims, gates, limits), so a string where a list belongs is
    refused here rather than failing inside the component."""
    out = _shape_problems(tpl, _TEMPLATE_SHAPE, "")
    spec = tpl.get("spec") or {}
    out += _item_problems(spec, ("resourceClaims", "schedulingGates"), "spec.", named=True)
    out += _item_problems(spec, ("tolerations",), "spec.", named=False)
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        for i, c in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(c, dict):
                where = f"spec.{kind}[{i}]."
                out += _shape_problems(c, _CONTAINER_SHAPE, where)
                out += _item_problems(c, ("env",), where, named=True)
                if isinstance(c.get("resources"), dict):
                    out += _item_problems(c["resources"], ("claims",), f"{where}resources.", named=True)
            else:
                out.append(f"spec.{kind}[{i}] must be a mapping (got {c!r})")
    return out


def _item_problems(obj: dict[str, Any], keys: tuple[str, ...], where: str, *, named: bool) -> list[str]:
    """The items of the lists `obj[key]` that are not mappings (`named`: with a string name)."""
    out = []
    for key in keys:
        items = obj.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict) or (named and not isinstance(item.get("name"), str)):
                out.append(f"{where}{key}[{i}] must be a mapping{' with a name' if named else ''} (got {item!r})")
    return out

