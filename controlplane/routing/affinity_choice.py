"""Where the affinity policies place a request (pure: the router reserves the slot).

``affine_replica``: a request's affinity (``policies.Affinity``) to a replica id, or None:

- its start's replica on the hash ring, or the next on its walk, within the bounded load
  (``prefix_affinity.choose``), never under ``AFFINITY_FLOOR`` requests (near idle the
  bound alone is 1, and a second request, or one stale count of another router's, would
  split a conversation for no gain in balance): the same from every router;
- unless this router sent more of the prompt than its start to another replica with room
  within the bound (``prefix_index``): the conversation's history is there, where the
  bound once spilled it.

A prompt whose first block this router has never sent anywhere is *cold*: most likely no
engine holds it (a random prompt), and the ring alone would place it at random, blind to
load (measured: TTFT p99 20% over p2c's on prompts that share nothing). A cold prompt goes
to the less loaded of its ring replica and one other at random: power of two choices, one
of the two the replica every router would pick, ties to it.

``next_in_turn``: round robin, the first replica with room from where the last turn ended.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from controlplane.routing.members import ReplicaMembers
from controlplane.routing.policies import Affinity
from controlplane.routing.prefix_affinity import capacity, choose

LoadOf = Callable[[str], "int | None"]
AFFINITY_FLOOR = 2  # requests a replica always takes for its own prefixes (if it has room)


def affine_replica(members: ReplicaMembers, affinity: Affinity, load_of: LoadOf,
                   total_load: int, balance_factor: float, floor: int,
                   rng: random.Random, score_of: LoadOf) -> str | None:
    """``floor``: the bound never goes under it (``prefix_affinity.capacity``);
    ``score_of``: the policy's load, comparing a cold prompt's two candidates."""
    if affinity.blocks and members.index.match(affinity.blocks[:1])[0] is None:
        return _cold(members, affinity.start, load_of, rng, score_of)
    replica_id = choose(members.ring(), affinity.start, load_of, total_load, balance_factor,
                        floor)
    holder, matched = members.index.match(affinity.blocks)
    if holder is not None and holder != replica_id and matched > affinity.start_blocks:
        load = load_of(holder)
        bound = capacity(total_load, len(members), balance_factor, floor)
        if load is not None and load + 1 <= bound:
            return holder
    return replica_id


def _cold(members: ReplicaMembers, start: str, load_of: LoadOf, rng: random.Random,
          score_of: LoadOf) -> str | None:
    home = next((r for r in members.ring().walk(start) if load_of(r) is not None), None)
    other = _other_than(members.ids, home, rng)
    if other is None or score_of(other) is None:
        return home
    if home is None:
        return other
    return home if score_of(home) <= score_of(other) else other


def _other_than(ids: list[str], home: str | None, rng: random.Random) -> str | None:
    """A replica other than ``home``, each alike (as power of two choices draws its two
    apart: drawn from every replica, the second was the home itself 1 time in N, and the
    prompt had no choice)."""
    if not ids or ids == [home]:
        return None
    other = rng.choice(ids)
    while other == home:
        other = rng.choice(ids)
    return other


def next_in_turn(members: ReplicaMembers, ids: Sequence[str], load_of: LoadOf) -> str | None:
    for step in range(len(ids)):
        i = (members.turn + step) % len(ids)
        if load_of(ids[i]) is not None:
            members.turn = i + 1
            return ids[i]
    return None
