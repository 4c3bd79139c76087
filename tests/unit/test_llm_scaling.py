"""The LLM autoscaling policy (``autoscaling_config.llm``): pure decisions over engine
stats, and the autoscaler driving it over recorded series of what engines report.
No Ray, no clock: times are passed in."""

from __future__ import annotations

import pytest

from controlplane.deployment.autoscaler import Autoscaler
from controlplane.deployment.llm_scaling import (DemandTrend, EngineBoard, LLMScaling,
                                                 LLMSignals, STALE_AFTER_S, Trend,
                                                 llm_desired)

SCALING = LLMScaling(target_fill=0.75, kv_cache_high=0.9, ttft_target_s=2.0)


def signals(engines=2, running=0.0, waiting=0.0, slots=4.0, kv=0.2, over=0, held=0):
    return LLMSignals(engines, running, waiting, slots, kv, over, held)


def stats(running, waiting=0, slots=4, kv=0.2, ttft=None):
    out = {"running": running, "waiting": waiting, "slots": slots, "kv_cache_usage": kv}
    if ttft is not None:
        out["ttft_p90_s"] = ttft
    return out


# ---- the count ------------------------------------------------------------------------

@pytest.mark.parametrize("running, waiting, current, want", [
    (6, 0, 2, 2),    # 6 of 2 x 4 slots x 0.75 = 6: steady
    (8, 4, 2, 4),    # 12 / 3 per replica
    (3, 0, 2, 2),    # 3 fits one at 0.75, but not at the 0.8 band: stay (hysteresis)
    (2, 0, 2, 1),    # 2 <= 3 x 0.8: one is enough
    (0, 0, 2, 0),    # nothing at all: zero (the floor is min_replicas)
])
def test_demand_over_slots_at_the_target_fill(running, waiting, current, want):
    desired, _ = llm_desired(SCALING, signals(running=running, waiting=waiting), current, 0, 8)
    assert desired == want


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


def test_a_slow_start_is_asked_for_early_from_the_demands_growth():
    now, _ = llm_desired(SCALING, signals(running=6), 2, 0, 8)
    early, why = llm_desired(SCALING, signals(running=6), 2, 0, 8,
                             trend=Trend(peak=6, growth_per_s=0.05), start_s=120.0)
    assert (now, early) == (2, 4) and "12 in one start (120s)" in why


def test_a_downscale_holds_the_look_backs_peak_and_growth_never_holds_it_back():
    trend = Trend(peak=9, growth_per_s=0.0)
    assert llm_desired(SCALING, signals(running=2), 6, 0, 8, trend=trend)[0] == 4  # 9 / 2.4
    rising = Trend(peak=2, growth_per_s=0.001)  # a tiny slope: down goes on
    assert llm_desired(SCALING, signals(running=2), 6, 0, 8, trend=rising, start_s=120)[0] == 1


def test_the_trend_is_a_least_squares_slope_and_a_window_peak():
    trend = DemandTrend(look_back_s=30.0)
    for t in range(31):
        last = trend.add(float(t), 2.0 + 0.1 * t)
    assert last.growth_per_s == pytest.approx(0.1) and last.peak == pytest.approx(5.0)
    spiky = DemandTrend(look_back_s=30.0)
    for t in range(31):
        last = spiky.add(float(t), 12.0 if t == 15 else 2.0)
    assert last.growth_per_s == pytest.approx(0.0, abs=1e-9) and last.peak == 12.0
    for t in range(31, 50):  # the spike leaves the window
        last = spiky.add(float(t), 2.0)
    assert last.peak == 2.0


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


def test_a_sustained_ramp_scales_up_after_the_delay_and_once_per_need():
    calm = [{"a": stats(3), "b": stats(3)}] * 20
    busy = [{"a": stats(4, 4, kv=0.6), "b": stats(4, 4, kv=0.6)}] * 60  # 16: 6 replicas
    targets = replay(calm + busy)
    assert targets[19] == 2
    assert targets[20 + 9] == 2 and targets[20 + 11] == 6  # after upscale_delay_s
    assert set(targets[20 + 11:]) == {6}  # the starting replicas count: not asked twice


def test_a_short_burst_does_not_scale_up():
    calm = [{"a": stats(3), "b": stats(3)}] * 20
    blip = [{"a": stats(4, 3), "b": stats(4, 3)}] * 5
    assert set(replay(calm + blip + calm)) == {2}


def test_idle_scales_down_after_the_delay_then_to_zero_after_its_own():
    idle = [{"a": stats(0), "b": stats(0)}] * 600
    targets = replay(idle)
    assert targets[118] == 2 and targets[121] == 1  # many -> 1 at downscale_delay_s
    assert targets[121 + 298] == 1 and targets[121 + 301] == 0  # 1 -> 0 at its own


def test_replicas_still_loading_are_not_scaled_away_for_want_of_stats():
    assert set(replay([{}] * 400, target=2)) == {2}


def test_the_slope_is_fitted_over_its_own_longer_window_the_peak_over_the_look_back():
    trend = DemandTrend(look_back_s=30.0, slope_over_s=300.0)
    for t in range(0, 300, 40):  # the engines' stats: a step every 40 s, rising slowly
        for s in range(40):
            last = trend.add(float(t + s), 2.0 + t / 100)
    assert last.growth_per_s == pytest.approx(0.01, rel=0.1)  # 0.4 per 40 s step
    assert last.peak == pytest.approx(2.0 + 280 / 100)
