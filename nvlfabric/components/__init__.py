"""nvlfabric's Pulumi components: the driver install, NVL72 racks, ComputeDomains, bound workloads."""

from nvlfabric.components import shutdown
from nvlfabric.components.args import ComponentArgsError
from nvlfabric.components.computedomain import ComputeDomain, ComputeDomainArgs
from nvlfabric.components.driver import NvlfabricDriver, NvlfabricDriverArgs
from nvlfabric.components.rack import Nvl72Rack, Nvl72RackArgs
from nvlfabric.components.workload import BoundJob, BoundJobArgs, cluster_serves

shutdown.install()

__all__ = [
    "BoundJob", "BoundJobArgs", "ComponentArgsError", "ComputeDomain", "ComputeDomainArgs",
    "Nvl72Rack", "Nvl72RackArgs", "NvlfabricDriver", "NvlfabricDriverArgs", "cluster_serves",
]
