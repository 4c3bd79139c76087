"""Node-batched reports: the batcher, the replica's choice of path, and the shard's intake."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.clock import FakeClock
from controlplane.settings import uses_reporter
from controlplane.wire import MetricReport, PushedHealth, ReportRow, report_row
from replicas import node_reporter
from replicas.report_batch import ReportBatcher
from replicas.report_sender import (FIRST_WAIT_S, RETRY_REPORTER_S, START_TIMEOUT_S,
                                    ReportSender)
from tests.unit.shard_harness import DEP, Shard, make_spec
from tests.unit.virtual_time import run_virtual

KEY = (DEP.app, DEP.name)


def report(replica_id: str = "r1", healthy: bool | None = True, at: float = 1.0,
           ongoing: int = 0) -> MetricReport:
    health = None if healthy is None else PushedHealth(healthy, at, 0 if healthy else 1,
                                                         "" if healthy else "boom")
    return MetricReport(replica_id, ongoing, 0, health)


# --- the row format ---------------------------------------------------------------------------


@pytest.mark.parametrize("healthy", [True, False, None])
def test_a_row_carries_the_whole_report(healthy):
    original = report(healthy=healthy, ongoing=3)
    row = report_row(original)
    assert isinstance(row, ReportRow)
    assert (row.replica_id, row.ongoing, row.queued) == ("r1", 3, 0)
    h = original.health
    if h is None:
        assert row.healthy is None
    else:
        assert (row.healthy, row.checked_at, row.failures, row.error) == (
            h.healthy, h.checked_at, h.consecutive_failures, h.error)


# --- the batcher -----------------------------------------------------------------------------


def test_newest_row_per_replica_wins_and_batches_group_by_deployment():
    b = ReportBatcher(stuck_after_s=5)
    b.add("s0", KEY, report_row(report("r1", at=1.0)))
    b.add("s0", KEY, report_row(report("r1", at=2.0)))
    b.add("s0", ("other", "D"), report_row(report("r2")))
    b.add("s1", KEY, report_row(report("r3")))
    ready = dict(b.take_ready(now=0.0))
    assert [row[4] for row in ready["s0"][KEY]] == [2.0]
    assert set(ready["s0"]) == {KEY, ("other", "D")} and set(ready["s1"]) == {KEY}
    assert b.take_ready(now=0.1) == []  # nothing new, and both batches are in flight


def test_one_batch_in_flight_per_shard_then_the_next():
    b = ReportBatcher(stuck_after_s=5)
    b.add("s0", KEY, report_row(report("r1")))
    assert len(b.take_ready(0.0)) == 1
    b.add("s0", KEY, report_row(report("r2")))
    assert b.take_ready(0.5) == []  # the first is still out
    b.sent("s0")
    [(shard, batch)] = b.take_ready(1.0)
    assert [row[0] for row in batch[KEY]] == ["r2"]


def test_a_failed_batch_is_kept_under_newer_rows():
    b = ReportBatcher(stuck_after_s=5)
    b.add("s0", KEY, report_row(report("r1", at=1.0)))
    b.add("s0", KEY, report_row(report("r2", at=1.0)))
    [(_, batch)] = b.take_ready(0.0)
    b.add("s0", KEY, report_row(report("r1", at=2.0)))  # arrives while the batch is out
    b.failed("s0", batch)
    [(_, again)] = b.take_ready(1.0)
    assert sorted((row[0], row[4]) for row in again[KEY]) == [("r1", 2.0), ("r2", 1.0)]
    assert b.failed_batches_total == 1


def test_a_stuck_batch_makes_the_reporter_refuse_rows_for_that_shard_only():
    b = ReportBatcher(stuck_after_s=5)
    b.add("s0", KEY, report_row(report("r1")))
    b.take_ready(10.0)
    assert b.accepts("s0", 14.9) and b.accepts("s1", 100.0)
    assert not b.accepts("s0", 15.0)
    b.sent("s0")
    assert b.accepts("s0", 15.0)


# --- the replica's path ------------------------------------------------------------------------


class Remote:
    """``actor.method.remote(...)`` returning an awaitable, recording the call."""

    def __init__(self, answer=None, error: BaseException | None = None, hang: bool = False,
                 until: asyncio.Event | None = None):
        self.calls: list[tuple] = []
        self.answer, self.error, self.hang, self.until = answer, error, hang, until

    def remote(self, *args):
        self.calls.append(args)
        return self._result()

    async def _result(self):
        if self.hang:
            await asyncio.Event().wait()
        if self.until is not None:
            await self.until.wait()
        if self.error is not None:
            raise self.error
        return self.answer


class FakeActor:
    def __init__(self, **methods: Remote) -> None:
        for name, remote in methods.items():
            setattr(self, name, remote)


def sender(reporter: FakeActor | None, clock: FakeClock,
           found: list | None = None) -> tuple[ReportSender, FakeActor]:
    """``reporter`` answers ``ready`` at once unless it has a ``ready`` of its own;
    ``found`` gets one item per lookup."""
    shard = FakeActor(report_rows=Remote())
    if reporter is not None and not hasattr(reporter, "ready"):
        reporter.ready = Remote(answer=True)

    async def find():
        if found is not None:
            found.append(1)
        if reporter is None:
            raise RuntimeError("no node")
        return reporter
    return ReportSender(shard, "s0", KEY, clock, find, timeout_s=5.0), shard


def drive(coro_fn):
    clock = FakeClock()
    return run_virtual(clock, lambda: coro_fn(clock))


def test_healthy_reports_go_through_the_node_and_an_unhealthy_one_goes_directly():
    async def main(clock):
        reporter = FakeActor(report=Remote(answer=True))
        s, shard = sender(reporter, clock)
        await s.send(report(healthy=True))
        await s.send(report(healthy=None))
        await s.send(report(healthy=False, at=2.0))
        assert len(reporter.report.calls) == 2
        assert [args[1][0].healthy for args in shard.report_rows.calls] == [False]
        assert reporter.report.calls[0][:2] == ("s0", KEY)
    drive(main)


@pytest.mark.parametrize("reporter", [
    FakeActor(report=Remote(error=RuntimeError("actor died"))),  # dead
    FakeActor(report=Remote(hang=True)),  # wedged: the report times out
    None,  # could not be found or created
])
def test_a_broken_reporter_sends_the_same_report_directly_and_is_retried_later(reporter):
    async def main(clock):
        s, shard = sender(reporter, clock)
        first = report(at=1.0)
        await s.send(first)
        assert [args[1] for args in shard.report_rows.calls] == [[report_row(first)]]
        calls = len(reporter.report.calls) if reporter else 0
        await s.send(report(at=2.0))  # within the retry delay: not asked again
        assert (len(reporter.report.calls) if reporter else 0) == calls
        assert len(shard.report_rows.calls) == 2
        clock.advance(RETRY_REPORTER_S)
        await s.send(report(at=3.0))
        assert (len(reporter.report.calls) if reporter else 0) == calls + (1 if reporter else 0)
    drive(main)


def test_a_reporter_that_refuses_keeps_being_asked_but_the_report_goes_directly():
    async def main(clock):
        reporter = FakeActor(report=Remote(answer=False))  # its shard link is stuck
        s, shard = sender(reporter, clock)
        await s.send(report(at=1.0))
        await s.send(report(at=2.0))
        assert len(reporter.report.calls) == 2 and len(shard.report_rows.calls) == 2
    drive(main)


def test_a_starting_reporter_takes_reports_once_ready_and_none_waits_or_fails_meanwhile():
    """A reporter whose worker is still starting (a scale-up burst): the first report waits
    ``FIRST_WAIT_S`` once, then reports go directly without waiting, nothing is marked
    failed (no 30 s of direct reports), and the node path takes over once it answers."""
    async def main(clock):
        started = asyncio.Event()
        reporter = FakeActor(report=Remote(answer=True), ready=Remote(until=started))
        found: list = []
        s, shard = sender(reporter, clock, found)
        t0 = clock.monotonic()
        await s.send(report(at=1.0))
        assert clock.monotonic() - t0 == pytest.approx(FIRST_WAIT_S)
        clock.advance(START_TIMEOUT_S / 2)
        t1 = clock.monotonic()
        await s.send(report(at=2.0))
        assert clock.monotonic() == t1  # not waited on again
        assert (len(shard.report_rows.calls), len(reporter.report.calls)) == (2, 0)
        started.set()
        await asyncio.sleep(0)
        await s.send(report(at=3.0))
        assert (len(shard.report_rows.calls), len(reporter.report.calls)) == (2, 1)
        assert (len(found), len(reporter.ready.calls)) == (1, 1)
    drive(main)


def test_a_reporter_of_an_older_version_without_ready_is_used_at_once():
    """A detached reporter left running by an older fleetplane has no ``ready``: it is
    used as before, not taken for one that cannot start."""
    async def main(clock):
        class OldReporter:  # attribute access raises, as a Ray handle's does
            report = Remote(answer=True)

            def __getattr__(self, name):
                raise AttributeError(name)
        reporter = OldReporter()

        async def find():
            return reporter
        shard = FakeActor(report_rows=Remote())
        s = ReportSender(shard, "s0", KEY, clock, find, 5.0)
        t0 = clock.monotonic()
        await s.send(report(at=1.0))
        assert clock.monotonic() == t0  # nothing waited for
        assert (len(reporter.report.calls), len(shard.report_rows.calls)) == (1, 0)
    drive(main)


@pytest.mark.parametrize("ready, failed_after_s", [
    (Remote(hang=True), START_TIMEOUT_S),  # never answers: failed once the time is out
    (Remote(error=RuntimeError("no worker")), 0.0),  # raises: failed at once
])
def test_a_reporter_that_never_starts_fails_like_a_dead_one(ready, failed_after_s):
    """Reports go directly and the reporter is looked up again ``RETRY_REPORTER_S`` after
    the failure, not before."""
    async def main(clock):
        found: list = []
        reporter = FakeActor(report=Remote(answer=True), ready=ready)
        s, shard = sender(reporter, clock, found)
        await s.send(report(at=1.0))
        if failed_after_s:
            clock.advance(failed_after_s)
            await s.send(report(at=2.0))  # the time is out: failed now
        clock.advance(RETRY_REPORTER_S / 2)
        await s.send(report(at=3.0))
        assert len(found) == 1 and len(reporter.report.calls) == 0
        clock.advance(RETRY_REPORTER_S / 2)
        await s.send(report(at=4.0))
        assert len(found) == 2 and len(reporter.report.calls) == 0
    drive(main)


def test_batching_off_sends_everything_directly():
    async def main(clock):
        shard = FakeActor(report_rows=Remote())
        s = ReportSender(shard, "s0", KEY, clock, None, timeout_s=5.0)
        await s.send(report())
        assert len(shard.report_rows.calls) == 1
    drive(main)


# --- the shard's intake ---------------------------------------------------------------------------


def test_a_batch_feeds_the_same_health_as_single_reports():
    async def main():
        batched, single = Shard(), Shard()
        for shard in (batched, single):
            await shard.deploy(make_spec(num_replicas=3))
        ids = sorted(r["replica_id"] for r in batched.replicas())
        assert ids == sorted(r["replica_id"] for r in single.replicas())
        reports = [report(ids[0], healthy=True, at=5.0), report(ids[1], healthy=False, at=5.0),
                   report(ids[2], healthy=None)]
        batched.core.report_batch({KEY: [report_row(r) for r in reports],
                                   ("gone", "D"): [report_row(report("x"))]})
        for r in reports:
            single.core.report_metrics(KEY, r)
        await batched.step()
        await single.step()
        assert batched.replicas() == single.replicas()
        b = batched.core.health_totals.statistics(0.0)
        assert b.pushes_total == 2 and b.batches_total == 1
    run_virtual(FakeClock(), main)


def test_a_malformed_row_is_dropped_and_the_rest_of_the_batch_is_taken():
    async def main():
        shard = Shard()
        await shard.deploy(make_spec(num_replicas=2))
        a, b = sorted(r["replica_id"] for r in shard.replicas())
        bad = (a, 0, 0, False, 5.0, 0, "unhealthy with no failure counted")
        shard.core.report_batch({KEY: [bad, ("short",), report_row(report(b, at=5.0))]})
        assert shard.core.health_totals.statistics(0.0).pushes_total == 1
    run_virtual(FakeClock(), main)


def test_batched_load_reports_scale_a_deployment_as_single_reports_do():
    from tests.unit.test_metric_window import autoscaled

    async def main():
        batched, single = Shard(), Shard()
        for shard in (batched, single):
            await shard.deploy(autoscaled(8), ticks=4)
        [rid] = [r["replica_id"] for r in batched.replicas()]
        for second in range(3):
            r = report(rid, healthy=None, ongoing=4)
            batched.core.report_batch({KEY: [report_row(r)]})
            single.core.report_metrics(KEY, r)
            await batched.advance(1.0)
            await single.advance(1.0)
        target = batched.status()["target_replicas"]
        assert target == single.status()["target_replicas"] and target > 1
    run_virtual(FakeClock(), main)


def test_an_autoscaled_batch_takes_steady_rows_and_a_row_with_bad_counts_not_at_all():
    # the steady rows are taken in one loop (issue 13); a row whose counts are wrong is
    # dropped before any of it is taken, health included
    from tests.unit.test_metric_window import autoscaled

    async def main():
        shard = Shard()
        await shard.deploy(autoscaled(8), ticks=4)
        [rid] = [r["replica_id"] for r in shard.replicas()]
        state = shard.core.deployment(DEP)
        shard.core.report_batch({KEY: [report_row(report(rid, at=1.0, ongoing=1))]})
        await shard.step()  # the first push applied: the next healthy ones are steady
        pushes = shard.core.health_totals.statistics(0.0).pushes_total
        shard.core.report_batch({KEY: [(rid, -1, 0, True, 2.0, 0, "")]})
        assert shard.core.health_totals.statistics(0.0).pushes_total == pushes
        assert state.health.registry.get(rid).checked_at == 1.0
        shard.core.report_batch({KEY: [report_row(report(rid, at=3.0, ongoing=4))]})
        assert shard.core.health_totals.statistics(0.0).pushes_total == pushes + 1
        assert state.health.registry.get(rid).checked_at == 3.0
        assert state.autoscaler.average_load(shard.clock.monotonic()) == 2.5  # (1 + 4) / 2
    run_virtual(FakeClock(), main)


@pytest.mark.parametrize("batch_s, report_s, period_s, expected", [
    (1.0, 1.0, 10.0, True),  # stock: through the node's reporter
    (1.0, 1.0, 2.0, True),  # the delay is exactly one period: still fresh
    (1.0, 1.0, 1.0, False),  # a 1 s period: a batch's delay would make pushes stale
    (0.0, 1.0, 10.0, False),  # batching off
])
def test_a_replica_uses_its_node_reporter_only_where_the_delay_fits_one_period(
        batch_s, report_s, period_s, expected):
    assert uses_reporter(batch_s, report_s, period_s) is expected


def test_reporters_are_created_on_every_node_and_one_failure_stops_none(monkeypatch):
    created = []

    def reporter_for(namespace, node_id, interval_s):
        created.append((namespace, node_id, interval_s))
        if node_id == "b":
            raise RuntimeError("node b is gone")
    monkeypatch.setattr(node_reporter, "reporter_for", reporter_for)
    node_reporter.start_reporters("ns", ["a", "b", "c"], 1.0)
    assert created == [("ns", "a", 1.0), ("ns", "b", 1.0), ("ns", "c", 1.0)]
