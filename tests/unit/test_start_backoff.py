"""Start backoff and the DEPLOY_FAILED budget: the pure value, exact times."""

from __future__ import annotations

import pytest

from controlplane.deployment.start_backoff import StartBackoff, StartBackoffPolicy

POLICY = StartBackoffPolicy(initial_s=0.5, max_s=4.0, max_retries=3)
T0 = 100.0


def fail(backoff: StartBackoff, times: int, now: float = T0, target: int = 1) -> StartBackoff:
    for _ in range(times):
        backoff = backoff.with_failure("boom", now, target, POLICY)
    return backoff


def test_a_fresh_deployment_is_not_blocked() -> None:
    backoff = StartBackoff()
    assert not backoff.blocked(T0) and not backoff.expired(T0)


@pytest.mark.parametrize("failures, delay_s", [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)])
def test_the_hold_doubles_per_consecutive_failure_up_to_the_cap(failures: int,
                                                                delay_s: float) -> None:
    backoff = fail(StartBackoff(), failures, target=10)
    assert backoff.until == T0 + delay_s
    assert backoff.blocked(T0 + delay_s - 0.01) and not backoff.blocked(T0 + delay_s)


def test_an_expired_hold_is_seen_once_then_cleared() -> None:
    backoff = fail(StartBackoff(), 1)
    assert not backoff.expired(T0 + 0.4) and backoff.expired(T0 + 0.5)
    cleared = backoff.with_expired()
    assert not cleared.expired(T0 + 0.5) and cleared.failures == 1


@pytest.mark.parametrize("target, failures_to_fail", [(0, 3), (1, 3), (2, 6)])
def test_the_budget_is_retries_per_target_replica(target: int, failures_to_fail: int) -> None:
    assert not fail(StartBackoff(), failures_to_fail - 1, target=target).deploy_failed
    failed = fail(StartBackoff(), failures_to_fail, target=target)
    assert failed.deploy_failed and failed.blocked(T0 + 3600)


def test_a_started_replica_ends_the_streak_but_not_a_verdict() -> None:
    backoff = fail(StartBackoff(), 3).with_started()
    assert (backoff.failures, backoff.last_error, backoff.deploy_failed) == (0, "", True)
    assert fail(StartBackoff(), 1).with_started().until == T0 + 0.5


def test_the_newest_message_is_kept_and_a_reconfigure_error_counts_nothing() -> None:
    backoff = StartBackoff().with_failure("first", T0, 5, POLICY)
    backoff = backoff.with_failure("second", T0, 5, POLICY)
    assert backoff.last_error == "second"
    shown = backoff.with_error("reconfigure raised")
    assert (shown.last_error, shown.failures, shown.until) == ("reconfigure raised", 2, T0 + 1.0)
