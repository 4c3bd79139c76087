"""Push-health statistics: self-check intervals over recent windows, and the counters.

Owns:

- ``IntervalWindows``: the intervals at which fresh self-check results reach the
  controller, held as a log-bucket histogram in two consecutive windows.
- ``IntervalStats``: a frozen, mergeable view of those windows (p50/p99/max).
- ``HealthTotals``: the shard-wide counters behind ``controller.health`` in
  ``fleetplane status --json`` and /metrics; ``HealthStatistics`` is its frozen snapshot.
  Besides push health they count the shard's own trouble: deployment ticks that raised.

Invariants:

- Percentiles come from the current and the previous window only, never from the
  controller's lifetime (seed 000, gemini review of ray-project/ray#64913: lifetime stats
  "went insensitive to current lag exactly when the numbers are worth reading"). ``count``
  stays cumulative so it still reads as a counter.
- Recording is O(1), and cheap: an interval is appended to the current window's buffer
  and bucketed with numpy a few thousand at a time (bucketing each in Python was a
  noticeable part of every push); a snapshot folds the buffer, then is O(buckets).
  Snapshots merge exactly (bucket sums), so shards and deployments combine without
  losing the percentiles.
- A reported percentile is a bucket's upper bound clamped to the observed max: within
  ``2**(1/8) - 1`` (about 9 %) of the true value, and exact when all samples are equal.
- No clock reads: every method that needs the time takes ``now`` (the shard's monotonic
  clock).
"""

from __future__ import annotations

from collections.abc import Sequence

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

# One window; the figures cover the current window plus the previous one, so 60-120 s of
# history: long enough for a p99 over a 10 s health period, short enough to show lag now.
INTERVAL_WINDOW_S = 60.0

_MIN_INTERVAL_S = 0.001  # bucket 0 holds everything at or below 1 ms
_BUCKETS_PER_DOUBLING = 8  # ~9 % resolution
_NUM_BUCKETS = _BUCKETS_PER_DOUBLING * 24  # top bucket starts near 4.6 hours


def _bucket_of(interval_s: float) -> int:
    if interval_s <= _MIN_INTERVAL_S:
        return 0
    index = math.ceil(math.log2(interval_s / _MIN_INTERVAL_S) * _BUCKETS_PER_DOUBLING)
    return min(index, _NUM_BUCKETS - 1)


def _upper_bound(bucket: int) -> float:
    return _MIN_INTERVAL_S * 2 ** (bucket / _BUCKETS_PER_DOUBLING)


@dataclass(frozen=True)
class IntervalStats:
    """Self-check intervals of the last one or two windows, plus the cumulative count."""

    count: int = 0  # every interval ever recorded (a counter)
    buckets: Mapping[int, int] = field(default_factory=dict, hash=False)  # window only
    max_s: float | None = None  # largest interval in the windows; None when empty

    @property
    def window_count(self) -> int:
        return sum(self.buckets.values())

    def percentile(self, q: float) -> float | None:
        """The ``q``-quantile (0 < q <= 1) of the windowed intervals; None when empty."""
        if not 0 < q <= 1:
            raise ValueError(f"q must be in (0, 1], got {q}")
        total = self.window_count
        if total == 0:
            return None
        rank, seen = math.ceil(q * total), 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return min(_upper_bound(bucket), self.max_s)
        return self.max_s  # unreachable: the buckets sum to total

    def merge(self, other: IntervalStats) -> IntervalStats:
        buckets = dict(self.buckets)
        for bucket, n in other.buckets.items():
            buckets[bucket] = buckets.get(bucket, 0) + n
        maxes = [m for m in (self.max_s, other.max_s) if m is not None]
        return IntervalStats(self.count + other.count, buckets, max(maxes) if maxes else None)

    def as_dict(self) -> dict[str, float | None]:
        """``{"p50", "p99", "max"}`` in seconds; null when no interval is in the windows."""
        return {"p50": self.percentile(0.5), "p99": self.percentile(0.99), "max": self.max_s}


_FOLD_AT = 4096  # buffered intervals bucketed in one numpy pass


class _Window:
    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.max_s: float | None = None
        self.pending: list[float] = []

    def fold(self) -> None:
        """Bucket the buffered intervals: ``_bucket_of`` of each, vectorized."""
        if not self.pending:
            return
        values = np.asarray(self.pending, dtype=np.float64)
        self.pending = []
        ratio = np.maximum(values, _MIN_INTERVAL_S) / _MIN_INTERVAL_S
        index = np.ceil(np.log2(ratio) * _BUCKETS_PER_DOUBLING).astype(np.int64)
        index[values <= _MIN_INTERVAL_S] = 0
        index = np.minimum(index, _NUM_BUCKETS - 1)
        for bucket, n in zip(*np.unique(index, return_counts=True)):
            self.buckets[int(bucket)] = self.buckets.get(int(bucket), 0) + int(n)
        top = float(values.max())
        self.max_s = top if self.max_s is None else max(self.max_s, top)


