"""Scale to zero and back: a router holds requests for the first replica up to
``cold_start_hold_s`` or tells them when to come back (503 + Retry-After from the measured
start time); the shard counts the routers' held requests as load, so the first request
at zero wakes the deployment; the start outlook reaches the routers. Virtual time, no Ray.
"""

from __future__ import annotations

import asyncio

import pytest

from controlplane.deployment.demand_board import DemandBoard
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord, ReplicaSet
from controlplane.deployment.routing import cold_hold_s
from controlplane.errors import BackpressureError
from controlplane.wire import ClusterDemand, MetricReport, RouterDemand, report_row
from tests.unit.router_fakes import Harness, replica, settle
from tests.unit.shard_harness import DEP, Shard, make_spec, run


def _cold(h: Harness, hold_s: float = 30.0):
    return h.make(replicas=0, max_ongoing=2, cold_hold_s=hold_s)


def test_a_request_at_zero_waits_for_the_first_replica_and_is_served():
    h = Harness()

    async def main():
        router = _cold(h)
        assert router.waits_cold and router.informed  # it reports what it holds
        task = h.start("first")
        await settle()
        assert router.demand().queued == 1 and not task.done()
        h.clock.advance(12.0)  # the replica took 12 s to start
        router.update_replicas([replica(0)])
        await settle()
        h.transport.finish("first")
        assert await task == "done first"
        stats = router.statistics()
        assert (stats.cold_held_total, stats.cold_hinted_total, stats.rejected_total) == (1, 0, 0)
    h.run(main)


def test_a_hold_that_runs_out_is_told_when_to_come_back_never_a_bare_error():
    h = Harness()

    async def main():
        router, t0 = _cold(h, hold_s=30.0), h.clock.monotonic()
        task = h.start("late")
        await settle()
        # the shard measured starts of ~100 s; this one began 20 s ago
        router._retry.heard_total(ClusterDemand(1, 0.0, 0.1, 1, 80.0), h.clock.monotonic())
        with pytest.raises(BackpressureError) as caught:
            await task
        assert h.clock.monotonic() - t0 == 30.0  # held exactly the bound
        # back half a hold (15 s) before the replica is due in 50 s, to be held for it
        assert caught.value.status_code == 503 and caught.value.retry_after_s == 35
        assert "starting from zero replicas (waited 30 s" in str(caught.value)
        # it left the queue, and counts as demand until it is due back
        assert router.demand().queued == 1
        h.clock.advance(35.0)
        assert router.demand().queued == 0
    h.run(main)


def test_a_request_that_would_wait_past_the_hold_is_told_at_once():
    h = Harness()

    async def main():
        router, t0 = _cold(h, hold_s=30.0), h.clock.monotonic()
        router._retry.heard_total(ClusterDemand(3, 0.0, 1.0, 1, 140.0), t0)
        with pytest.raises(BackpressureError) as caught:
            await router.assign("x")
        assert h.clock.monotonic() == t0 and caught.value.retry_after_s == 125
        assert router.statistics().cold_hinted_total == 1
    h.run(main)


def test_a_deployment_that_never_scales_to_zero_is_not_held():
    h = Harness()

    async def main():
        router = h.make(replicas=0)
        assert not router.waits_cold and not router.informed
    h.run(main)


def _starting(replica_id: str, at: float) -> ReplicaRecord:
    return ReplicaRecord(replica_id, ReplicaState.STARTING, "v1", started_at=at)


def test_the_start_outlook_from_zero_is_the_measured_start_less_its_age():
    board, replicas = DemandBoard(), ReplicaSet()
    board.note_start(100.0)
    replicas.add(_starting("r1", at=10.0))
    board.record("proxy-0", RouterDemand(4, 0.0, 2.0), now=30.0)
    total = board.total(30.0, replicas)
    assert total.scaleup_eta_s == 80.0 and total.queued == 4
    assert board.queued(30.0) == 4 and board.queued(40.0) == 0  # a stale report is none


def test_the_first_request_at_zero_wakes_the_deployment_and_idle_returns_it_to_zero():
    scaling = {"min_replicas": 0, "max_replicas": 3, "initial_replicas": 0,
               "target_ongoing_requests": 2.0, "upscale_delay_s": 30.0,
               "downscale_delay_s": 600.0, "downscale_to_zero_delay_s": 60.0,
               "look_back_period_s": 10.0, "cold_start_hold_s": 30.0}

    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(0, autoscaling_config=scaling))
        assert shard.replicas() == [] and shard.status()["target_replicas"] == 0
        assert cold_hold_s(shard.core._deployments[DEP].spec) == 30.0
        shard.core.report_router_demand((DEP.app, DEP.name), "proxy-0",
                                        RouterDemand(1, 0.0, 0.5))
        await shard.advance(1.0)
        assert shard.status()["target_replicas"] == 1  # at once: a cold start has no delay
        [row] = shard.replicas()
        assert row["state"] == "RUNNING"
        idle = report_row(MetricReport(row["replica_id"], 0, 0))
        for second in range(59):  # idle, reporting: one replica until the to-zero delay
            shard.core.report_rows((DEP.app, DEP.name), [idle])
            await shard.advance(1.0)
        assert shard.status()["target_replicas"] == 1
        for second in range(5):
            shard.core.report_rows((DEP.app, DEP.name), [idle])
            await shard.advance(1.0)
        assert shard.status()["target_replicas"] == 0
        await shard.advance(30.0, ticks=5)
        assert all(r["state"] != "RUNNING" for r in shard.replicas())
    run(scenario)


def test_a_wait_of_minutes_at_zero_keeps_the_backoff_bounded():
    """A cold start of minutes: the backoff timer keeps running (its exponent capped,
    where 2 ** streak once overflowed a float after ~1,000 backoffs) and the held request
    is served when the replica comes."""
    h = Harness()

    async def main():
        router = _cold(h, hold_s=600.0)
        task = h.start("slow start")
        await settle()
        h.clock.advance(300.0)
        await asyncio.sleep(250.0)  # 2,500 backoffs at 0.1 s
        assert router._backoff is not None  # still scheduled: no callback raised
        router.update_replicas([replica(0)])
        await settle()
        h.transport.finish("slow start")
        assert await task == "done slow start"
    h.run(main)


def test_a_replica_that_leaves_the_set_is_forgotten_by_the_transport():
    """Its id can come back on another actor (a restarted shard issues ids again from the
    live replicas it finds: at zero, from #0); a cached handle would reach the dead one
    (a kill-under-load run of scale from zero answered 502 so)."""
    h = Harness()

    async def main():
        forgotten = []
        h.transport.forget = lambda replica: forgotten.append(replica.replica_id)
        router = h.make(replicas=2)
        router.update_replicas([replica(1)])
        assert forgotten == ["r0"]
        router.update_replicas([replica(0), replica(1)])  # r0 again: a new actor
        assert forgotten == ["r0"]
    h.run(main)


def test_with_no_start_measured_yet_a_hold_that_runs_out_comes_back_soon():
    """The deployment's first start ever: no measured start time. The client is told to
    come back a quarter of a hold later, to be held again (not a whole hold: the replica
    may well be up by then)."""
    h = Harness()

    async def main():
        router = _cold(h, hold_s=120.0)
        task = h.start("first ever")
        with pytest.raises(BackpressureError) as caught:
            await task
        assert caught.value.retry_after_s == 30
    h.run(main)
