"""``cluster_informed`` (issue 14): routers report their demand, the shard sums and
publishes it at most once a second, and a router folds the total into its Retry-After."""

from __future__ import annotations

import random

import pytest

from controlplane.deployment.demand_board import EMPTY, PUBLISH_INTERVAL_S, REPORT_TTL_S, DemandBoard
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord, ReplicaSet
from controlplane.routing.retry_after import RetrySchedule, retry_after_s
from controlplane.wire import (ClusterDemand, ReplicaInfo, RouterDemand, RoutingDelta,
                               RoutingUpdate, apply_routing_delta)
from tests.unit.test_retry_after import T0, Broken, FixedJitter, warm


def test_the_board_sums_fresh_reports_and_forgets_silent_routers():
    board = DemandBoard()
    board.record("a", RouterDemand(4, 2.0, 10.0), now=0.0)
    board.record("b", RouterDemand(6, 2.0, 10.0), now=1.0)
    assert board.total(1.0) == ClusterDemand(10, 4.0, 20.0, 2)
    assert board.total(REPORT_TTL_S + 0.5) == ClusterDemand(6, 2.0, 10.0, 1)  # a went quiet
    assert board.total(REPORT_TTL_S + 1.5) is None


def test_a_total_is_published_once_a_second_at_most_and_only_when_it_changed():
    board = DemandBoard()
    board.record("a", RouterDemand(4, 2.0, 10.0), now=0.0)
    assert board.to_publish(0.0) == ClusterDemand(4, 2.0, 10.0, 1)
    board.record("a", RouterDemand(9, 2.0, 10.0), now=0.5)
    assert board.to_publish(0.5) is None  # changed, but looked at too recently
    assert board.to_publish(PUBLISH_INTERVAL_S) == ClusterDemand(9, 2.0, 10.0, 1)
    board.record("a", RouterDemand(9, 2.01, 10.0), now=2.0)
    assert board.to_publish(2.0) is None  # the same to two significant digits
    board.record("a", RouterDemand(0, 0.0, 0.0), now=3.0)
    assert board.to_publish(3.0) == EMPTY  # demand gone: said once...
    assert board.to_publish(9.0) is None  # ...and not again
    assert DemandBoard().to_publish(0.0) is None  # nobody ever reported: nothing to say


def test_the_outlook_of_a_scale_up_comes_from_observed_start_times():
    board = DemandBoard()
    board.note_start(10.0)
    board.note_start(10.0)
    replicas = ReplicaSet()
    for i in range(4):
        replicas.add(ReplicaRecord(f"r{i}", ReplicaState.RUNNING, "v1"))
    for i in range(4, 8):
        replicas.add(ReplicaRecord(f"r{i}", ReplicaState.STARTING, "v1", started_at=100.0 + i))
    board.record("a", RouterDemand(8, 4.0, 20.0), now=106.0)
    total = board.total(106.0, replicas)
    assert (total.scaleup_eta_s, total.capacity_growth) == (8.0, 2.0)  # oldest started at 104
    assert board.total(106.0 + REPORT_TTL_S, replicas) is not None  # silent for the TTL
    assert board.total(106.0 + REPORT_TTL_S + 0.1, replicas) is None  # past it: gone
    board.record("a", RouterDemand(8, 4.0, 20.0), now=130.0)
    assert board.total(130.0, replicas).scaleup_eta_s == 0.0  # overdue: any moment now


def informed(depth: int, demand: ClusterDemand | None, own_arrivals: int = 10,
             age_s: float = 0.5, schedule: RetrySchedule | None = None) -> int | None:
    now = T0 + 3.0
    return retry_after_s("cluster_informed", depth, warm(2), 0.0, 0, 5.0, FixedJitter(1.0),
                         now, arrivals=warm(own_arrivals), schedule=schedule or RetrySchedule(),
                         demand=demand, demand_age_s=age_s)


def test_without_a_fresh_total_it_is_arrival_aware_on_its_own_figures():
    own = retry_after_s("arrival_aware", 4, warm(2), 0.0, 0, 5.0, FixedJitter(1.0), T0 + 3.0,
                        arrivals=warm(10), schedule=RetrySchedule())
    assert informed(4, None) == own == 2
    assert informed(4, ClusterDemand(40, 4.0, 20.0, 2), age_s=60.0) == own


def test_the_wait_is_everyones_queue_over_everyones_drain_rate():
    # Own queue 4 at 2/s would say 2 s; the deployment has 40 queued at 4/s: 10 s.
    assert informed(4, ClusterDemand(40, 4.0, 20.0, 2)) == 10


def test_a_scale_up_that_lands_before_the_queue_drains_shortens_the_wait():
    # 40 queued at 4/s: 10 s; capacity doubles in 4 s: 4 + (10 - 4) / 2 = 7 s.
    assert informed(4, ClusterDemand(40, 4.0, 20.0, 2, scaleup_eta_s=4.0,
                                     capacity_growth=2.0)) == 7


