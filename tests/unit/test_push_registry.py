"""Push registry (newest wins, dirty set, rate-limited pruning) and interval statistics."""

from __future__ import annotations

import json
import pickle

import pytest

from controlplane.health.stats import (HealthStatistics, HealthTotals, IntervalWindows,
                                              merge_all)
from controlplane.health.push_registry import PRUNE_INTERVAL_S, HealthPushRegistry
from controlplane.wire import PushedHealth, ReportRow

T0 = 1000.0


def ok(checked_at: float) -> PushedHealth:
    return PushedHealth(True, checked_at, 0)


def bad(checked_at: float, failures: int = 1) -> PushedHealth:
    return PushedHealth(False, checked_at, failures)


# --- newest wins ---------------------------------------------------------------------------


def test_newest_entry_wins_by_checked_at_whatever_the_arrival_order():
    registry = HealthPushRegistry()
    assert registry.record("r1", ok(50.0), received_at=T0)
    assert not registry.record("r1", bad(40.0), received_at=T0 + 1)  # older, arrived late
    entry = registry.get("r1")
    assert entry.health == ok(50.0) and entry.received_at == T0
    assert registry.record("r1", bad(60.0), received_at=T0 + 2)
    assert registry.get("r1").health == bad(60.0)


def test_a_repeated_result_keeps_its_first_arrival_time():
    # The same result re-carried by the next report is not a fresh arrival: freshness is
    # anchored to when the newest result first arrived.
    registry = HealthPushRegistry()
    registry.record("r1", ok(50.0), received_at=T0)
    registry.take_dirty()
    assert not registry.record("r1", ok(50.0), received_at=T0 + 5)
    assert registry.get("r1").received_at == T0
    assert registry.take_dirty() == []


def test_dirty_set_holds_replicas_with_unconsumed_arrivals_once():
    registry = HealthPushRegistry()
    registry.record("a", ok(1.0), T0)
    registry.record("b", ok(1.0), T0)
    registry.record("a", ok(2.0), T0 + 1)
    assert registry.take_dirty() == ["a", "b"]
    assert registry.take_dirty() == []
    registry.mark_dirty("a")
    registry.mark_dirty("unknown")
    assert registry.take_dirty() == ["a"]


def test_forget_drops_entry_and_dirtiness():
    registry = HealthPushRegistry()
    registry.record("a", ok(1.0), T0)
    registry.forget("a")
    registry.forget("a")
    assert registry.get("a") is None and registry.take_dirty() == []
    assert registry.tracked == 0


def test_counters_count_every_health_entry_received():
    totals = HealthTotals()
    registry = HealthPushRegistry(totals)
    registry.record("a", ok(1.0), T0)
    registry.record("a", ok(1.0), T0 + 1)  # a duplicate is still a push received
    registry.record("a", ok(2.0), T0 + 2, via_heartbeat=True)
    stats = totals.statistics(T0 + 2)
    assert (stats.pushes_total, stats.heartbeats_total) == (3, 1)


def test_pushed_health_rejects_inconsistent_fields():
    with pytest.raises(ValueError):
        PushedHealth(False, 1.0, 0)
    with pytest.raises(ValueError):
        PushedHealth(True, 1.0, -1)


# --- pruning -------------------------------------------------------------------------------------


def test_pruning_walks_at_most_once_per_30s():
    # Seed 000 review fix: "Registry pruning is rate-limited to once per 30s"; the
    # over-threshold prune re-ran an O(N) rebuild on every record() once all were fresh.
    registry = HealthPushRegistry(retention_s=300.0)
    for i in range(100):
        registry.record(f"r{i}", ok(1.0), T0 + i * 0.1)
    assert registry.statistics().prune_passes == 1
    for i in range(1000):
        registry.record(f"r{i % 100}", ok(2.0 + i), T0 + 10 + i * 0.01)
    assert registry.statistics().prune_passes == 1
    registry.record("r0", ok(5000.0), T0 + PRUNE_INTERVAL_S)
    assert registry.statistics().prune_passes == 2


def test_pruning_drops_entries_past_retention():
    registry = HealthPushRegistry(retention_s=300.0)
    registry.record("gone", ok(1.0), T0)
    registry.record("live", ok(1.0), T0)
    registry.record("live", ok(2.0), T0 + 290)
    registry.record("live", ok(3.0), T0 + 320)  # 30 s after the previous pass
    assert registry.get("gone") is None and registry.get("live") is not None
    assert registry.tracked == 1


# --- interval statistics ------------------------------------------------------------------------


def test_self_check_intervals_are_arrival_gaps_of_fresh_results():
    totals = HealthTotals()
    registry = HealthPushRegistry(totals)
    for i, gap in enumerate([5.0] * 98 + [9.0, 40.0]):
        registry.record(f"r{i}", ok(1.0), T0)
        registry.record(f"r{i}", ok(1.0), T0 + 1)  # the same result again: no interval
        registry.record(f"r{i}", ok(0.5), T0 + 2)  # an older result: no interval
        registry.record(f"r{i}", ok(2.0), T0 + gap)
    stats = totals.statistics(T0 + 45)
    assert stats.intervals.count == 100 and stats.intervals.max_s == 40.0
    assert stats.intervals.percentile(0.5) == pytest.approx(5.0, rel=0.1)
    assert stats.intervals.percentile(0.99) == pytest.approx(9.0, rel=0.1)


