"""The replica's composed push health: fresh check at start, cached probes, heartbeats.

No Ray: ``ReplicaHealth`` gets a FakeClock, a scripted user check and a fake heartbeat
sender through its constructor, and runs on a virtual-time loop over the same clock
(``tests.unit.virtual_time``), so times below are exact.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlplane.clock import FakeClock
from controlplane.wire import PushedHealth
from replicas.replica_health import ReplicaHealth
from replicas.self_health import HealthCheckFailed
from tests.unit.virtual_time import run_virtual, wait_all_tasks_blocked

T0 = 1000.0
PERIOD = 10.0
HEARTBEATS = 30.0  # a report interval longer than the period: heartbeats fill the gap
REPORTS = 1.0  # reports at least once a period carry health: no routine heartbeats


class UserCheck:
    """The user's check_health: records when it ran; fails, or waits on ``gate``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[float] = []
        self.fail_with: BaseException | None = None
        self.gate: asyncio.Future | None = None

    async def __call__(self) -> None:
        self.calls.append(self.clock.monotonic())
        if self.gate is not None:
            await self.gate
        if self.fail_with is not None:
            raise self.fail_with


class FakeShard:
    """The heartbeat sender: records (time, payload); holds or fails sends on demand."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, PushedHealth]] = []
        self.hold = False
        self.fail_with: BaseException | None = None
        self.cancelled = 0
        self._held: list[asyncio.Future] = []

    async def send(self, payload: PushedHealth) -> None:
        self.sent.append((self.clock.monotonic(), payload))
        if self.fail_with is not None:
            raise self.fail_with
        if self.hold:
            held = asyncio.get_running_loop().create_future()
            self._held.append(held)
            try:
                await held
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    def release(self) -> None:
        for held in self._held:
            held.set_result(None)
        self._held.clear()

    def times(self) -> list[float]:
        return [at for at, _ in self.sent]


class Fixture:
    def __init__(self, report_interval_s: float) -> None:
        self.clock = FakeClock(T0)
        self.check = UserCheck(self.clock)
        self.shard = FakeShard(self.clock)
        self.health = ReplicaHealth(
            self.check, clock=self.clock, send_heartbeat=self.shard.send,
            replica_id="r1", shard_name="shard-0", period_s=PERIOD, timeout_s=30.0,
            unhealthy_threshold=3, report_interval_s=report_interval_s)

    def run(self, main) -> None:
        async def wrapped() -> None:
            try:
                await main()
            finally:
                self.health.stop()

        run_virtual(self.clock, wrapped)


async def advance(seconds: float) -> None:
    """Move virtual time on by ``seconds``, then let everything due by then finish."""
    await asyncio.sleep(seconds)
    await wait_all_tasks_blocked()


# --- start and probes -------------------------------------------------------------------------


def test_start_runs_a_fresh_check_then_probes_answer_from_the_cache() -> None:
    f = Fixture(REPORTS)

    async def main() -> None:
        assert f.health.for_report() is None  # no check completed yet
        await f.health.start()
        assert f.check.calls == [T0]  # the fresh check ran before start returned
        await wait_all_tasks_blocked()
        assert f.check.calls == [T0, T0]  # then the self-health task's first evaluation
        assert f.health.for_report() == PushedHealth(True, T0, 0)
        await asyncio.gather(*(f.health.check_for_probe() for _ in range(10)))
        assert len(f.check.calls) == 2  # concurrent probes never re-run the user check
        f.check.fail_with = RuntimeError("db down")
        await advance(PERIOD / 2)
        with pytest.raises(HealthCheckFailed, match="db down"):
            await f.health.check_for_probe()
        assert len(f.check.calls) == 3

    f.run(main)


def test_a_failing_fresh_check_fails_start_and_starts_no_task() -> None:
    f = Fixture(REPORTS)
    f.check.fail_with = ValueError("model not loaded")

    async def main() -> None:
        with pytest.raises(HealthCheckFailed, match="model not loaded"):
            await f.health.start()
        await advance(3 * PERIOD)
        assert f.check.calls == [T0]  # no self-health task is running

    f.run(main)


# --- heartbeats ---------------------------------------------------------------------------------


def test_heartbeats_fill_the_gap_only_when_reports_are_slower_than_the_period() -> None:
    for interval, expected in ((HEARTBEATS, [T0, T0 + 10, T0 + 20, T0 + 30]), (REPORTS, [])):
        f = Fixture(interval)

        async def main() -> None:
            await f.health.start()
            await advance(30.0)
            assert f.shard.times() == expected, interval

        f.run(main)


def test_a_metric_report_carrying_health_delays_the_next_heartbeat() -> None:
    f = Fixture(HEARTBEATS)

    async def main() -> None:
        await f.health.start()
        await advance(9.0)
        f.health.report_sent()  # carried the T0+5 result at T0+9
        await advance(21.0)
        assert f.shard.times() == [T0, T0 + 20, T0 + 30]  # not T0+10: the report was recent

    f.run(main)


def test_a_flip_to_unhealthy_is_sent_at_once_even_when_reports_carry_health() -> None:
    f = Fixture(REPORTS)

    async def main() -> None:
        await f.health.start()
        await wait_all_tasks_blocked()
        f.health.report_sent()
        f.check.fail_with = RuntimeError("db down")
        await advance(PERIOD / 2)
        assert f.shard.sent == [(T0 + 5, PushedHealth(
            False, T0 + 5, 1, "health check failed: RuntimeError('db down')"))]  # with its cause

    f.run(main)


def test_at_most_one_heartbeat_is_in_flight() -> None:
    f = Fixture(HEARTBEATS)
    f.shard.hold = True

    async def main() -> None:
        await f.health.start()
        await advance(30.0)
        assert f.shard.times() == [T0]  # T0+10..30 were due, but T0's is still in flight
        f.shard.release()
        await advance(PERIOD / 2)
        assert f.shard.times() == [T0, T0 + 35]

    f.run(main)


def test_an_unhealthy_flip_jumps_a_healthy_heartbeat_in_flight_but_not_an_unhealthy_one() -> None:
    f = Fixture(HEARTBEATS)
    f.shard.hold = True

    async def main() -> None:
        await f.health.start()
        f.check.fail_with = RuntimeError("db down")
        await advance(PERIOD / 2)
        assert [p.healthy for _, p in f.shard.sent] == [True, False]
        await advance(PERIOD)  # two more unhealthy results: one unhealthy is out already
        assert f.shard.times() == [T0, T0 + 5]

    f.run(main)


def test_a_failed_heartbeat_is_logged_and_still_reported_done(caplog) -> None:
    f = Fixture(HEARTBEATS)
    f.shard.fail_with = ConnectionError("shard restarting")

    async def main() -> None:
        await f.health.start()
        await advance(PERIOD)
        # Had the failed T0 heartbeat stayed "in flight", T0+10's would be held back.
        assert f.shard.times() == [T0, T0 + 10]

    with caplog.at_level(logging.WARNING, logger="replicas.replica_health"):
        f.run(main)
    assert "r1: heartbeat to shard-0 failed" in caplog.text
    assert "shard restarting" in caplog.text


def test_a_task_that_crashes_is_logged(caplog) -> None:
    class Crash(BaseException):  # not an Exception: escapes the heartbeat's handler
        pass

    f = Fixture(HEARTBEATS)
    f.shard.fail_with = Crash("sender bug")

    async def main() -> None:
        await f.health.start()
        await wait_all_tasks_blocked()

    with caplog.at_level(logging.ERROR, logger="replicas.replica_health"):
        f.run(main)
    assert "replica r1: heartbeat task failed" in caplog.text


# --- stop and timings ---------------------------------------------------------------------------


def test_stop_cancels_every_task_and_starts_no_new_one() -> None:
    f = Fixture(HEARTBEATS)
    f.shard.hold = True

    async def main() -> None:
        await f.health.start()
        await wait_all_tasks_blocked()
        assert f.shard.times() == [T0] and len(f.check.calls) == 2
        f.health.stop()
        await advance(30.0)
        assert f.shard.cancelled == 1  # the held heartbeat was cancelled
        assert len(f.check.calls) == 2  # the self-health task no longer runs
        await f.health.check_for_probe()  # so a probe runs a fresh check...
        await advance(30.0)
        assert len(f.check.calls) == 3 and f.shard.times() == [T0]  # ...and sends nothing

    f.run(main)


def test_stop_during_the_fresh_check_starts_no_self_health_task() -> None:
    f = Fixture(REPORTS)

    async def main() -> None:
        f.check.gate = asyncio.get_running_loop().create_future()
        starting = asyncio.get_running_loop().create_task(f.health.start())
        await wait_all_tasks_blocked()
        f.health.stop()  # prepare_for_shutdown while initialize still runs the check
        f.check.gate.set_result(None)
        await starting
        await advance(30.0)
        assert f.check.calls == [T0]

    f.run(main)


def test_new_timings_apply_to_the_checks_and_to_the_heartbeat_decision() -> None:
    f = Fixture(HEARTBEATS)

    async def main() -> None:
        await f.health.start()
        await wait_all_tasks_blocked()
        f.health.set_timings(period_s=40.0, timeout_s=1.0)  # reports (30 s) now carry health
        await advance(50.0)
        # The wait armed at T0 ends at T0+5, then every 20 s; no routine heartbeat since.
        assert f.check.calls == [T0, T0, T0 + 5, T0 + 25, T0 + 45]
        assert f.shard.times() == [T0]
        with pytest.raises(ValueError):
            f.health.set_timings(period_s=0.0, timeout_s=1.0)

    f.run(main)
