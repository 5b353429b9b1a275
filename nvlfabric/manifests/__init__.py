"""The Kubernetes manifests nvlfabric installs, shipped inside the package.

- `crds/`: the ComputeDomain CRD, generated from `nvlfabric.api` (`python -m nvlfabric.codegen.crdgen`);
- `driver/driver.yaml`: the driver itself (namespace, RBAC, DeviceClass, admission policies, the
  agents' DaemonSet, the controller's Deployment).

Read with `importlib.resources`, so they are found the same way in a checkout and in an installed
wheel (a platform repo's virtualenv).
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

CRD_FILE = "crds/nvlfabric.io_computedomains.yaml"
DRIVER_FILE = "driver/driver.yaml"


def path(name: str) -> Traversable:
    """The manifest `name` (e.g. `DRIVER_FILE`), relative to this package."""
    return resources.files(__name__).joinpath(name)


def read(name: str) -> str:
    return path(name).read_text(encoding="utf-8")
