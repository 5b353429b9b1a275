"""nvlfabric's Pulumi components: the driver install, NVL72 racks, ComputeDomains, bound workloads."""

from components._args import ComponentArgsError
from components.computedomain import MAX_PODS_PER_DOMAIN, ComputeDomain, ComputeDomainArgs
from components.driver import NvlfabricDriver, NvlfabricDriverArgs
from components.rack import Nvl72Rack, Nvl72RackArgs
from components.workload import BoundJob, BoundJobArgs

__all__ = [
    "MAX_PODS_PER_DOMAIN", "BoundJob", "BoundJobArgs", "ComponentArgsError", "ComputeDomain", "ComputeDomainArgs",
    "Nvl72Rack", "Nvl72RackArgs", "NvlfabricDriver", "NvlfabricDriverArgs",
]
