"""The ``foresight`` yardstick of ``release_tests.llm_autoscale``: the Erlang bound on the
day's true rate, asked for one longest load ahead of the rate it is for."""

from release_tests.llm_autoscale_foresight import ForesightPolicy, foresight_settings
from release_tests.llm_autoscale_sim import SLOT_S, SLOTS, day_rate, day_trace

HOUR = 3600.0


def policy(first_hour=0, late_share=None):
    return ForesightPolicy(foresight_settings(first_hour, HOUR, 0.5, 12, 300.0, late_share),
                           SLOTS, SLOT_S)


def test_the_rate_is_the_one_the_trace_is_drawn_at():
    assert day_rate(3, 0.0, HOUR, 0.5) == 0.0
    assert day_rate(9, 0.0, HOUR, 0.5) == 0.5
    assert day_rate(10, 0.3 * HOUR + 1, HOUR, 0.5) == 1.0  # the 10:18 burst
    assert day_rate(10, 0.3 * HOUR + 601, HOUR, 0.5) == 0.5
    arrivals = [r.at_s for r in day_trace(7, (10, 11), HOUR, 0.5)]
    in_burst = sum(0.3 * HOUR <= t < 0.3 * HOUR + 600 for t in arrivals)
    assert 450 < in_burst < 750  # 600 expected at 1/s; the hour's other 3,000 s at 0.5/s
    assert 1200 < len(arrivals) - in_burst < 1800


def test_replicas_are_asked_for_a_longest_load_ahead_and_none_at_night():
    foresight = policy()
    assert foresight(None, 3 * HOUR, []) == 0
    assert foresight(None, 6 * HOUR - 301, []) == 0
    assert foresight(None, 6 * HOUR - 290, []) >= 1  # 6:00's first requests, ahead
    steady = foresight(None, 9.5 * HOUR, [])
    burst_at = 10 * HOUR + 0.3 * HOUR
    assert foresight(None, burst_at - 400, []) == steady
    assert foresight(None, burst_at - 290, []) > steady  # the burst's, before it starts
    assert policy(first_hour=10)(None, 0.3 * HOUR - 290, []) > steady  # hours counted from 10


def test_a_tighter_bound_asks_for_more():
    assert policy(late_share=1e-5)(None, 9.5 * HOUR, []) > \
        policy(late_share=1e-2)(None, 9.5 * HOUR, [])
