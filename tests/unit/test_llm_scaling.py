"""The LLM autoscaling policy (``autoscaling_config.llm``): pure decisions over engine
stats, and the autoscaler driving it over recorded series of what engines report.
No Ray, no clock: times are passed in."""

from __future__ import annotations

import math

import pytest

from controlplane.deployment.autoscaler import Autoscaler
from controlplane.deployment.llm_scaling import (DemandTrend, EngineBoard, LLMScaling,
                                                 LLMSignals, STALE_AFTER_S, Trend,
                                                 llm_desired)

SCALING = LLMScaling(target_fill=0.75, kv_cache_high=0.9, ttft_target_s=2.0)


def signals(engines=2, running=0.0, waiting=0.0, slots=4.0, kv=0.2, over=0, held=0,
            slot_s=None, load=None):
    return LLMSignals(engines, running, waiting, slots, kv, over, held, slot_s, load)


def stats(running, waiting=0, slots=4, kv=0.2, ttft=None):
    out = {"running": running, "waiting": waiting, "slots": slots, "kv_cache_usage": kv}
    if ttft is not None:
        out["ttft_p90_s"] = ttft
    return out


# ---- the count ------------------------------------------------------------------------

@pytest.mark.parametrize("running, waiting, current, want", [
    (6, 0, 2, 2),    # 6 of 2 x 4 slots x 0.75 = 6: steady
    (8, 4, 2, 4),    # 12 / 3 per replica
    (3, 0, 2, 1),    # 3 fits one at 0.75 (the level's mean and the delay are the damping)
    (0, 0, 2, 0),    # nothing at all: zero (the floor is min_replicas)
])
def test_before_a_slot_time_is_measured_demand_over_slots_at_the_target_fill(
        running, waiting, current, want):
    desired, _ = llm_desired(SCALING, signals(running=running, waiting=waiting), current, 0, 8)
    assert desired == want


