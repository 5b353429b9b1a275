"""nvlfabric: multi-node NVLink (GB200 NVL72) ComputeDomains on Kubernetes, declared with Pulumi.

A platform repo writes `from nvlfabric import NvlfabricDriver, Nvl72Rack, ComputeDomain, BoundJob`.
The rooms are subpackages (docs/architecture.md, "One package, rooms as subpackages"):
`nvlfabric.api` (the contract: models, names, limits, errors), `nvlfabric.manifests`,
`nvlfabric.provider`, `nvlfabric.components`, `nvlfabric.nodeagent`, `nvlfabric.controller` and
`nvlfabric.sim`.

The components are imported on first use, not here: the node agent and the controller import
`nvlfabric.*` too, and their image carries no Pulumi (the `node` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nvlfabric.api.release import __version__ as __version__  # the release (nvlfabric/api/release.py)

if TYPE_CHECKING:
    from nvlfabric.components import (
        BoundJob,
        BoundJobArgs,
        ComponentArgsError,
        ComputeDomain,
        ComputeDomainArgs,
        Nvl72Rack,
        Nvl72RackArgs,
        NvlfabricDriver,
        NvlfabricDriverArgs,
    )

__all__ = [
    "BoundJob", "BoundJobArgs", "ComponentArgsError", "ComputeDomain", "ComputeDomainArgs", "Nvl72Rack",
    "Nvl72RackArgs", "NvlfabricDriver", "NvlfabricDriverArgs",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'nvlfabric' has no attribute {name!r}")
    try:
        components = importlib.import_module("nvlfabric.components")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("pulumi", "pulumi_kubernetes", "lightkube"):
            raise ModuleNotFoundError(
                f"nvlfabric.{name} needs the Pulumi SDK ({exc.name} is not installed); "
                "install nvlfabric with its 'pulumi' extra: pip install 'nvlfabric[pulumi]'", name=exc.name) from exc
        raise
    return getattr(components, name)
