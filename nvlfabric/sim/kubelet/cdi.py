"""Resolving CDI device IDs the way a CDI-enabled container runtime does.

Rules (CDI 1.x): only `*.json` / `*.yaml` files directly in each spec directory are read; later
directories have higher priority; a file that fails to parse is skipped as a whole; a device name
defined twice at the same priority is a conflict and both definitions are dropped. An ID that
does not resolve fails the container's start ("unresolvable CDI devices"), as in containerd.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from nvlfabric.api.kubelet.cdi import QUALIFIED_RE, ContainerEdits, Spec


class UnresolvableDevices(Exception):
    """Some requested CDI device IDs are not defined by any valid spec."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__(f"unresolvable CDI devices {', '.join(ids)}")
        self.ids = list(ids)


@dataclass
class Registry:
    devices: dict[str, ContainerEdits] = field(default_factory=dict)
    # spec-level edits are applied once per spec, when any of its devices is requested
    spec_edits: dict[str, ContainerEdits] = field(default_factory=dict)
    device_spec: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def load_spec(path: Path) -> Spec:
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return Spec.model_validate(data)


def load(dirs: Sequence[Path]) -> Registry:
    reg = Registry()
    for priority, directory in enumerate(dirs):
        seen_here: dict[str, str] = {}
        conflicts: set[str] = set()
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".json", ".yaml") or not path.is_file():
                continue
            try:
                spec = load_spec(path)
            except (OSError, ValueError, ValidationError, yaml.YAMLError) as exc:
                reg.errors.append(f"{path}: {str(exc).splitlines()[0]}")
                continue
            for device in spec.devices:
                qid = spec.qualified(device.name)
                if qid in seen_here:
                    conflicts.add(qid)
                    continue
                seen_here[qid] = str(path)
                reg.devices[qid] = device.container_edits
                reg.device_spec[qid] = str(path)
            reg.spec_edits[str(path)] = spec.container_edits
        for qid in conflicts:
            reg.errors.append(f"{qid}: defined twice at priority {priority} ({directory}); both dropped")
            reg.devices.pop(qid, None)
            reg.device_spec.pop(qid, None)
    return reg


def resolve(dirs: Sequence[Path], ids: Sequence[str]) -> ContainerEdits:
    """The merged container edits for these fully qualified device IDs, or UnresolvableDevices."""
    reg = load(dirs)
    missing = [i for i in ids if not QUALIFIED_RE.match(i) or i not in reg.devices]
    if missing:
        raise UnresolvableDevices(missing)
    edits = ContainerEdits()
    applied_specs: set[str] = set()
    for qid in ids:
        spec_path = reg.device_spec[qid]
        if spec_path not in applied_specs:
            applied_specs.add(spec_path)
            edits = edits.merged(reg.spec_edits[spec_path])
        edits = edits.merged(reg.devices[qid])
    return edits
