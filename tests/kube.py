"""Small helpers shared by tests that talk to the real API server.

They live in the simulator room, `nvlfabric.sim.cluster` (the node agent harness and the benchmarks
use them too, and benchmarks import no test helpers); this module is the tests' name for them.
"""

from __future__ import annotations

from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes

__all__ = ["delete_nodes", "eventually", "install_crd", "make_ready_nodes"]