def test_equal_intervals_report_exactly():
    windows = IntervalWindows(window_s=60.0)
    for i in range(10):
        windows.record(5.0, T0 + i)
    assert windows.snapshot(T0 + 10).as_dict() == {"p50": 5.0, "p99": 5.0, "max": 5.0}


def test_interval_stats_cover_one_or_two_windows_and_count_stays_cumulative():
    # Seed 000 review fix: gap stats accumulated over the controller's lifetime went
    # insensitive to current lag. A 100 s gap recorded long ago must age out of max/p99.
    windows = IntervalWindows(window_s=60.0)
    windows.record(100.0, T0)
    windows.record(5.0, T0 + 30)
    assert windows.snapshot(T0 + 30).max_s == 100.0
    windows.record(5.0, T0 + 70)  # next window: the first one is "previous", still shown
    assert windows.snapshot(T0 + 70).max_s == 100.0
    windows.record(5.0, T0 + 125)  # two windows on: the old gap is gone
    stats = windows.snapshot(T0 + 125)
    assert stats.max_s == 5.0 and stats.percentile(0.99) == 5.0
    assert stats.count == 4 and stats.window_count == 2


def test_snapshot_ages_windows_without_new_records():
    windows = IntervalWindows(window_s=60.0)
    windows.record(7.0, T0)
    assert windows.snapshot(T0 + 61).window_count == 1
    idle = windows.snapshot(T0 + 121)
    assert idle.window_count == 0 and idle.count == 1
    assert idle.as_dict() == {"p50": None, "p99": None, "max": None}


def test_statistics_merge_across_shards_and_serialize():
    a, b = HealthTotals(), HealthTotals()
    a.pushes_total, b.pushes_total, b.stall_episodes_total, a.pull_probes_total = 3, 4, 1, 2
    a.intervals.record(2.0, T0)
    b.intervals.record(8.0, T0)
    merged = merge_all([a.statistics(T0), b.statistics(T0)])
    assert merged.pushes_total == 7 and merged.intervals.count == 2
    assert merged.intervals.max_s == 8.0
    body = merged.as_json()
    assert set(body) >= {"pushes_total", "heartbeats_total", "pull_probes_total",
                         "stall_episodes_total", "self_check_interval_s"}
    assert set(body["self_check_interval_s"]) == {"p50", "p99", "max"}
    json.dumps(body)
    assert pickle.loads(pickle.dumps(merged)) == merged
    assert merge_all([]) == HealthStatistics()


def test_buffered_intervals_land_in_the_buckets_one_by_one_bucketing_gives():
    import random

    from controlplane.health import stats as health_stats
    from controlplane.health.stats import IntervalWindows

    rng = random.Random(5)
    values = [rng.choice([0.0, 0.001, 0.0005, 1e-9, 2 ** rng.randrange(-12, 14) / 1000,
                          rng.uniform(0, 30), rng.uniform(0, 1e6)]) for _ in range(20_000)]
    windows = IntervalWindows(window_s=1e9)
    expected: dict[int, int] = {}
    for v in values:
        windows.record(v, 1.0)
        bucket = health_stats._bucket_of(v)
        expected[bucket] = expected.get(bucket, 0) + 1
    stats = windows.snapshot(1.0)
    assert dict(stats.buckets) == expected and stats.max_s == max(values)
    assert stats.count == len(values)


def test_the_steady_path_records_intervals_as_the_windows_themselves_do():
    # ``take_steady`` buffers a steady push's interval through the windows' batch methods:
    # across window rolls and folds, what it leaves must be what ``IntervalWindows.record``
    # would
    import random

    from controlplane.health.stats import _FOLD_AT
    rng = random.Random(13)
    fast_totals, slow = HealthTotals(), IntervalWindows()
    registry = HealthPushRegistry(fast_totals)
    last: dict[str, float] = {}
    now, checked = T0, 1.0
    for i in range(3 * _FOLD_AT):
        rid = f"r{rng.randrange(50)}"
        now += rng.choice([0.0, 0.001, 0.02, 0.5, 7.0 if i % 997 == 0 else 0.01])
        checked += 1.0
        if rid not in last:
            registry.record(rid, ok(checked), now)  # the first entry: no interval
        else:
            assert registry.take_steady([ReportRow(rid, 0, 0, True, checked, 0, "")], now) == []
            slow.record(max(0.0, now - last[rid]), now)
        last[rid] = now
    fast = fast_totals.intervals
    for at in (now, now + 61.0):
        assert fast.snapshot(at) == slow.snapshot(at)
    assert fast.snapshot(now).count == slow.snapshot(now).count > 2 * _FOLD_AT


def test_the_steady_path_refuses_what_only_the_general_path_may_take():
    registry = HealthPushRegistry(HealthTotals())
    registry.record("sick", PushedHealth(False, 1.0, 1, "x"), T0)
    registry.record("fine", ok(5.0), T0)
    rows = [ReportRow("unknown", 0, 0, True, 2.0, 0, ""),  # no entry yet
            ReportRow("sick", 0, 0, True, 2.0, 0, ""),  # its entry is unhealthy
            ReportRow("fine", 0, 0, True, 5.0, 0, ""),  # not newer
            ReportRow("fine", 0, 0, True, "6", 0, "")]  # malformed
    assert registry.take_steady(rows, T0 + 1) == rows
    assert registry.get("fine").received_at == T0 and registry.take_dirty() == ["sick", "fine"]
