"""Where the affinity policies place a request (pure: the router reserves the slot).

``affine_replica``: a request's affinity (``policies.Affinity``) to a replica id, or None:

- its start's replica on the hash ring, or the next on its walk, within the bounded load
  (``prefix_affinity.choose``), never under ``AFFINITY_FLOOR`` requests (near idle the
  bound alone is 1, and a second request, or one stale count of another router's, would
  split a conversation for no gain in balance): the same from every router;
- unless this router sent more of the prompt than its start to another replica with room
  within the bound (``prefix_index``): the conversation's history is there, where the
  bound once spilled it.

A prompt whose first block this router has never sent anywhere is *cold* (``is_cold``):
likely no engine holds it (a random prompt), and the ring alone would place it blind to
load (measured: TTFT p99 20% over p2c's on prompts that share nothing). A cold prompt that
starts a conversation (a completion, or a chat with nothing after its start) goes where
power of two choices would send it, unless its ring replica is as lightly loaded as that
pick (``home_or``): near idle, or at a tie, the ring replica, so a conversation's first turn
lands where every router sends its later ones; under load, never to a busier replica than
p2c's: it takes p2c's pick or a replica no busier (as the routers see them). A cold later
turn (a chat with messages after its start: another router sent
its earlier turns) goes to its start's replica on the ring within the bound, as every
router sends it.

Before, a cold prompt went to the less loaded of its ring replica and one other, ties to
the ring replica: on random prompts through the proxy (``release_tests.llm_routing``,
rounds of every policy on the same arrivals, exploratory, at 21d7c96) its TTFT p99 was
+16%, +9%, +17% against p2c's, where placed by p2c it was -17%, -1%, -13% (what a round
moves by).

``next_in_turn``: round robin, the first replica with room from where the last turn ended.
"""

from __future__ import annotations

from typing import Callable, Sequence

from controlplane.routing.members import ReplicaMembers
from controlplane.routing.policies import Affinity
from controlplane.routing.prefix_affinity import capacity, choose

LoadOf = Callable[[str], "int | None"]
AFFINITY_FLOOR = 2  # requests a replica always takes for its own prefixes (if it has room)


def is_cold(members: ReplicaMembers, affinity: Affinity) -> bool:
    """A conversation's start whose first block this router never sent anywhere."""
    return (not affinity.continued and bool(affinity.blocks)
            and members.index.match(affinity.blocks[:1])[0] is None)


def home_or(members: ReplicaMembers, start: str, by_load: str | None,
            score_of: LoadOf) -> str | None:
    """A cold prompt's replica: its start's first replica with room on the ring when that is
    as lightly loaded (``score_of``: the policy's load) as ``by_load``, power of two
    choices' pick (None: it found no room), else the pick."""
    home = next((r for r in members.ring().walk(start) if score_of(r) is not None), None)
    if home is None:
        return by_load
    if by_load is None or score_of(home) <= score_of(by_load):
        return home
    return by_load


def affine_replica(members: ReplicaMembers, affinity: Affinity, load_of: LoadOf,
                   total_load: int, balance_factor: float, floor: int) -> str | None:
    """A warm prompt's (or a later turn's, or a session's) replica, within the bound;
    ``floor``: the bound never goes under it (``prefix_affinity.capacity``). None: none
    within the bound (by load)."""
    replica_id = choose(members.ring(), affinity.start, load_of, total_load, balance_factor,
                        floor)
    holder, matched = members.index.match(affinity.blocks)
    if holder is not None and holder != replica_id and matched > affinity.start_blocks:
        load = load_of(holder)
        bound = capacity(total_load, len(members), balance_factor, floor)
        if load is not None and load + 1 <= bound:
            return holder
    return replica_id


def next_in_turn(members: ReplicaMembers, ids: Sequence[str], load_of: LoadOf) -> str | None:
    for step in range(len(ids)):
        i = (members.turn + step) % len(ids)
        if load_of(ids[i]) is not None:
            members.turn = i + 1
            return ids[i]
    return None
