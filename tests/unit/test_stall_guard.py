"""Stall guard: verdict engage/disengage, the episode cap, staggered holds, retraction."""

from __future__ import annotations

import pickle

import pytest

from controlplane.errors import IllegalTransition
from controlplane.health.stats import HealthTotals
from controlplane.health.stall_guard import (STALL_EPISODE_CAP_S, STALL_MIN_TRACKED,
                                             STOCK_HEALTH_CHECK_PERIOD_S, GuardEvent, GuardState,
                                             StallGuard, is_stall, next_state, stagger_offset_s)

T0 = 1000.0
WINDOW = 10.0


def ids(n: int, prefix: str = "r") -> list[str]:
    return [f"app#dep#{prefix}{i}" for i in range(n)]


def engaged_guard(tracked: int = 100) -> tuple[StallGuard, HealthTotals]:
    totals = HealthTotals()
    guard = StallGuard(WINDOW, totals)
    guard.advance(T0, tracked)
    for rid in ids(tracked // 2):
        guard.on_stale(rid, T0, tracked)
    assert guard.state is GuardState.ENGAGED
    for rid in ids(tracked // 2):  # the revisit holds the ones probed before the verdict
        assert guard.on_stale(rid, T0, tracked) > T0
    return guard, totals


# --- the verdict ------------------------------------------------------------------------------


def test_verdict_line_is_half_of_at_least_64_distinct_tracked():
    assert not is_stall(63, 63)
    assert is_stall(32, 64)
    assert not is_stall(31, 64)
    assert STALL_MIN_TRACKED == 64


def test_tally_accumulates_across_ticks_within_a_window():
    # Seed 000 review fix: a per-dirty-slice tally only engaged above ~3200 replicas. Here
    # no single tick sees more than 6 stale replicas, yet 50 of 100 are stale in the window.
    guard = StallGuard(WINDOW)
    stale = iter(ids(60))
    hold = 0.0
    for tick in range(10):
        now = T0 + tick * 0.5
        guard.advance(now, 100)
        for _ in range(6):
            hold = guard.on_stale(next(stale), now, 100)
    assert guard.state is GuardState.ENGAGED and hold > T0 + 4.5


def test_each_replica_counts_once_per_window():
    # Seed 000 review fix: a small failed cohort, revisited every tick, must not read as
    # fleet-wide lag. 10 replicas seen 20 times each are 10 stale replicas, not 200.
    guard = StallGuard(WINDOW)
    guard.advance(T0, 100)
    for tick in range(20):
        for rid in ids(10):
            assert guard.on_stale(rid, T0 + tick * 0.1, 100) == 0.0
    assert guard.state is GuardState.IDLE
    assert guard.statistics().stale_in_window == 10


def test_fewer_than_64_tracked_never_engage():
    guard = StallGuard(WINDOW)
    guard.advance(T0, 63)
    for rid in ids(63):
        assert guard.on_stale(rid, T0, 63) == 0.0
    assert guard.state is GuardState.IDLE


def test_window_defaults_to_the_stock_health_period():
    # Seed 000 review fix: without target info the window falls back to the stock period,
    # so a deployment being recovered or deleted does not read every push as stale.
    assert StallGuard(None).window_s == STOCK_HEALTH_CHECK_PERIOD_S == 10.0
    guard = StallGuard(30.0)
    guard.set_window(None)
    assert guard.window_s == 10.0
    with pytest.raises(ValueError):
        StallGuard(0.0)


# --- holds ----------------------------------------------------------------------------------------


def test_holds_are_capped_staggered_and_only_shorten():
    guard, totals = engaged_guard()
    holds = [guard.on_stale(rid, T0 + 1, 100) for rid in ids(100)]
    assert all(T0 + 0.75 * STALL_EPISODE_CAP_S <= h <= T0 + STALL_EPISODE_CAP_S for h in holds)
    assert len({round(h, 3) for h in holds}) > 90  # not one shared deadline
    assert max(holds) - min(holds) > 0.5 * 0.25 * STALL_EPISODE_CAP_S
    assert totals.stall_episodes_total == 1


def test_hold_offset_is_deterministic_per_replica():
    assert stagger_offset_s("a#b#1") == stagger_offset_s("a#b#1")
    assert 0.0 <= stagger_offset_s("a#b#1") < 0.25 * STALL_EPISODE_CAP_S


def test_hold_is_re_stamped_on_every_visit():
    guard, _ = engaged_guard()
    rid = ids(1)[0]
    first = guard.on_stale(rid, T0 + 1, 100)
    assert guard.on_stale(rid, T0 + 50, 100) == first  # the same episode, the same hold


def test_cap_ends_the_episode_and_probes_fall_through_until_it_clears():
    guard, totals = engaged_guard()
    rid = ids(1)[0]
    assert guard.on_stale(rid, T0 + STALL_EPISODE_CAP_S - 1, 100) > 0.0
    # Still stalled: every window crosses the line again, but a capped episode does not
    # restart, or a real mass outage would be deferred forever.
    for w in range(4):
        now = T0 + STALL_EPISODE_CAP_S + w * WINDOW
        guard.advance(now, 100)
        assert guard.state is GuardState.EXHAUSTED
        for r in ids(100):
            assert guard.on_stale(r, now, 100) == 0.0
    guard.advance(T0 + STALL_EPISODE_CAP_S + 4 * WINDOW, 100)
    guard.advance(T0 + STALL_EPISODE_CAP_S + 5 * WINDOW, 100)  # a window with no stale
    assert guard.state is GuardState.IDLE
    now = T0 + STALL_EPISODE_CAP_S + 5 * WINDOW
    for r in ids(50):
        guard.on_stale(r, now, 100)
    assert guard.state is GuardState.ENGAGED and totals.stall_episodes_total == 2


def test_episode_ending_early_retracts_every_hold():
    # Seed 000 review fix: "an episode that ends early retracts rather than leaving a
    # replica sitting out a cap that no longer applies".
    guard, _ = engaged_guard()
    held = ids(50)
    retracted = guard.advance(T0 + WINDOW, 100)  # closes the engaged (stale) window
    assert retracted == () and guard.state is GuardState.ENGAGED
    for rid in ids(5):  # lag is over: only a few stay stale
        guard.on_stale(rid, T0 + WINDOW + 1, 100)
    retracted = guard.advance(T0 + 2 * WINDOW, 100)
    assert guard.state is GuardState.IDLE
    assert set(retracted) == set(held)
    assert guard.on_stale(held[0], T0 + 2 * WINDOW, 100) == 0.0


def test_forget_removes_a_replica_from_tally_and_holds():
    guard, _ = engaged_guard()
    guard.forget(ids(1)[0])
    stats = guard.statistics()
    assert stats.stale_in_window == 49 and stats.held == 49


# --- the table ---------------------------------------------------------------------------------


def test_transition_table_rejects_illegal_events():
    assert next_state(GuardState.IDLE, GuardEvent.CROSSED) is GuardState.ENGAGED
    with pytest.raises(IllegalTransition) as info:
        next_state(GuardState.IDLE, GuardEvent.CAPPED)
    assert str(info.value) == "illegal stall-guard transition: IDLE on CAPPED"
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.state, err.event) == (GuardState.IDLE, GuardEvent.CAPPED)
    assert str(err) == str(info.value)
