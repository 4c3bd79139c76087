"""A router's approximate index of which replica read which prompt blocks.

The hash ring (``prefix_affinity``) sends a conversation's start to the same replica from
every router. The index remembers where this router actually sent each prompt's blocks,
so that a conversation the bounded load once spilled to another replica goes on finding
its history there (the ring alone would send its next turn back to the start's replica).

Bounded as an engine's cache is: each replica keeps at most ``blocks_per_replica`` block
keys, and the least recently used go first, as vLLM evicts its free blocks LRU. The
default, 4,096 blocks of 256 characters, is about 256K tokens a replica, the order of one
GB10's KV cache for a 120B model (deployments/llm-gb10.yaml); an engine with less evicts
sooner than the index forgets, and the index then points at a replica that may have lost
the prefix: the cost is one request placed as if by load. Memory: about 150 bytes a key,
about 5 MiB for 8 replicas at the default.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

DEFAULT_BLOCKS_PER_REPLICA = 4096


class PrefixIndex:
    def __init__(self, blocks_per_replica: int = DEFAULT_BLOCKS_PER_REPLICA) -> None:
        self._limit = blocks_per_replica
        self._holder: dict[int, str] = {}  # block key -> the replica that read it last
        self._lru: dict[str, OrderedDict[int, None]] = {}  # replica -> its keys, oldest first

    def match(self, keys: tuple[int, ...]) -> tuple[str | None, int]:
        """The replica holding the longest run of ``keys`` from the first, and its length
        (in blocks); (None, 0) when no replica holds the first. Keys are chained, so the
        run ends at the first key that is not held by that replica."""
        holder, matched = None, 0
        for i, key in enumerate(keys):
            owner = self._holder.get(key)
            if owner is None or (holder is not None and owner != holder):
                break
            holder, matched = owner, i + 1
        return holder, matched

    def insert(self, replica_id: str, keys: tuple[int, ...]) -> None:
        """``replica_id`` has read ``keys`` now (most recently used)."""
        if not keys:
            return
        lru = self._lru.setdefault(replica_id, OrderedDict())
        for key in keys:
            previous = self._holder.get(key)
            if previous is not None and previous != replica_id:
                self._lru[previous].pop(key, None)
            self._holder[key] = replica_id
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > self._limit:
            old, _ = lru.popitem(last=False)
            if self._holder.get(old) == replica_id:
                del self._holder[old]

    def keep_only(self, replica_ids: Iterable[str]) -> None:
        """Forget the replicas not in ``replica_ids`` (they left the placeable set)."""
        kept = set(replica_ids)
        for replica_id in [r for r in self._lru if r not in kept]:
            for key in self._lru.pop(replica_id):
                if self._holder.get(key) == replica_id:
                    del self._holder[key]

    def __len__(self) -> int:
        return len(self._holder)
