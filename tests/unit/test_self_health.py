"""Replica self-health: half-period schedule, period-based count, latch, timeouts, cache.

No Ray, no real sleeps: the tests run on a virtual-time event loop over a FakeClock
(``tests.unit.virtual_time``), so the half-period wait and the check timeout are ordinary
``asyncio.sleep`` calls that end when the test's own sleep moves virtual time past them.
``wait_all_tasks_blocked`` lets every ready task run without moving time, however many
``await``s the code under test takes.
"""

from __future__ import annotations

import asyncio
import logging
import pickle

import pytest

from controlplane.clock import FakeClock
from replicas.self_health import HealthCheckFailed, SelfHealth
from tests.unit.virtual_time import run_virtual, wait_all_tasks_blocked

T0 = 1000.0
PERIOD = 10.0
TIMEOUT = 30.0


class UserCheck:
    """The user's check_health: records when it ran; fails, hangs or passes on demand."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[float] = []
        self.fail_with: BaseException | None = None
        self.hang = False
        self.cancelled = 0

    async def __call__(self) -> None:
        self.calls.append(self.clock.monotonic())
        if self.hang:
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.fail_with is not None:
            raise self.fail_with


async def advance(seconds: float) -> None:
    """Move virtual time on by ``seconds``, then let everything due by then finish."""
    await asyncio.sleep(seconds)
    await wait_all_tasks_blocked()


def make(clock: FakeClock, check, **kw) -> SelfHealth:
    return SelfHealth(check, period_s=PERIOD, timeout_s=TIMEOUT, clock=clock,
                      unhealthy_threshold=3, **kw)


def run(main) -> None:
    """Run ``main(clock, check)`` on a virtual-time loop starting at T0."""
    clock = FakeClock(T0)
    run_virtual(clock, lambda: main(clock, UserCheck(clock)))


# --- schedule ---------------------------------------------------------------------------


def test_runs_the_user_check_every_half_period():
    async def main(clock, check):
        health = make(clock, check)
        task = asyncio.get_running_loop().create_task(health.run_forever())
        await advance(20.0)
        assert check.calls == [T0, T0 + 5, T0 + 10, T0 + 15, T0 + 20]
        assert health.running
        task.cancel()
        await wait_all_tasks_blocked()
        assert not health.running

    run(main)


def test_snapshot_carries_checked_at_and_reports_results():
    async def main(clock, check):
        seen = []
        health = make(clock, check, on_result=seen.append)
        assert health.snapshot().checked_at is None
        await health.evaluate_once(clock.monotonic())
        snap = health.snapshot()
        assert (snap.healthy, snap.checked_at, snap.consecutive_failures) == (True, T0, 0)
        assert seen == [snap]

    run(main)


# --- the period-based count and the latch ----------------------------------------------------


def test_failure_count_advances_once_per_period_not_per_evaluation():
    # Seed 000 review fix: "The failure count advances once per configured period, not once
    # per eval." Counting every half-period evaluation would read 3 (latched) at T0+10.
    async def main(clock, check):
        check.fail_with = RuntimeError("db down")
        health = make(clock, check)
        counts = []
        for offset in (0.0, 4.9, 9.8, 14.8, 19.9):  # half-period cadence with jitter
            await asyncio.sleep(T0 + offset - clock.monotonic())
            counts.append((await health.evaluate_once(clock.monotonic())).consecutive_failures)
        assert counts == [1, 1, 2, 2, 3]
        assert health.snapshot().latched

    run(main)


def test_success_resets_the_count():
    async def main(clock, check):
        health = make(clock, check)
        check.fail_with = RuntimeError("x")
        await health.evaluate_once(clock.monotonic())
        check.fail_with = None
        await advance(5.0)
        snap = await health.evaluate_once(clock.monotonic())
        assert (snap.healthy, snap.consecutive_failures, snap.last_error) == (True, 0, "")

    run(main)


def test_latch_stops_the_user_check_and_keeps_reporting_unhealthy():
    async def main(clock, check):
        check.fail_with = RuntimeError("db down")
        health = make(clock, check)
        for _ in range(3):
            await health.evaluate_once(clock.monotonic())
            await advance(PERIOD)
        latched = health.snapshot()
        assert latched.latched and latched.consecutive_failures == 3
        calls = len(check.calls)
        check.fail_with = None  # the check would pass now: the latch must not care
        for _ in range(4):
            assert await health.evaluate_once(clock.monotonic()) == latched
            await advance(PERIOD / 2)
        assert len(check.calls) == calls
        with pytest.raises(HealthCheckFailed, match="db down"):
            health.check_cached()

    run(main)


# --- timeouts and cancellation ---------------------------------------------------------------


def test_timed_out_check_is_cancelled_marked_unhealthy_and_logged(caplog):
    # Seed 000 review fix: a timed-out self-check logs its cause and is unhealthy.
    async def main(clock, check):
        check.hang = True
        health = make(clock, check)
        evaluation = asyncio.get_running_loop().create_task(
            health.evaluate_once(clock.monotonic()))
        await advance(TIMEOUT - 1)
        assert not evaluation.done() and health.snapshot().healthy
        await advance(1.0)
        snap = await evaluation
        assert not snap.healthy and snap.consecutive_failures == 1
        assert "timed out after 30.0s" in snap.last_error
        assert check.cancelled == 1

    with caplog.at_level(logging.WARNING):
        run(main)
    assert "timed out after 30.0s" in caplog.text


def test_check_raising_cancelled_error_is_unhealthy_not_a_crash(caplog):
    # Seed 000 review fix: "CancelledError is not an Exception, so the cached result also
    # stayed healthy". An `except Exception` path would let this escape, healthy.
    async def main(clock, check):
        check.fail_with = asyncio.CancelledError()
        health = make(clock, check)
        snap = await health.evaluate_once(clock.monotonic())
        assert not snap.healthy and "cancelled" in snap.last_error
        with pytest.raises(HealthCheckFailed):
            health.check_cached()

    with caplog.at_level(logging.WARNING):
        run(main)
    assert "CancelledError" in caplog.text


def test_a_check_ignoring_cancellation_is_not_run_beside_itself():
    async def main(clock, check):
        release = asyncio.get_running_loop().create_future()

        async def stubborn() -> None:
            check.calls.append(clock.monotonic())
            while not release.done():
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    continue  # swallows the timeout's cancellation

        health = make(clock, stubborn)
        evaluation = asyncio.get_running_loop().create_task(
            health.evaluate_once(clock.monotonic()))
        await advance(TIMEOUT)
        assert not (await evaluation).healthy  # the wedged check did not wedge us
        await advance(PERIOD)
        snap = await health.evaluate_once(clock.monotonic())
        assert len(check.calls) == 1
        assert snap.consecutive_failures == 2 and "still running" in snap.last_error
        release.set_result(None)
        await wait_all_tasks_blocked()

    run(main)


def test_own_cancellation_propagates_without_a_verdict():
    async def main(clock, check):
        check.hang = True
        health = make(clock, check)
        evaluation = asyncio.get_running_loop().create_task(
            health.evaluate_once(clock.monotonic()))
        await wait_all_tasks_blocked()
        evaluation.cancel()
        with pytest.raises(asyncio.CancelledError):
            await evaluation
        await wait_all_tasks_blocked()
        assert check.cancelled == 1
        assert health.snapshot().checked_at is None  # shutdown is not a health result

    run(main)


# --- remote probes, initialization, recovery ---------------------------------------------------


def test_remote_probes_answer_the_cache_while_the_task_runs():
    async def main(clock, check):
        health = make(clock, check)
        task = asyncio.get_running_loop().create_task(health.run_forever())
        await wait_all_tasks_blocked()
        assert len(check.calls) == 1
        await asyncio.gather(*(health.check_for_probe() for _ in range(10)))
        assert len(check.calls) == 1  # concurrent probes never re-run the user check
        check.fail_with = RuntimeError("bad")
        await advance(PERIOD / 2)
        with pytest.raises(HealthCheckFailed, match="bad"):
            await health.check_for_probe()
        assert len(check.calls) == 2
        task.cancel()
        await wait_all_tasks_blocked()

    run(main)


def test_fresh_check_bypasses_a_cached_failure():
    # The seed's High Severity finding (Cursor Bugbot): recovery and initialization awaited
    # the cached result, so one recent failed self-check failed a live replica that a fresh
    # check passes. check_fresh must run the user check, not answer the cache.
    async def main(clock, check):
        health = make(clock, check)
        task = asyncio.get_running_loop().create_task(health.run_forever())
        check.fail_with = RuntimeError("blip")
        await wait_all_tasks_blocked()
        with pytest.raises(HealthCheckFailed):
            health.check_cached()
        check.fail_with = None
        await health.check_fresh()  # passes: it ran the user check
        assert len(check.calls) == 2
        assert health.snapshot().healthy
        task.cancel()
        await wait_all_tasks_blocked()

    run(main)


def test_fresh_check_raises_its_own_failure():
    async def main(clock, check):
        health = make(clock, check)
        check.fail_with = ValueError("model not loaded")
        with pytest.raises(HealthCheckFailed, match="model not loaded"):
            await health.check_fresh()

    run(main)


def test_probe_without_the_task_runs_a_fresh_check():
    async def main(clock, check):
        health = make(clock, check)
        with pytest.raises(HealthCheckFailed, match="no health check"):
            health.check_cached()
        await health.check_for_probe()
        await health.check_for_probe()
        assert len(check.calls) == 2

    run(main)


def test_health_check_failed_pickles_and_bad_settings_raise():
    err = pickle.loads(pickle.dumps(HealthCheckFailed("boom")))
    assert err.message == "boom"
    with pytest.raises(ValueError):
        SelfHealth(UserCheck(FakeClock()), period_s=0, timeout_s=1, clock=FakeClock())


def test_new_timings_apply_from_the_next_evaluation():
    async def main(clock, check):
        health = make(clock, check)
        task = asyncio.get_running_loop().create_task(health.run_forever())
        await advance(5.0)
        health.set_timings(period_s=2.0, timeout_s=1.0)  # redeployed in place
        await advance(7.0)  # the wait already armed ends at T0+10, then every 1 s
        assert check.calls == [T0, T0 + 5, T0 + 10, T0 + 11, T0 + 12]
        with pytest.raises(ValueError):
            health.set_timings(period_s=0.0, timeout_s=1.0)
        task.cancel()
        await wait_all_tasks_blocked()

    run(main)
