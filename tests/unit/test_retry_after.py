"""retry_after: seed 002's router_queue_drain_rate policy and the static fallback, as pure
functions of (queue depth, estimator, occupancy, backoff streak, static value, rng, now)."""

from __future__ import annotations

import math
import random

import pytest

from controlplane.routing.retry_after import (DrainRateEstimator, check_policy,
                                              compute_retry_after_s, retry_after_s,
                                              saturation_factor, static_retry_after_s)

T0 = 1000.0


class FixedJitter(random.Random):
    """An rng whose jitter multiplier is chosen by the test (the policy's rng seam)."""

    def __init__(self, multiplier: float = 1.0) -> None:
        super().__init__(0)
        self.multiplier = multiplier

    def uniform(self, a: float, b: float) -> float:
        assert (a, b) == (0.8, 1.2)  # seed 002: +-20%
        return self.multiplier


def warm(rate_per_s: int, intervals: int = 3, start: float = T0) -> DrainRateEstimator:
    """An estimator fed ``rate_per_s`` assignments in each of ``intervals`` 1 s intervals."""
    est = DrainRateEstimator()
    for i in range(intervals):
        for k in range(rate_per_s):
            est.record_assignment(start + i + k / rate_per_s)
    return est


def compute(depth: int, est: DrainRateEstimator, now: float, occupancy: float = 0.0,
            streak: int = 0, static_s: float | None = None, jitter: float = 1.0) -> int | None:
    return compute_retry_after_s(depth, est, occupancy, streak, static_s, FixedJitter(jitter), now)


# -- saturation factor ---------------------------------------------------------------------


@pytest.mark.parametrize("occupancy, streak, expected", [
    (0.0, 0, 1.0),
    (1.0, 0, 1.25),
    (0.0, 5, 1.25),
    (1.0, 5, 1.5),
    (0.5, 2, 1.0 + 0.25 * 0.5 + 0.25 * 0.4),
    (3.0, 50, 1.5),  # both terms saturate: bounded to [1, 1.5]
    (-1.0, -2, 1.0),
])
def test_saturation_factor(occupancy: float, streak: int, expected: float) -> None:
    assert saturation_factor(occupancy, streak) == pytest.approx(expected)


# -- drain-rate EWMA -------------------------------------------------------------------------


def test_estimator_is_cold_until_three_intervals_with_traffic() -> None:
    est = warm(10, intervals=2)
    assert est.rate_per_s(T0 + 2.5) is None  # only two intervals closed with traffic
    est.record_assignment(T0 + 2.5)
    assert est.rate_per_s(T0 + 3.0) == pytest.approx(0.3 * 1 + 0.7 * 10)


def test_estimator_seeds_with_first_sample_then_averages() -> None:
    est = warm(10, intervals=3)
    # The first interval seeds the EWMA (10/s), later ones average in with alpha 0.3.
    assert est.rate_per_s(T0 + 3.0) == pytest.approx(10.0)
    for k in range(20):
        est.record_assignment(T0 + 3 + k / 20)
    assert est.rate_per_s(T0 + 4.0) == pytest.approx(0.3 * 20 + 0.7 * 10)


def test_estimator_decays_over_empty_intervals_in_one_step() -> None:
    est = warm(10, intervals=3)
    # T0+3 closes nothing new; by T0+5.5 two empty intervals closed: rate * 0.7**2.
    assert est.rate_per_s(T0 + 5.5) == pytest.approx(10.0 * 0.7 ** 2)


def test_estimator_goes_cold_after_ten_idle_seconds_and_rewarms() -> None:
    est = warm(10, intervals=3)
    last = T0 + 2 + 9 / 10
    assert est.rate_per_s(last + 10.0) is not None
    assert est.rate_per_s(last + 10.01) is None
    est.record_assignment(last + 20)  # a burst after idling starts from scratch
    assert est.rate_per_s(last + 22) is None


# -- computed policy -------------------------------------------------------------------------


def test_formula_depth_over_rate_times_saturation() -> None:
    est = warm(4)
    now = T0 + 3.0
    # 10 queued / 4 per s = 2.5 s; x (1 + .25*1 + .25*2/5) = 1.35 -> 3.375 -> 4
    assert compute(10, est, now, occupancy=1.0, streak=2) == 4
    # 12 / 4 = 3.0 exactly: delay-seconds round up, but never past an exact integer
    assert compute(12, est, now) == 3


@pytest.mark.parametrize("jitter, expected", [(0.8, 8), (1.2, 12), (1.0, 10), (1.01, 11)])
def test_jitter_is_applied_before_rounding_up(jitter: float, expected: int) -> None:
    est = warm(4)
    assert compute(40, est, T0 + 3.0, jitter=jitter) == expected


def test_jitter_stays_within_twenty_percent_with_a_seeded_rng() -> None:
    est = warm(4)
    rng = random.Random(7)
    values = {compute_retry_after_s(40, est, 0.0, 0, None, rng, T0 + 3.0) for _ in range(500)}
    assert values <= set(range(8, 13))  # 10 s +-20%, rounded up
    assert len(values) >= 4  # and it does spread: routers do not agree to the second


@pytest.mark.parametrize("depth, expected", [(0, 1), (1, 1), (10_000, 60)])
def test_clamped_to_one_and_sixty_seconds(depth: int, expected: int) -> None:
    assert compute(depth, warm(4), T0 + 3.0, occupancy=1.0, streak=5, jitter=1.2) == expected


