"""Pending deadlines of a deployment's replica health visits: a bucketed timer wheel.

Owns ``DeadlineQueue``: at most one pending deadline per key, ``schedule`` replacing it,
``pop_due(now)`` returning the keys whose deadline is at or before ``now``, oldest first.

Why not a heap: with one push per replica per period moving each replica's visit
forward, a heap of ``(float, str)`` with lazy deletion held about N entries and
``pop_due`` took a quarter of a shard's tick at 16K replicas. Here a deadline lives in the
bucket of its ``BUCKET_S``-wide slice of time (a dict per bucket), so moving it is two
dict operations, and a heap holds only the indices of non-empty buckets (at most
horizon / ``BUCKET_S`` of them, whatever the number of replicas).

Invariants:

- Exact: ``pop_due(now)`` returns every key with deadline <= ``now`` and no other; only
  the one bucket that contains ``now`` is scanned entry by entry (it holds about
  N x ``BUCKET_S`` / horizon keys: a handful at 32K).
- ``schedule``, ``cancel``: O(1), plus O(log buckets) when a bucket is new.
- ``pop_due`` when nothing is due: O(1).

Beside the wheel, a line: deadlines given by ``schedule_in_order`` come no earlier than
the one before (a push's arrival time plus a fixed staleness window), so an ordered dict
keeps them sorted by moving a key to its end, two C-level operations, where the wheel's
``schedule`` is a dozen interpreted ones: the line takes every steady push. A key is in
at most one of the two; ``pop_due`` merges what is due in both.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

# A power of two, so bucket edges are exact binary fractions of a second.
BUCKET_S = 1 / 64
_PER_S = 64.0  # 1 / BUCKET_S: a multiply (exact for a power of two) instead of a division


class DeadlineQueue:
    """At most one pending deadline per key; ``schedule`` replaces it."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[str, float]] = {}  # bucket -> key -> deadline
        self._order: list[int] = []  # heap of the indices in ``_buckets``
        self._bucket_of: dict[str, int] = {}  # key -> its bucket
        self._line: OrderedDict[str, float] = OrderedDict()  # key -> deadline, ascending
        self._line_tail = -math.inf  # the latest deadline the line was given

    def __len__(self) -> int:
        return len(self._bucket_of) + len(self._line)

    @property
    def buckets(self) -> int:
        """Buckets pending in the heap (emptied ones included until they surface)."""
        return len(self._order)

    def __contains__(self, key: str) -> bool:
        return key in self._bucket_of or key in self._line

    def schedule_in_order(self, key: str, at: float) -> None:
        """``schedule``, for a deadline no earlier than any given here before: O(1), kept
        in the line. An earlier one (the window shrank) takes the general path."""
        if at < self._line_tail:
            self.schedule(key, at)
            return
        self._line_tail = at
        line = self._line
        if key in line:  # a test, not a KeyError caught: a new key is every start's
            line.move_to_end(key)
        else:
            index = self._bucket_of.pop(key, None)
            if index is not None:
                del self._buckets[index][key]
        line[key] = at

    def schedule_all_in_order(self, keys: list[str], at: float) -> None:
        """``schedule_in_order`` of each of ``keys`` at one ``at`` (a node batch's steady
        pushes): one call, not one per key."""
        if at < self._line_tail:
            for key in keys:
                self.schedule(key, at)
            return
        self._line_tail = at
        line, bucket_of, buckets = self._line, self._bucket_of, self._buckets
        for key in keys:
            if key in line:
                line.move_to_end(key)
            else:
                index = bucket_of.pop(key, None)
                if index is not None:
                    del buckets[index][key]
            line[key] = at

    def schedule(self, key: str, at: float) -> None:
        self._line.pop(key, None)
        index = int(at * _PER_S) if at >= 0 else math.floor(at * _PER_S)
        bucket_of = self._bucket_of
        old = bucket_of.get(key)
        if old is not None and old != index:
            del self._buckets[old][key]  # an emptied bucket is dropped when it surfaces
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = {}
            heapq.heappush(self._order, index)
        bucket[key] = at
        bucket_of[key] = index

    def cancel(self, key: str) -> None:
        self._line.pop(key, None)
        index = self._bucket_of.pop(key, None)
        if index is not None:
            del self._buckets[index][key]

    def pop_due(self, now: float) -> list[str]:
        due = self._pop_wheel(now)
        line = self._line
        if line and line[next(iter(line))] <= now:
            in_line = []
            for key, at in line.items():
                if at > now:
                    break
                in_line.append((at, key))
            for _, key in in_line:
                del line[key]
            due.extend(in_line)
        if not due:
            return []
        due.sort()
        return [key for _, key in due]

    def _pop_wheel(self, now: float) -> list[tuple[float, str]]:
        due: list[tuple[float, str]] = []
        current = int(now * _PER_S) if now >= 0 else math.floor(now * _PER_S)
        while self._order and self._order[0] <= current:
            index = self._order[0]
            bucket = self._buckets[index]
            if index < current:  # wholly in the past
                due.extend((at, key) for key, at in bucket.items())
                bucket.clear()
            else:  # the bucket holding now: only what is due
                for key, at in [(k, a) for k, a in bucket.items() if a <= now]:
                    del bucket[key]
                    due.append((at, key))
            if bucket:
                break  # the current bucket keeps its later deadlines
            heapq.heappop(self._order)
            del self._buckets[index]
        for _, key in due:
            del self._bucket_of[key]
        return due
