"""Capacity at preview: does a job fit the racks the program declares? (pure, plus the program's registry)

Each `Nvl72Rack` records itself here when the program runs (preview included), with the free GPUs
its Nodes reported (`free_gpus`, read at preview). A `BoundJob` declared after its racks compares
what it needs with that: more clique groups than racks, or more GPUs in a group than any rack has
free, or more GPUs than all of them together, is a warning in the preview naming the job, what it
needs and what there is: at `up` its pods would wait gated (an Event NoCliqueRoom says so then).
It is a warning, not an error: other programs' racks, or racks freed by then, may have the room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nvlfabric.components import program


@dataclass(frozen=True)
class DeclaredRack:
    name: str
    gpus: int
    free_gpus: int | None  # None: not observed (observe=False, or the cluster was not readable)
    held: Mapping[str, int] = field(default_factory=dict)
    """'namespace/workload' → GPUs its pods hold here now (counted as used in free_gpus)."""
    spare_gpus: int = 0
    """The GPUs of its spare nodes (`spares`): kept free for replacements, not for new jobs."""


def declare(rack: DeclaredRack) -> None:
    program.current().racks.append(rack)


def declared() -> list[DeclaredRack]:
    return list(program.current().racks)


def shortfall(job: str, *, groups: int, pods_per_group: int, gpus_per_pod: int,
              racks: list[DeclaredRack], namespace: str = "default") -> str | None:
    """Why the job cannot be placed on `racks`, or None (no racks declared: nothing to judge).
    The GPUs the job's own pods hold already count as free for it: a running job judged again at
    a later preview (nothing changed) warned that it did not fit beside itself."""
    own, declared_racks = f"{namespace}/{job}", racks
    # A rack's spares are not room for a new job (placement keeps them idle, controller/placement.py).
    racks = [DeclaredRack(r.name, max(0, r.gpus - r.spare_gpus),
                          max(0, r.free_gpus + r.held.get(own, 0) - r.spare_gpus) if r.free_gpus is not None else None)
             for r in racks]
    if not racks or gpus_per_pod <= 0:
        return None
    per_group = pods_per_group * gpus_per_pod
    want = f"{groups} clique group(s) of {pods_per_group} pods x {gpus_per_pod} GPUs"
    if groups > len(racks):
        return (f"BoundJob {job!r} needs {want}, a rack each, but the program declares {len(racks)} "
                f"Nvl72Rack(s) ({', '.join(r.name for r in racks)}); its pods will wait gated until there is room")
    spared = any(r.spare_gpus for r in declared_racks)
    free = sorted((r.free_gpus if r.free_gpus is not None else r.gpus) for r in racks)[::-1]
    fitting = sum(1 for f in free if f >= per_group)
    if fitting < groups:
        return (f"BoundJob {job!r} needs {want}: {per_group} free GPUs in each of {groups} rack(s); "
                f"{fitting} of the declared racks have that many free (free GPUs: "
                f"{', '.join(f'{r.name} {r.free_gpus if r.free_gpus is not None else r.gpus}' for r in racks)}"
                f"{', spares not counted' if spared else ''}); "
                "its pods will wait gated until there is room")
    return None
