"""Power of two choices: the pure placement decision of a router.

Sample two replicas at random and send to the less loaded one (Mitzenmacher, "The Power
of Two Choices in Randomized Load Balancing", 2001; Ray Serve's default request router).
Two random samples instead of a scan keep placement O(1) at any fleet size and avoid
the herd that "always pick the global minimum" causes when many routers share stale data.

Additions, each for a reason:

- ``hint``: the replica where one of this router's requests just ended. It is always one
  of the first pair, so the slot that just freed is taken at once (the waiter is not left
  to luck while the replica idles).
- Up to ``max_pairs`` pairs per decision: when the first pair is full but others have
  room, a few more O(1) samples find it now instead of after a backoff. A fleet of at most
  ``2 * max_pairs`` replicas is thereby scanned completely.
- ``load_of(replica_id)`` returns None for a replica that must not get the request
  (stopping, unreachable, or known load at max_ongoing_requests): the router never sends
  to a full replica, whatever the sample.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

DEFAULT_MAX_PAIRS = 3


@dataclass(frozen=True)
class Placement:
    replica_id: str | None  # None: no sampled replica has room
    candidates: tuple[str, ...]  # every replica looked at, in order (to refresh their cache)


def sample_candidates(replica_ids: Sequence[str], hint: str | None, rng: random.Random,
                      max_pairs: int = DEFAULT_MAX_PAIRS) -> tuple[str, ...]:
    """Up to ``2 * max_pairs`` distinct replicas in random order, ``hint`` first if given."""
    want = min(len(replica_ids), 2 * max_pairs)
    if want == 0:
        return ()
    sample = rng.sample(replica_ids, want)
    if hint is None:
        return tuple(sample)
    rest = [r for r in sample if r != hint][: want - 1]
    return (hint, *rest)


def choose_replica(replica_ids: Sequence[str], load_of: Callable[[str], int | None],
                   rng: random.Random, hint: str | None = None,
                   max_pairs: int = DEFAULT_MAX_PAIRS) -> Placement:
    """The less loaded of the first pair with room; later pairs only if a pair has none.

    Ties go to the first of the pair (random order, or the hint).
    """
    candidates = sample_candidates(replica_ids, hint, rng, max_pairs)
    for start in range(0, len(candidates), 2):
        best: str | None = None
        best_load = 0
        for replica_id in candidates[start:start + 2]:
            load = load_of(replica_id)
            if load is not None and (best is None or load < best_load):
                best, best_load = replica_id, load
        if best is not None:
            return Placement(best, candidates[: start + 2])
    return Placement(None, candidates)