@pytest.mark.parametrize("load, want", [
    (0.5, 2),   # one engine would let 3 in 10,000 wait longer than 10 s: two
    (1.0, 2),
    (10.0, 5),  # 50% full (the fill rule: 4)
    (30.0, 11),  # 68%: one over the fill rule's 10
])
def test_with_a_measured_slot_time_the_count_bounds_the_waits_erlang_c(load, want):
    scaling = LLMScaling(ttft_target_s=10.0)
    desired, why = llm_desired(scaling, signals(load=load, slot_s=21.0), 1, 0, 40)
    assert desired == want and "21s a request" in why
    unsized, _ = llm_desired(LLMScaling(ttft_target_s=None), signals(load=load, slot_s=21.0),
                             1, 0, 40)
    assert unsized == -(-load // 3)  # no target: the fill rule alone


def test_the_replicas_reported_load_is_the_demand_when_there_is_one():
    assert signals(running=9, waiting=3, load=4.0, held=1).demand == 5.0
    assert signals(running=9, waiting=3, held=1).demand == 13.0  # no reports: the engines'


def test_surge_sizes_for_a_multiple_of_the_level():
    level = Trend(level=6.0, growth_per_s=0.0)
    plain, _ = llm_desired(SCALING, signals(running=6), 2, 0, 8, trend=level)
    doubled, _ = llm_desired(LLMScaling(surge=1.0), signals(running=6), 2, 0, 8, trend=level)
    assert (plain, doubled) == (2, 4)


@pytest.mark.parametrize("fill", [0.3, 0.75, 1.0])
@pytest.mark.parametrize("running", [0, 1, 4, 7, 13])
@pytest.mark.parametrize("current", [1, 3, 6])
def test_never_below_what_the_running_streams_need(fill, running, current):
    desired, _ = llm_desired(LLMScaling(target_fill=fill), signals(running=running), current,
                             0, 8)
    assert desired >= -(-running // 4)  # ceil(running / slots): every stream keeps a slot


def test_kv_pressure_with_requests_waiting_asks_for_one_more():
    desired, why = llm_desired(SCALING, signals(running=5, waiting=1, kv=0.95), 2, 0, 8)
    assert desired == 3 and "KV cache 95% full with 1 waiting" in why
    calm, _ = llm_desired(SCALING, signals(running=5, waiting=0, kv=0.95), 2, 0, 8)
    assert calm == 2  # full cache, nobody waiting: the engines cope


def test_ttft_over_target_on_an_engine_asks_for_one_more():
    desired, why = llm_desired(SCALING, signals(running=4, over=1), 2, 0, 8)
    assert desired == 3 and "TTFT p90 over 2s on 1 engine(s)" in why


def test_a_slow_start_is_asked_for_early_from_the_demands_growth_near_capacity():
    level = Trend(level=7.0, growth_per_s=0.05)  # over 80% of 2 x 4 slots
    now, _ = llm_desired(SCALING, signals(running=6), 2, 0, 8, trend=level)
    early, why = llm_desired(SCALING, signals(running=6), 2, 0, 8, trend=level, start_s=120.0)
    assert (now, early) == (3, 5) and "13 in one start (120s)" in why
    # far from capacity (7 of 4 x 4 slots), a slope only would reset a downscale's delay
    far, _ = llm_desired(SCALING, signals(running=6), 4, 0, 8, trend=level, start_s=120.0)
    assert far == 3


def test_the_count_follows_the_level_not_the_last_read():
    calm = Trend(level=2.0, growth_per_s=0.0)
    assert llm_desired(SCALING, signals(running=9), 3, 0, 8, trend=calm)[0] == 3  # streams
    busy = Trend(level=9.0, growth_per_s=0.0)
    assert llm_desired(SCALING, signals(running=1), 6, 0, 8, trend=busy)[0] == 3  # 9 / 3
    idle = Trend(level=0.04, growth_per_s=0.0)  # under IDLE_LEVEL and nothing now: zero
    assert llm_desired(SCALING, signals(running=0), 1, 0, 8, trend=idle)[0] == 0
    assert llm_desired(SCALING, signals(running=1), 1, 0, 8, trend=idle)[0] == 1


def test_reported_requests_far_over_the_level_are_sized_for_at_once():
    level = Trend(level=9.0, growth_per_s=0.0)  # 3 sigmas over 9: 9 more
    chance, _ = llm_desired(SCALING, signals(running=12, load=17.0), 3, 0, 12, trend=level)
    surge, _ = llm_desired(SCALING, signals(running=12, load=19.0), 3, 0, 12, trend=level)
    assert (chance, surge) == (3, 7)  # 9 / 3; 19 / 3
    # an engine's single read is no evidence: only the replicas' averaged reports are
    read, _ = llm_desired(SCALING, signals(running=19), 3, 0, 12, trend=level)
    assert read == 5  # 19 running: the streams' floor, not a jump


def test_the_level_is_an_exponential_mean_and_the_slope_a_least_squares_fit():
    trend = DemandTrend(slope_over_s=300.0, level_over_s=120.0)
    for t in range(31):
        last = trend.add(float(t), 2.0 + 0.1 * t)
    assert last.growth_per_s == pytest.approx(0.1)
    assert 2.0 < last.level < 5.0  # it lags a ramp
    spiky = DemandTrend(slope_over_s=300.0, level_over_s=120.0)
    for t in range(31):
        last = spiky.add(float(t), 12.0 if t == 15 else 2.0)
    assert last.growth_per_s == pytest.approx(0.0, abs=0.02)
    assert last.level == pytest.approx(2.0 + 10.0 * (1 - math.exp(-1 / 120)) *
                                       math.exp(-15 / 120))  # one second of 12, decayed


def test_requests_held_at_zero_are_the_demand_that_wakes_it():
    desired, _ = llm_desired(SCALING, signals(engines=0, held=2, kv=None), 0, 0, 8)
    assert desired == 1


# ---- the board --------------------------------------------------------------------------

def test_the_board_sums_incrementally_forgets_and_drops_the_stale():
    board = EngineBoard()
    board.record("a", stats(4, 1, kv=0.5, ttft=3.0), 0.0, 2.0)
    board.record("b", stats(2, 0, kv=0.3, ttft=1.0), 0.0, 2.0)
    s = board.signals(1.0)
    assert (s.engines, s.running, s.waiting, s.slots, s.ttft_over) == (2, 6, 1, 4, 1)
    assert s.kv_cache_usage == pytest.approx(0.4)
    board.record("a", stats(1, 0, kv=0.1), 5.0, 2.0)  # replaced, not added
    assert (board.signals(5.0).running, board.signals(5.0).ttft_over) == (3, 0)
    board.forget("a")
    assert board.signals(5.0).engines == 1
    assert board.signals(STALE_AFTER_S + 1).engines == 0  # b fell silent: dropped
    assert board.signals(STALE_AFTER_S + 1).slots == 4  # the last slots are remembered
    with pytest.raises(ValueError):
        board.record("c", {"running": -1, "waiting": 0, "slots": 4}, 0.0, None)
    with pytest.raises(ValueError):
        board.record("c", {"waiting": 0}, 0.0, None)


def test_the_board_keeps_the_slot_time_weighted_by_finished_requests_through_zero():
    board = EngineBoard()
    assert board.slot_s is None
    board.record("a", {**stats(2), "finished": 3, "slot_s": 20.0}, 0.0, None)
    board.record("b", {**stats(2), "finished": 1, "slot_s": 40.0}, 0.0, None)
    # (3 x 20 x 0.95 + 40) / (3 x 0.95 + 1)
    assert board.slot_s == pytest.approx((57.0 + 40.0) / 3.85)
    assert board.signals(1.0).slot_s == board.slot_s
    board.forget("a"), board.forget("b")
    assert board.signals(2.0).slot_s == pytest.approx(97.0 / 3.85)  # kept through zero
    with pytest.raises(ValueError):
        board.record("c", {**stats(1), "finished": 1, "slot_s": -3}, 0.0, None)
    with pytest.raises(ValueError):
        board.record("c", {**stats(1), "finished": "x"}, 0.0, None)


# ---- the autoscaler over a recorded series ---------------------------------------------

CONFIG = {"min_replicas": 0, "max_replicas": 6, "initial_replicas": 2,
          "upscale_delay_s": 10.0, "downscale_delay_s": 120.0,
          "downscale_to_zero_delay_s": 300.0, "look_back_period_s": 30.0,
          "llm": {"target_fill": 0.75, "kv_cache_high": 0.9, "ttft_target_s": 2.0}}


def replay(series, start_s=None, target=2):
    """Feed ``series`` (one entry per second: {replica: stats}) to an autoscaler and
    apply its decisions; the targets it set, second by second."""
    scaler, targets = Autoscaler(CONFIG), []
    for t, engines in enumerate(series):
        for replica_id, s in engines.items():
            scaler.record_engine_stats(replica_id, s, float(t))
        decision = scaler.decide(float(t), target, engines.keys(), start_s=start_s)
        if decision is not None:
            target = decision.target_replicas
        targets.append(target)
    return targets


def test_a_sustained_surge_scales_up_as_the_level_rises_and_once_per_need():
    calm = [{"a": stats(3), "b": stats(3)}] * 20
    busy = [{"a": stats(4, 4, kv=0.6), "b": stats(4, 4, kv=0.6)}] * 1000  # 16: 6 replicas
    targets = replay(calm + busy)
    assert targets[19] == 2
    assert targets[20 + 8] == 2 and targets[20 + 10] == 3  # after upscale_delay_s
    ups = targets[20:]
    assert ups == sorted(ups) and ups[-1] == 6  # up only, to what 16 needs at 0.75
    assert ups.index(6) > 60  # the level took its time; once there, not asked again
    assert set(ups[ups.index(6):]) == {6}


def test_a_short_burst_does_not_scale_up():
    calm = [{"a": stats(2.5), "b": stats(2.5)}] * 20
    blip = [{"a": stats(4, 3), "b": stats(4, 3)}] * 5
    assert set(replay(calm + blip + calm * 10)) == {2}


def test_idle_scales_down_after_the_delay_then_to_zero_after_its_own():
    idle = [{"a": stats(0), "b": stats(0)}] * 600
    targets = replay(idle)
    assert targets[118] == 2 and targets[121] == 1  # many -> 1 at downscale_delay_s
    assert targets[121 + 298] == 1 and targets[121 + 301] == 0  # 1 -> 0 at its own


def test_replicas_still_loading_are_not_scaled_away_for_want_of_stats():
    assert set(replay([{}] * 400, target=2)) == {2}


def test_the_slope_is_fitted_over_its_own_window_through_the_engines_steps():
    trend = DemandTrend(slope_over_s=300.0)
    for t in range(0, 300, 40):  # the engines' stats: a step every 40 s, rising slowly
        for s in range(40):
            last = trend.add(float(t + s), 2.0 + t / 100)
    assert last.growth_per_s == pytest.approx(0.01, rel=0.1)  # 0.4 per 40 s step
