"""Where the affinity policies place a request (pure: the router reserves the slot).

``affine_replica``: a request's affinity (``policies.Affinity``) to a replica id, or None:

- its start's replica on the hash ring, or the next on its walk, within the bounded load
  (``prefix_affinity.choose``), never under ``AFFINITY_FLOOR`` requests (near idle the
  bound alone is 1, and a second request, or one stale count of another router's, would
  split a conversation for no gain in balance): the same from every router;
- unless this router sent more of the prompt than its start to another replica with room
  within the bound (``prefix_index``): the conversation's history is there, where the
  bound once spilled it.

A prompt whose first block this router has never sent anywhere is *cold*: likely no
engine holds it (a random prompt), and the ring alone would place it blind to load
(measured: TTFT p99 20% over p2c's on prompts that share nothing). A cold prompt that
starts a conversation (a completion, or a chat with nothing after its start) has no
affinity here (None): the router places it by the policy's load rule, exactly as p2c (or
kv_load) would, as HAProxy's path sends an unseen start by ``leastconn``. A cold later turn
(a chat with messages after its start: another router sent its earlier turns) goes to its
start's replica on the ring within the bound, where every router sends the conversation
from its second turn: the first turn's cache is missed once, and the routers agree after.

Before, a cold prompt went to the less loaded of its ring replica and one other, ties to
the ring replica: on random prompts through the proxy (``release_tests.llm_routing``,
rounds of every policy on the same arrivals, exploratory, at 21d7c96) its TTFT p99 was
+16%, +9%, +17% against p2c's, where placed by p2c it was -17%, -1%, -13%.

``next_in_turn``: round robin, the first replica with room from where the last turn ended.
"""

from __future__ import annotations

from typing import Callable, Sequence

from controlplane.routing.members import ReplicaMembers
from controlplane.routing.policies import Affinity
from controlplane.routing.prefix_affinity import capacity, choose

LoadOf = Callable[[str], "int | None"]
AFFINITY_FLOOR = 2  # requests a replica always takes for its own prefixes (if it has room)


def affine_replica(members: ReplicaMembers, affinity: Affinity, load_of: LoadOf,
                   total_load: int, balance_factor: float, floor: int) -> str | None:
    """``floor``: the bound never goes under it (``prefix_affinity.capacity``). None: no
    affinity places it (cold, or none within the bound): by load."""
    if not affinity.continued and affinity.blocks \
            and members.index.match(affinity.blocks[:1])[0] is None:
        return None  # cold, a conversation's start: by load, as p2c
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
