"""Per-update health records of a simulated fleet, kept inside the shard process.

Owns: for each replica, when the controller last received a fresh health observation
(a push with a newer ``checked_at``, or a pull-probe result), and one row per update
while measuring. No Ray, no clock reads: callers pass ``now`` (the shard's monotonic
clock, which on one machine is the same CLOCK_MONOTONIC the replicas stamp
``checked_at`` with).

Definitions (printed with the table):

- update: a fresh health observation reaching the controller's state, by push or probe.
- freshness deadline: the previous update's arrival (or the replica's start) plus
  ``stale_after_s`` (1.5 x the health period: past it the controller's view has gone stale
  and a real one would fall back to a probe).
- miss: an update that arrived after its deadline, or a live replica whose deadline had
  passed with nothing arrived when measuring stopped (counted once, as ``overdue``).
"""

from __future__ import annotations

from dataclasses import dataclass

COLUMNS = ("replica_id", "source", "t_s", "gap_s", "age_s", "delay_s", "missed")


@dataclass(frozen=True)
class MeasuredUpdates:
    rows: dict  # column name -> list, COLUMNS
    updates: int  # rows that are updates (not ``overdue`` markers)
    misses: int  # late updates + overdue replicas


class UpdateRecorder:
    def __init__(self, stale_after_s: float) -> None:
        self._deadline_s = stale_after_s
        self._last: dict[str, float] = {}  # replica -> last update arrival (or start)
        self._checked: dict[str, float] = {}  # replica -> newest checked_at received
        self._since: float | None = None  # measuring since; None: not measuring
        self._rows: list[tuple] = []

    def on_started(self, replica_id: str, now: float) -> None:
        self._last[replica_id] = now

    def forget(self, replica_id: str) -> None:
        self._last.pop(replica_id, None)
        self._checked.pop(replica_id, None)

    def on_push(self, replica_id: str, checked_at: float, now: float, delay_s: float) -> None:
        """``delay_s``: from the replica sending the report to the shard taking it in."""
        newest = self._checked.get(replica_id)
        if replica_id not in self._last or (newest is not None and checked_at <= newest):
            return  # not live, or not a newer result
        self._checked[replica_id] = checked_at
        self._update(replica_id, "push", now, now - checked_at, delay_s)

    def on_probe(self, replica_id: str, ok: bool, now: float, latency_s: float) -> None:
        if replica_id in self._last:
            self._update(replica_id, "probe" if ok else "probe_failed", now, None, latency_s)

    def _update(self, replica_id: str, source: str, now: float, age_s: float | None,
                delay_s: float) -> None:
        gap = now - self._last[replica_id]
        self._last[replica_id] = now
        if self._since is not None:
            self._rows.append((replica_id, source, now - self._since, gap, age_s, delay_s,
                               gap > self._deadline_s))

    def start(self, now: float) -> None:
        self._since, self._rows = now, []

    def stop(self, now: float) -> MeasuredUpdates:
        rows, self._rows = self._rows, []
        updates = len(rows)
        for replica_id, last in self._last.items():
            if now - last > self._deadline_s:
                rows.append((replica_id, "overdue", now - self._since, now - last, None, None,
                             True))
        self._since = None
        columns = {name: [row[i] for row in rows] for i, name in enumerate(COLUMNS)}
        return MeasuredUpdates(columns, updates, sum(1 for row in rows if row[-1]))