class IntervalWindows:
    """Intervals in the current window and the one before it, with a cumulative count."""

    def __init__(self, window_s: float = INTERVAL_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self._window_s = window_s
        self._start: float | None = None  # start of the current window
        self._roll_at = -math.inf  # when the current window ends (-inf: none yet)
        self._current = _Window()
        self._previous = _Window()
        self._count = 0

    def record(self, interval_s: float, now: float) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.record_many((interval_s,), now)

    def record_many(self, intervals_s: Sequence[float], now: float) -> None:
        """``record`` of each of ``intervals_s`` (each >= 0) at ``now``: a node batch's
        steady pushes in one call."""
        if now >= self._roll_at:  # one compare per call
            self._roll(now)
        pending = self._current.pending
        pending.extend(intervals_s)
        self._count += len(intervals_s)
        if len(pending) >= _FOLD_AT:
            self._current.fold()

    def _roll(self, now: float) -> None:
        if self._start is None:
            self._start, self._roll_at = now, now + self._window_s
            return
        elapsed = now - self._start
        if elapsed < self._window_s:
            return
        self._current.fold()
        # Two or more windows ago: the current window is too old to be "the previous".
        self._previous = self._current if elapsed < 2 * self._window_s else _Window()
        self._current = _Window()
        self._start = now if elapsed >= 2 * self._window_s else self._start + self._window_s
        self._roll_at = self._start + self._window_s

    def snapshot(self, now: float) -> IntervalStats:
        """The windows as of ``now``, without mutating them (a read is not a roll)."""
        windows = [self._current, self._previous]
        if self._start is not None and now - self._start >= 2 * self._window_s:
            windows = []
        elif self._start is not None and now - self._start >= self._window_s:
            windows = [self._current]  # it would be "previous" after a roll
        stats = IntervalStats(count=self._count)
        for w in windows:
            w.fold()
            stats = stats.merge(IntervalStats(0, w.buckets, w.max_s))
        return stats


@dataclass(frozen=True)
class HealthStatistics:
    """The ``controller.health`` figures of one shard, or merged across shards."""

    pushes_total: int = 0  # health entries received, on reports or heartbeats
    heartbeats_total: int = 0  # of those, the ones that came on a heartbeat
    pull_probes_total: int = 0  # fallback probes started
    stall_episodes_total: int = 0  # stall-guard episodes engaged
    intervals: IntervalStats = field(default_factory=IntervalStats)
    # Failed health observations the controller acted on (pushed or probed); a dropped
    # probe result never counts (seed 000: the counter follows the observation acted on).
    health_check_failures_total: int = 0
    tick_errors_total: int = 0  # deployment ticks that raised (each backs its deployment off)
    batches_total: int = 0  # node reporters' batches taken in (each carries many reports)

    def merge(self, other: HealthStatistics) -> HealthStatistics:
        return HealthStatistics(
            self.pushes_total + other.pushes_total,
            self.heartbeats_total + other.heartbeats_total,
            self.pull_probes_total + other.pull_probes_total,
            self.stall_episodes_total + other.stall_episodes_total,
            self.intervals.merge(other.intervals),
            self.health_check_failures_total + other.health_check_failures_total,
            self.tick_errors_total + other.tick_errors_total,
            self.batches_total + other.batches_total)

    def as_json(self) -> dict:
        """The ``controller.health`` object of ``fleetplane status --json``."""
        return {"pushes_total": self.pushes_total, "heartbeats_total": self.heartbeats_total,
                "pull_probes_total": self.pull_probes_total,
                "stall_episodes_total": self.stall_episodes_total,
                "health_check_failures_total": self.health_check_failures_total,
                "tick_errors_total": self.tick_errors_total,
                "report_batches_total": self.batches_total,
                "self_check_interval_s": self.intervals.as_dict(),
                "self_check_intervals_total": self.intervals.count}


def merge_all(stats: Iterable[HealthStatistics]) -> HealthStatistics:
    merged = HealthStatistics()
    for s in stats:
        merged = merged.merge(s)
    return merged


class HealthTotals:
    """Shard-wide counters, shared by every deployment's registry, gate and stall guard.

    Shard-wide rather than per deployment so a deleted deployment cannot take its counts
    with it: the totals are Prometheus counters and must never go backwards.
    """

    def __init__(self, window_s: float = INTERVAL_WINDOW_S) -> None:
        self.pushes_total = 0
        self.heartbeats_total = 0
        self.pull_probes_total = 0
        self.stall_episodes_total = 0
        self.health_check_failures_total = 0
        self.tick_errors_total = 0
        self.batches_total = 0
        self.intervals = IntervalWindows(window_s)

    def statistics(self, now: float) -> HealthStatistics:
        return HealthStatistics(self.pushes_total, self.heartbeats_total,
                                self.pull_probes_total, self.stall_episodes_total,
                                self.intervals.snapshot(now), self.health_check_failures_total,
                                self.tick_errors_total, self.batches_total)
