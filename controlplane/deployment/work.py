"""What a shard's own bookkeeping costs, counted as it happens (``WorkTotals``).

One mutable object per shard, handed to the owners that do the work (as ``HealthTotals``
is for push health) and exported in the shard's status (``work``). Each counter is the
number of times a step that should stay rare, or O(1) per replica, ran: a steady shard
whose counter grows with every tick is doing O(replicas) work it should not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class WorkTotals:
    ticks: int = 0  # reconcile ticks of the shard
    slices: int = 0  # slices run after ticks (a big plan carried out a piece at a time)
    last_tick_s: float = 0.0  # the newest tick's wall time
    replica_inits_built: int = 0  # what replicas of a spec are told: once per spec version
    rank_probes: int = 0  # ranks looked at to give a replica the lowest free one
    rank_passes: int = 0  # rank-consistency passes run (only when membership moved)
    rank_heaps_ordered: int = 0  # rank-index heaps put in order whole (heapify)
    rank_entries_sifted: int = 0  # rank-index entries sifted in one by one
    running_sets_built: int = 0  # serving-id sets built (only when that membership moved)

    def as_json(self) -> dict:
        return asdict(self)
