"""ErrorBackoff: pure transitions, exact times, no clock and no Ray."""

from __future__ import annotations

import random

import pytest

from controlplane.routing.backoff import ErrorBackoff

T0 = 1000.0
BOOM = "ValueError: boom"


def failed(backoff: ErrorBackoff, times: int, now: float = T0,
           text: str = BOOM) -> ErrorBackoff:
    for _ in range(times):
        backoff = backoff.with_failure(now, text)
    return backoff


class TopOfRange(random.Random):
    """Jitter at its upper bound (factor 1): the nominal delay."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_fresh_backoff_is_due_and_not_failing():
    backoff = ErrorBackoff()
    assert backoff.due(0.0) and not backoff.failing and backoff.last_error is None


def test_waits_double_from_initial_up_to_the_cap():
    backoff = ErrorBackoff(initial_s=0.1, max_s=30.0)
    waits = []
    for _ in range(12):
        backoff = backoff.with_failure(T0, BOOM)
        waits.append(round(backoff.retry_at - T0, 9))
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]


def test_due_exactly_at_retry_at():
    backoff = ErrorBackoff(initial_s=0.5, max_s=10.0).with_failure(T0, BOOM)
    assert not backoff.due(T0) and not backoff.due(T0 + 0.49)
    assert backoff.due(T0 + 0.5)


def test_one_success_resets_the_wait():
    backoff = failed(ErrorBackoff(initial_s=0.1, max_s=30.0), 9).cleared()
    assert backoff.due(T0) and not backoff.failing
    assert backoff.with_failure(T0, BOOM).retry_at == pytest.approx(T0 + 0.1)


def test_many_failures_stay_at_the_cap_without_overflow():
    backoff = ErrorBackoff(initial_s=0.1, max_s=30.0)
    assert backoff.delay_s(10_000) == 30.0
    assert failed(backoff, 2000).retry_at == T0 + 30.0


def test_an_error_is_new_only_when_its_text_changes():
    backoff = ErrorBackoff()
    assert backoff.is_new(BOOM)
    backoff = backoff.with_failure(T0, BOOM)
    assert not backoff.is_new(BOOM)
    assert backoff.is_new("KeyError: 'x'")


def test_the_last_error_outlives_a_success_so_a_returning_error_is_not_new():
    backoff = failed(ErrorBackoff(), 3).cleared()
    assert backoff.last_error == BOOM and not backoff.is_new(BOOM)


def test_a_streak_is_logged_when_it_had_a_new_error():
    first = failed(ErrorBackoff(), 3)
    assert first.logged
    assert not first.cleared().logged
    returning = first.cleared().with_failure(T0, BOOM)
    assert not returning.logged  # the same error again: its streak was not worth a line
    assert returning.with_failure(T0, "KeyError: 'x'").logged


def test_jitter_only_shortens_a_wait_within_its_fraction():
    backoff = ErrorBackoff(initial_s=1.0, max_s=10.0, jitter=0.2)
    rng = random.Random(7)
    for _ in range(50):
        wait = backoff.with_failure(T0, BOOM, rng).retry_at - T0
        assert 0.8 <= wait <= 1.0
    for failures in range(1, 21):  # up to the cap and past it: max_s stays a true bound
        backoff = backoff.with_failure(T0, BOOM, rng)
        nominal = backoff.delay_s(failures)
        assert 0.8 * nominal <= backoff.retry_at - T0 <= nominal <= 10.0


def test_jitter_takes_its_draw_from_the_rng():
    backoff = ErrorBackoff(initial_s=1.0, max_s=10.0, jitter=0.2)
    assert backoff.with_failure(T0, BOOM, TopOfRange()).retry_at == T0 + 1.0


def test_jitter_without_an_rng_is_refused():
    with pytest.raises(ValueError, match="rng"):
        ErrorBackoff(jitter=0.1).with_failure(T0, BOOM)


@pytest.mark.parametrize("kwargs", [
    {"initial_s": 0.0}, {"initial_s": 5.0, "max_s": 1.0}, {"jitter": 1.0}, {"jitter": -0.1},
])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        ErrorBackoff(**kwargs)
