"""A router's placeable replicas, as the owning shard last pushed them: by id, by the
multiplexed models each holds (a request for a model goes first to a holder with room), on
a hash ring for prefix affinity (built on first use: 64 points a replica), with the prefix
index of the blocks this router sent each (``prefix_index``; emptied when the policy
changes) and the round-robin turn.

Rebuilt only when a push brings another replica tuple: a push that changed only the
deployment's limits or its cluster total keeps the tuple it had, and the rebuild is skipped.
"""

from __future__ import annotations

from typing import Iterable

from controlplane.routing.prefix_affinity import HashRing
from controlplane.routing.prefix_index import PrefixIndex
from controlplane.wire import ReplicaInfo


class ReplicaMembers:
    def __init__(self) -> None:
        self.by_id: dict[str, ReplicaInfo] = {}
        self.ids: list[str] = []  # by_id's keys, for sampling without a copy a request
        self.holders: dict[str, list[str]] = {}  # multiplexed model id -> replica ids
        self._pushed: tuple | None = None  # the last push's tuple, to skip a rebuild
        self._ring: HashRing | None = None  # over by_id, built when first asked for
        self.index = PrefixIndex()  # prompt policies: where this router sent which blocks
        self.turn = 0  # round_robin: where the next turn starts in by_id's order

    def take_push(self, replicas: tuple) -> bool:
        """Whether a push's ``replicas`` are news (another tuple than the last push's)."""
        if replicas is self._pushed:
            return False
        self._pushed = replicas
        return True

    def replace(self, replicas: Iterable[ReplicaInfo]) -> None:
        """The placeable set is now ``replicas``."""
        self.by_id = {r.replica_id: r for r in replicas}
        self.ids = list(self.by_id)
        self._ring = None
        if len(self.index):
            self.index.keep_only(self.by_id)
        self.holders = {}
        for r in self.by_id.values():
            for model_id in r.model_ids:
                self.holders.setdefault(model_id, []).append(r.replica_id)

    def forget_prompts(self) -> None:
        """The prefix index starts empty (the deployment's policy changed)."""
        self.index = PrefixIndex()

    def ring(self) -> HashRing:
        """The members on a consistent-hash ring (the same ring in every router)."""
        if self._ring is None:
            self._ring = HashRing(list(self.by_id))
        return self._ring

    def __len__(self) -> int:
        return len(self.by_id)
