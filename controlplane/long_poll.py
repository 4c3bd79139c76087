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

Deltas: ``publish_delta`` stores a change instead of a whole payload. A
listener that holds one of the last ``MAX_DELTAS`` versions gets the deltas since then
(``Deltas``), O(changes) to build and to send; any other listener gets the whole payload,
built from the previous one and the deltas the first time it is asked for (``apply``), so
a fleet of 32K replicas is not rebuilt and re-sent on every start and stop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from typing import Any, Callable, Hashable

from controlplane.wire import Deltas


MAX_DELTAS = 64  # deltas kept per key: a listener further behind gets the whole payload


class _DeltaLog:
    """The deltas of one key since its last whole payload, and the versions they lead from."""

    def __init__(self, apply: Callable[[Any, Any], Any]) -> None:
        self.apply = apply
        self.entries: deque[tuple[int, Any]] = deque()  # (version it leads FROM, delta)
        self.unapplied: list[Any] = []  # deltas not yet folded into the stored payload

    def since(self, version: int) -> list[Any] | None:
        for i, (base, _) in enumerate(self.entries):
            if base == version:
                return [delta for _, delta in itertools.islice(self.entries, i, None)]
        return None


class LongPollHost:
    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, Any]] = {}
        self._logs: dict[Hashable, _DeltaLog] = {}
        self._changed = asyncio.Event()
        self._next_version = time.time_ns()

    def publish(self, key: Hashable, payload: Any) -> bool:
        """Store a new payload for key; returns False (and wakes nobody) if unchanged."""
        if key in self._entries and self.payload(key) == payload:
            return False
        self._logs.pop(key, None)  # a whole payload: older deltas lead nowhere now
        self._store(key, payload)
        return True

    def publish_delta(self, key: Hashable, delta: Any,
                      apply: Callable[[Any, Any], Any]) -> None:
        """Store a change of key's payload (which must exist): ``apply(payload, delta)``
        is the new payload, built only when a listener needs it whole."""
        version, _ = self._entries[key]
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = _DeltaLog(apply)
        log.entries.append((version, delta))
        log.unapplied.append(delta)
        if len(log.entries) > MAX_DELTAS:
            log.entries.popleft()
        self._store(key, self._entries[key][1])

    def _store(self, key: Hashable, payload: Any) -> None:
        self._entries[key] = (self._next_version, payload)
        self._next_version += 1
        self._changed.set()
        self._changed = asyncio.Event()  # waiters hold the old, now-set event

    def remove(self, key: Hashable) -> None:
        self.publish(key, None)

    def payload(self, key: Hashable) -> Any:
        """Key's whole payload now (deltas folded in)."""
        version, payload = self._entries[key]
        log = self._logs.get(key)
        if log is not None and log.unapplied:
            for delta in log.unapplied:
                payload = log.apply(payload, delta)
            log.unapplied = []
            self._entries[key] = (version, payload)
        return payload

    def snapshot(self, known: dict[Hashable, int],
                 watch_all: bool = False) -> dict[Hashable, tuple[int, Any]]:
        """Entries whose version differs from what the listener knows: the deltas since
        its version where they are kept, else the whole payload. With watch_all, also
        keys it has never seen; otherwise only the keys in ``known`` (version 0 for a key
        it wants but has not seen yet)."""
        keys = self._entries.keys() if watch_all else known.keys() & self._entries.keys()
        changes = {}
        for key in keys:
            version = self._entries[key][0]
            held = known.get(key)
            if held == version:
                continue
            log = self._logs.get(key)
            deltas = log.since(held) if log is not None and held is not None else None
            changes[key] = (version, Deltas(held, tuple(deltas)) if deltas is not None
                            else self.payload(key))
        return changes

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