def test_a_router_books_only_its_share_of_each_seconds_room():
    """Deployment drain 8/s, arrivals 2/s: 6/s of room for retries. This router sees half
    the arrivals (1 of 2 per s), so it books 3 retries per second, not 6."""
    schedule = RetrySchedule()
    demand = ClusterDemand(0, 8.0, 2.0, 2)
    values = [informed(0, demand, own_arrivals=1, schedule=schedule) for _ in range(6)]
    assert values == [1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("demand", [
    ClusterDemand(10, float("nan"), 3.0, 1), ClusterDemand(10, float("inf"), 3.0, 1),
    ClusterDemand(10**12, 1e-300, 3.0, 1), ClusterDemand(10, 4.0, float("inf"), 0),
    ClusterDemand(10, 4.0, float("nan"), 2), ClusterDemand(-5, 4.0, 3.0, 1),
    ClusterDemand(10, 4.0, 3.0, 1, scaleup_eta_s=float("nan"), capacity_growth=float("nan"))])
def test_the_rejection_path_never_raises_whatever_the_total_holds(demand):
    value = retry_after_s("cluster_informed", 10**9, Broken(4.0), 0.0, 0, 5.0,
                          random.Random(1), T0, arrivals=Broken(3.0), schedule=RetrySchedule(),
                          demand=demand, demand_age_s=0.0)
    assert value == 5 or 1 <= value <= 60


def test_a_demand_only_delta_keeps_the_replicas_so_routers_need_not_rebuild():
    update = RoutingUpdate(replicas=(ReplicaInfo("r1", "a1"),), max_ongoing_requests=2)
    demand = ClusterDemand(3, 1.0, 2.0, 1)
    after = apply_routing_delta(update, RoutingDelta(demand=demand))
    assert after.demand == demand and after.replicas is update.replicas
    moved = apply_routing_delta(after, RoutingDelta(added=(ReplicaInfo("r2", "a2"),)))
    assert moved.demand == demand and len(moved.replicas) == 2


def test_the_shard_publishes_the_total_over_the_routing_long_poll_once_a_second():
    from tests.unit.shard_harness import DEP, Shard, make_spec, run

    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(2, backpressure_config={
            "status_code": 429, "retry_after_s": 5, "retry_after_policy": "cluster_informed"}))
        key = (DEP.app, DEP.name)
        shard.core.report_router_demand(key, "router-a", RouterDemand(7, 2.0, 9.0))
        shard.core.report_router_demand(key, "router-b", RouterDemand(3, 2.0, 1.0))
        await shard.step()
        published = shard.core.routing.payload(str(DEP))
        assert published.demand == ClusterDemand(10, 4.0, 10.0, 2)
        assert len(published.replicas) == 2  # the replicas stay as they were
        shard.core.report_router_demand(key, "router-b", RouterDemand(30, 2.0, 1.0))
        await shard.step()  # the same second: not yet
        assert shard.core.routing.payload(str(DEP)).demand.queued == 10
        await shard.advance(1.0, ticks=1)
        assert shard.core.routing.payload(str(DEP)).demand.queued == 37
    run(scenario)


def test_other_policies_publish_no_demand():
    from tests.unit.shard_harness import DEP, Shard, make_spec, run

    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(1))
        shard.core.report_router_demand((DEP.app, DEP.name), "router-a", RouterDemand(7, 2.0, 9.0))
        await shard.advance(1.0, ticks=1)
        assert shard.core.routing.payload(str(DEP)).demand is None
    run(scenario)


class _Remote:
    def __init__(self, calls: list) -> None:
        self.remote = lambda *args: calls.append(args)


def test_a_subscriber_reports_while_there_is_demand_and_once_when_it_ends():
    from controlplane.routing.subscriber import RoutingSubscriber
    from controlplane.settings import Settings

    calls: list = []
    shard = type("Shard", (), {"report_router_demand": _Remote(calls)})()
    demands = {"app/model": RouterDemand(3, 1.0, 2.0), "app/idle": RouterDemand(0, 0.0, 0.0)}
    subscriber = RoutingSubscriber(Settings(), lambda key, update: None,
                                   demands=lambda: dict(demands))
    subscriber._known = {0: {"app/model": 1, "app/idle": 1}}
    subscriber._shards = {0: shard}  # as its long-poll of shard 0 left it
    assert subscriber.report_demand_once() == 1  # the idle router says nothing
    assert calls[0][0] == ("app", "model") and calls[0][2] == RouterDemand(3, 1.0, 2.0)
    demands["app/model"] = RouterDemand(0, 0.0, 0.0)
    assert subscriber.report_demand_once() == 1  # it went idle: said once...
    assert subscriber.report_demand_once() == 0  # ...and then nothing
