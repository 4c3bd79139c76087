"""Replica ranks 0..N-1 per deployment, and the membership-gated pass that keeps them so.

Owns: which replica holds which rank (``RankManager``), when the consistency pass is
worth running (``RankConsistencyGate``), and the pass itself (``run_consistency_pass``).

Invariants:
- A rank is held by at most one replica and a replica holds at most one rank.
- After ``compact(ids)`` the ranks of exactly ``ids`` are a permutation of 0..len-1,
  reached with the fewest moves: a replica already holding a unique rank below N keeps it.
- Ranks can only go inconsistent when membership changes, so the pass runs only when the
  replica set's fingerprint differs from the last one it validated (seed: ray-project/ray
  #64913, where the ungated O(N) pass starved report ingest for 20 s at 16K replicas).
- An errored pass is never cached as validated (a latched, unvalidated membership would
  never be repaired), but the same membership is not retried until
  ``retry_after_error_s`` has passed, so a deterministic failure cannot run an O(N) pass
  and log an error on every tick. A different fingerprint bypasses that backoff at once.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import ReplicaSet
from controlplane.deployment.work import WorkTotals

logger = logging.getLogger(__name__)

NO_RANK = -1  # old_rank of a move that gives a rank to a replica that had none


class RankMove(NamedTuple):
    replica_id: str
    old_rank: int  # NO_RANK when the replica had none
    new_rank: int


class RankError(Exception):
    """The requested rank layout cannot exist (e.g. the same replica listed twice)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # all fields to super() so it pickles across actors
        self.message = message


class RankManager:
    """Which replica of one deployment holds which rank."""

    def __init__(self, work: WorkTotals | None = None) -> None:
        self._rank_by_id: dict[str, int] = {}
        self._id_by_rank: dict[int, str] = {}
        # The lowest free rank in O(log N) amortized, not a scan from 0 per start (that
        # made a scale-up O(N^2)): every free rank below ``_next`` is in the heap
        # ``_free`` (which may also hold ranks taken since: skipped when popped); ranks
        # from ``_next`` up are free unless ``adopt`` took one (skipped too).
        self._free: list[int] = []
        self._next = 0
        self._work = work if work is not None else WorkTotals()  # rank_probes

    def assign(self, replica_id: str) -> int:
        """Give ``replica_id`` the lowest free rank; a replica that has one keeps it."""
        held = self._rank_by_id.get(replica_id)
        if held is not None:
            return held
        rank = self._lowest_free()
        self._hold(replica_id, rank)
        return rank

    def _lowest_free(self) -> int:
        work = self._work
        while self._free:
            work.rank_probes += 1
            rank = heapq.heappop(self._free)
            if rank not in self._id_by_rank:
                return rank
        while True:
            work.rank_probes += 1
            rank, self._next = self._next, self._next + 1
            if rank not in self._id_by_rank:
                return rank

    def adopt(self, replica_id: str, rank: int) -> int:
        """A re-adopted replica keeps the rank it reports when that rank is free; else it
        gets the lowest free one (the consistency pass compacts what remains)."""
        if rank >= 0 and rank not in self._id_by_rank and replica_id not in self._rank_by_id:
            self._hold(replica_id, rank)
            return rank
        return self.assign(replica_id)

    def release(self, replica_id: str) -> None:
        rank = self._rank_by_id.pop(replica_id, None)
        if rank is not None:
            del self._id_by_rank[rank]
            if rank < self._next:
                heapq.heappush(self._free, rank)

    def rank_of(self, replica_id: str) -> int | None:
        return self._rank_by_id.get(replica_id)

    def ranks(self) -> dict[str, int]:
        return dict(self._rank_by_id)

    def compact(self, active_ids: Iterable[str]) -> list[RankMove]:
        """Make the ranks of exactly ``active_ids`` a permutation of 0..N-1; return moves.

        Ids outside ``active_ids`` are released (not reported as moves). Holders of a
        rank >= N move into the holes below N, highest rank into the lowest hole, then
        unranked ids (in id order, so the result is deterministic) take the rest.
        """
        active = _unique(active_ids)
        for replica_id in [r for r in self._rank_by_id if r not in active]:
            self.release(replica_id)
        n = len(active)
        holes = iter(r for r in range(n) if r not in self._id_by_rank)
        moves = [self._move(rid, next(holes)) for rid in self._holders_at_or_above(n)]
        unranked = sorted(r for r in active if r not in self._rank_by_id)
        moves += [self._move(rid, next(holes)) for rid in unranked]
        return moves

    def _holders_at_or_above(self, n: int) -> list[str]:
        out_of_range = sorted((r for r in self._id_by_rank if r >= n), reverse=True)
        return [self._id_by_rank[r] for r in out_of_range]

    def _move(self, replica_id: str, new_rank: int) -> RankMove:
        old_rank = self._rank_by_id.get(replica_id, NO_RANK)
        self.release(replica_id)
        self._hold(replica_id, new_rank)
        return RankMove(replica_id, old_rank, new_rank)

    def _hold(self, replica_id: str, rank: int) -> None:
        self._rank_by_id[replica_id] = rank
        self._id_by_rank[rank] = replica_id


def _unique(ids: Iterable[str]) -> set[str]:
    # Validate before compact() mutates anything, so a rejected call leaves ranks intact.
    listed = list(ids)
    unique = set(listed)
    if len(unique) != len(listed):
        dupes = sorted(r for r, seen in Counter(listed).items() if seen > 1)
        raise RankError(f"replica ids listed more than once: {dupes}")
    return unique


class RankConsistencyGate:
    """Decides in O(1) whether the rank-consistency pass must run for a membership."""

    def __init__(self, retry_after_error_s: float = 30.0,
                 work: WorkTotals | None = None) -> None:
        self.retry_after_error_s = retry_after_error_s
        self._checked: int | None = None  # fingerprint the last successful pass validated
        self._errored: int | None = None  # fingerprint whose pass last failed
        self._errored_at = 0.0
        self._work = work if work is not None else WorkTotals()  # rank_passes

    def should_run(self, fingerprint: int, now: float) -> bool:
        return fingerprint != self._checked and not self._backing_off(fingerprint, now)

    def _backing_off(self, fingerprint: int, now: float) -> bool:
        return fingerprint == self._errored and now < self._errored_at + self.retry_after_error_s

    def record_success(self, fingerprint: int) -> None:
        self._work.rank_passes += 1
        self._checked = fingerprint
        self._errored = None

    def record_error(self, fingerprint: int, now: float) -> None:
        self._work.rank_passes += 1
        # Forget the last validated membership too: after a failed pass nothing says the
        # ranks are consistent, so returning to an older membership must recheck it.
        self._checked = None
        self._errored = fingerprint
        self._errored_at = now


def run_consistency_pass(
    gate: RankConsistencyGate, manager: RankManager, replica_set: ReplicaSet, now: float
) -> list[RankMove]:
    """Compact the ranks of the serving replicas if membership changed; else O(1) no-op."""
    # Both guards are O(1) and come before any collection is built: this runs every tick.
    if replica_set.count(ReplicaState.STARTING):
        return []  # ranks settle once starts finish; a pass now would be redone next tick
    fingerprint = replica_set.fingerprint
    if not gate.should_run(fingerprint, now):
        return []
    try:
        moves = manager.compact(replica_set.running_ids())
    except RankError as exc:
        logger.error(
            "rank consistency pass failed; same membership retried after %ss: %s",
            gate.retry_after_error_s,
            exc,
        )
        gate.record_error(fingerprint, now)
        return []
    gate.record_success(fingerprint)
    return moves
