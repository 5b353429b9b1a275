"""nvlfabric: multi-node NVLink (GB200 NVL72) ComputeDomains on Kubernetes, declared with Pulumi.

A platform repo writes `from nvlfabric import NvlfabricDriver, Nvl72Rack, ComputeDomain, BoundJob`.
The rooms are subpackages (docs/architecture.md, "Rooms and the direction of data"), top to bottom:

- `nvlfabric.cli`: the `nvlfabric` and `nvlfabric-sim` command lines;
- `nvlfabric.components` (what a Pulumi program declares), `nvlfabric.review` (preview reports,
  cluster review), `nvlfabric.policy` (the policy pack), `nvlfabric.testbed` (a local control plane
  and the Pulumi CLI for the demo, tests and benchmarks), `nvlfabric.codegen` (the CRD and gRPC stub
  generators);
- `nvlfabric.provider`: the dynamic providers, which talk to the API server;
- `nvlfabric.controller` (the cluster controller), `nvlfabric.nodeagent` (the DRA kubelet plugin
  and the IMEX keeper on every node), `nvlfabric.sim` (simulated hardware and kubelets);
- `nvlfabric.kube` (the API client of the controller and the providers), `nvlfabric.daemon`
  (logging, stopping and metrics of the long-running processes);
- `nvlfabric.api` (the contract: every shared name, limit, model and error) and
  `nvlfabric.manifests` (the CRD and the driver's manifests).

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
        # Any missing library, not only Pulumi's: the components import gRPC (their shutdown hook)
        # before the Pulumi SDK, and the 'pulumi' extra brings every one they need.
        if exc.name and exc.name.split(".")[0] != "nvlfabric":
            raise ModuleNotFoundError(
                f"nvlfabric.{name} needs the Pulumi SDK ({exc.name} is not installed); "
                "install nvlfabric with its 'pulumi' extra: pip install 'nvlfabric[pulumi]'", name=exc.name) from exc
        raise
    return getattr(components, name)
