"""Change notification from shards and the controller to routers (proxies and handles).

``LongPollHost`` keeps a versioned payload per key. A listener sends the versions it
knows; the call returns at once with every key whose version differs, or waits (up to a
timeout) for the next publish. So a router learns about a new replica set as soon as it
changes, and no request ever calls the controller.

Invariants: versions only grow, and a restarted host (a new shard or controller actor)
starts above every version its predecessor handed out, because versions start at the
host's creation time in nanoseconds: a listener that compares with ``!=`` can never take a
new payload for one it already has. ``publish`` of an equal payload is a no-op, so steady
state wakes nobody.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Hashable


class LongPollHost:
    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, Any]] = {}
        self._changed = asyncio.Event()
        self._next_version = time.time_ns()

    def publish(self, key: Hashable, payload: Any) -> bool:
        """Store a new payload for key; returns False (and wakes nobody) if unchanged."""
        current = self._entries.get(key)
        if current is not None and current[1] == payload:
            return False
        self._entries[key] = (self._next_version, payload)
        self._next_version += 1
        self._changed.set()
        self._changed = asyncio.Event()  # waiters hold the old, now-set event
        return True

    def remove(self, key: Hashable) -> None:
        self.publish(key, None)

    def snapshot(self, known: dict[Hashable, int],
                 watch_all: bool = False) -> dict[Hashable, tuple[int, Any]]:
        """Entries whose version differs from what the listener knows. With watch_all,
        also keys it has never seen; otherwise only the keys in ``known`` (version 0 for a
        key it wants but has not seen yet)."""
        keys = self._entries.keys() if watch_all else known.keys() & self._entries.keys()
        return {k: self._entries[k] for k in keys if known.get(k) != self._entries[k][0]}

    async def listen(self, known: dict[Hashable, int], watch_all: bool = False,
                     timeout_s: float = 30.0) -> dict[Hashable, tuple[int, Any]]:
        changes = self.snapshot(known, watch_all)
        if changes:
            return changes
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            return {}
        return self.snapshot(known, watch_all)