def test_fallback_ladder_cold_then_static_then_none() -> None:
    cold = warm(4, intervals=1)
    assert compute(10, cold, T0 + 1.0, static_s=2.5) == 3  # static, rounded up
    assert compute(10, cold, T0 + 1.0, static_s=None) is None  # no header
    assert compute(10, warm(4), T0 + 3.0, static_s=2.5) == 3  # computed: 2.5 -> 3
    assert compute(10, warm(4), T0 + 3.0, static_s=50) == 3  # computed wins when warm


def test_a_zero_rate_falls_back_instead_of_dividing_by_zero() -> None:
    est = DrainRateEstimator(min_warm_intervals=1, stale_after_s=math.inf)
    est.record_assignment(T0)
    # 1 s of traffic, then 4999 empty intervals: 0.7 ** 4999 underflows to exactly 0.
    assert compute(5, est, T0 + 5000.0, static_s=7) == 7
    assert compute(5, DrainRateEstimator(), T0, static_s=7) == 7


# -- static policy and policy selection ------------------------------------------------------


@pytest.mark.parametrize("static_s, expected", [(None, None), (0.2, 1), (2.0, 2), (2.01, 3)])
def test_static_value_is_rounded_up(static_s: float | None, expected: int | None) -> None:
    assert static_retry_after_s(static_s) == expected


def test_static_policy_ignores_a_warm_estimator() -> None:
    est = warm(4)
    args = dict(queue_depth=40, estimator=est, occupancy=1.0, backoff_streak=0, static_s=2.5,
                rng=FixedJitter(), now=T0 + 3.0)
    assert retry_after_s("static", **args) == 3
    assert retry_after_s("router_queue_drain_rate", **args) == 13  # 10 * 1.25 -> 12.5 -> 13


def test_unknown_policy_names_the_field() -> None:
    assert check_policy("router_queue_drain_rate") == "router_queue_drain_rate"
    with pytest.raises(ValueError, match="backpressure_config.retry_after_policy.*'auto'"):
        check_policy("auto")


# -- arrival_aware (issue 14) ---------------------------------------------------------------


def aware(depth: int, drain: DrainRateEstimator, arrivals: DrainRateEstimator,
          schedule, now: float, static_s: float | None = 5.0) -> int | None:
    return retry_after_s("arrival_aware", depth, drain, 0.0, 0, static_s, FixedJitter(1.0),
                         now, arrivals=arrivals, schedule=schedule)


def test_arrival_aware_falls_back_while_the_drain_rate_is_cold() -> None:
    from controlplane.routing.retry_after import RetrySchedule

    cold = DrainRateEstimator()
    assert aware(4, cold, warm(20), RetrySchedule(), T0 + 3) == 5
    assert aware(4, cold, warm(20), RetrySchedule(), T0 + 3, static_s=None) is None


def test_under_sustained_overload_retries_are_spread_and_then_told_later() -> None:
    """Drain 4/s, arrivals 20/s: the room per second is the floor (1 of 4), so rejected
    clients are spread one per second from when their queue place comes up, and once
    every second to the clamp is booked they are told 60."""
    from controlplane.routing.retry_after import RetrySchedule

    drain, arrivals, schedule = warm(4), warm(20), RetrySchedule()
    now = T0 + 3.0
    values = [aware(4, drain, arrivals, schedule, now) for _ in range(80)]
    assert values[:3] == [1, 2, 3]  # 4 queued / 4 per s: from 1 s on, one per second
    assert values[:60] == list(range(1, 61))
    assert set(values[60:]) == {60}  # full to the clamp: "later"


def test_with_room_left_by_the_arrivals_several_retries_share_a_second() -> None:
    from controlplane.routing.retry_after import RetrySchedule

    drain, arrivals, schedule = warm(8), warm(2), RetrySchedule()  # 6/s of room
    values = [aware(8, drain, arrivals, schedule, T0 + 3.0) for _ in range(12)]
    assert values == [1] * 6 + [2] * 6


def test_booked_seconds_move_with_time() -> None:
    from controlplane.routing.retry_after import RetrySchedule

    drain, arrivals, schedule = warm(4), warm(20), RetrySchedule()
    assert [aware(0, drain, arrivals, schedule, T0 + 3.0) for _ in range(3)] == [1, 2, 3]
    # Two seconds later, what was booked at +3 is now at +1: the next is past it.
    assert aware(0, drain, arrivals, schedule, T0 + 5.0) == 2


class Broken(DrainRateEstimator):
    def __init__(self, value) -> None:
        super().__init__()
        self.value = value

    def rate_per_s(self, now: float):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


@pytest.mark.parametrize("drain, arriving", [
    (float("nan"), 3.0), (float("inf"), 3.0), (0.0, 3.0), (-2.0, 3.0),
    (4.0, float("nan")), (4.0, float("inf")), (4.0, -5.0), (RuntimeError("bug"), 3.0),
    (4.0, RuntimeError("bug")), (1e-300, 3.0)])
def test_the_rejection_path_never_raises_whatever_the_estimators_hold(drain, arriving) -> None:
    from controlplane.routing.retry_after import RetrySchedule

    value = aware(10**9, Broken(drain), Broken(arriving), RetrySchedule(), T0)
    assert value == 5 or 1 <= value <= 60
