"""A deployment whose tick raises: the shard backs it off, counts, and logs once per change.

ShardCore is driven by hand on the virtual-time loop with the fake replica client (no
Ray). The tick is made to raise through a public seam: a replica's metric report whose
load is NaN (``report_metrics`` takes what the replica sent), which the autoscaling
decision cannot turn into a replica count. Autoscaling runs at most once a second, so
the tests tick once a virtual second: every tick the backoff lets through raises while
the bad report is in the look-back window.
"""

from __future__ import annotations

import logging
import math

from controlplane.clock import FakeClock
from controlplane.config.schema import AutoscalingConfig
from controlplane.health.stats import merge_all
from controlplane.ingress.proxy_metrics import ProxyMetrics
from controlplane.settings import Settings, ShardSettings
from controlplane.shard import ShardCore
from controlplane.specs import DeploymentId
from controlplane.status import assemble_status
from controlplane.wire import MetricReport
from tests.unit.fakes import FakeReplicaClient
from tests.unit.shard_harness import DEP, make_spec
from tests.unit.virtual_time import run_virtual, wait_all_tasks_blocked

KEY = (DEP.app, DEP.name)
LOOK_BACK_S = 2.0
SHARD_LOGGER = "controlplane.shard"


def garbled_report(replica_id: str, load: float = math.nan) -> MetricReport:
    """A report from a buggy replica: a real ``MetricReport`` whose load is not a number
    (its check of counts >= 0 lets NaN and infinity through)."""
    return MetricReport(replica_id, load, 0)


class Driver:
    """ShardCore on fakes; its own loop is parked, the test ticks it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.core = ShardCore(0, Settings(shard=ShardSettings(tick_interval_s=1e9)),
                              FakeReplicaClient(), clock)
        self.t0 = clock.monotonic()

    async def tick(self) -> None:
        self.core.tick()
        await wait_all_tasks_blocked()

    async def deploy_autoscaled(self) -> str:
        auto = AutoscalingConfig(min_replicas=1, max_replicas=3,
                                 look_back_period_s=LOOK_BACK_S).model_dump()
        self.core.apply([make_spec(1, autoscaling_config=auto)], [])
        for _ in range(3):
            await self.tick()
        [replica] = self.core.status()["deployments"][str(DEP)]["replicas"]
        assert replica["state"] == "RUNNING"
        return replica["replica_id"]

    @property
    def errors(self) -> int:
        return self.core.status()["tick_errors_total"]

    async def seconds(self, n: int, report: MetricReport | None) -> list[float]:
        """Tick once a second for ``n`` seconds (sending ``report`` first, if any); the
        times, from deploy, at which a tick raised."""
        raised = []
        for _ in range(n):
            self.clock.advance(1.0)
            if report is not None:
                self.core.report_metrics(KEY, report)
            before = self.errors
            await self.tick()
            if self.errors > before:
                raised.append(self.clock.monotonic() - self.t0)
        return raised


def scenario(main) -> None:
    clock = FakeClock()
    run_virtual(clock, lambda: main(Driver(clock)))


def tracebacks(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == SHARD_LOGGER and r.levelno == logging.ERROR and r.exc_info]


def test_a_raising_tick_backs_off_doubling_from_a_tenth_to_thirty_seconds(caplog):
    async def main(d: Driver) -> None:
        replica = await d.deploy_autoscaled()
        raised = await d.seconds(100, garbled_report(replica))
        # Waits 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30: a tick once a second
        # gets through at these times only.
        assert raised == [1, 2, 3, 4, 5, 7, 11, 18, 31, 57, 87]
        assert d.errors == 11
        status = d.core.status()
        assert status["health"].tick_errors_total == 11
        assert list(status)[:4] == ["index", "deployments", "ticks", "tick_errors_total"]

    with caplog.at_level(logging.DEBUG, logger=SHARD_LOGGER):
        scenario(main)
    [logged] = tracebacks(caplog)  # eleven raises, one traceback
    assert "tick of app/model failed" in logged.getMessage()
    assert logged.exc_info[0] is ValueError


def test_a_clean_tick_resets_the_backoff_and_the_same_error_is_not_logged_again(caplog):
    async def main(d: Driver) -> None:
        replica = await d.deploy_autoscaled()
        assert await d.seconds(20, garbled_report(replica)) == [1, 2, 3, 4, 5, 7, 11, 18]
        # The bad reports stop; the next tick the backoff lets through (18 + 12.8) is clean.
        assert await d.seconds(13, None) == []
        recovered = [r for r in caplog.records if "succeeds again" in r.getMessage()]
        assert len(recovered) == 1 and "after 8 failures" in recovered[0].getMessage()
        # The error returns: retried a tenth of a second later, so on the next tick too.
        assert await d.seconds(2, garbled_report(replica)) == [34, 35]
        assert len(tracebacks(caplog)) == 1  # the same error: counted, not logged
        # Until the last bad report leaves the 2 s window; then clean, and as this streak
        # had no new error, its end is not logged either.
        assert await d.seconds(4, None) == [36, 37]
        assert len([r for r in caplog.records if "succeeds again" in r.getMessage()]) == 1
        # A different error is a change: its traceback is logged.
        await d.seconds(1, garbled_report(replica, load=math.inf))
        assert [r.exc_info[0] for r in tracebacks(caplog)] == [ValueError, OverflowError]
        assert d.errors == 8 + 4 + 1

    with caplog.at_level(logging.INFO, logger=SHARD_LOGGER):
        scenario(main)


def test_other_deployments_keep_ticking_while_one_backs_off():
    async def main(d: Driver) -> None:
        replica = await d.deploy_autoscaled()
        other = make_spec(1, id=DeploymentId("app", "other"))
        assert await d.seconds(5, garbled_report(replica)) == [1, 2, 3, 4, 5]
        d.core.apply([other], [])  # while app/model waits out 1.6 s
        await d.tick()
        await d.tick()
        status = d.core.status()["deployments"]
        assert [r["state"] for r in status["app/other"]["replicas"]] == ["RUNNING"]
        assert d.errors == 5

    scenario(main)


def test_a_deleted_deployment_that_backed_off_still_goes():
    async def main(d: Driver) -> None:
        replica = await d.deploy_autoscaled()
        await d.seconds(5, garbled_report(replica))
        d.core.apply([], [DEP])
        # Due again at 6.6 (the bad report is still in the window: 3.2 s more), then at
        # 10.2: clean, it stops its replica and is gone on the tick after.
        assert await d.seconds(8, None) == [7]
        assert d.core.status()["deployments"] == {}

    scenario(main)


def test_tick_errors_are_summed_across_shards_and_exported():
    async def main(d: Driver) -> None:
        replica = await d.deploy_autoscaled()
        await d.seconds(3, garbled_report(replica))
        return d.core.status()

    shard = run_virtual(clock := FakeClock(), lambda: main(Driver(clock)))
    other = dict(shard, index=1, deployments={})
    status = assemble_status(None, [shard, other], generation=1)
    assert status["controller"]["health"]["tick_errors_total"] == 6
    metrics = ProxyMetrics()
    metrics.controller_health.snapshot = merge_all([shard["health"], other["health"]]).as_json()
    assert b"fleetplane_health_tick_errors_total 6.0" in metrics.render()[0]
