"""Push health through the shard: ShardCore + DeploymentState + ReplicaOps on fakes.

The pure rules are tested in test_gate.py / test_stall_guard.py; here the shell is
checked end to end on a FakeClock: pushes arrive through ``report_metrics`` and
``report_health`` (the real ingest methods), probes go to ``FakeReplicaClient``, and the
death watch fails when the test crashes a replica.
"""

from __future__ import annotations

from collections import Counter

from controlplane.health.stall_guard import STALL_MIN_TRACKED
from controlplane.replica_client import ReplicaCallFailed
from controlplane.wire import MetricReport, PushedHealth
from tests.unit.shard_harness import DEP, Shard, make_spec, run

KEY = (DEP.app, DEP.name)
PERIOD = make_spec().health_check_period_s  # 10 s


def push(shard: Shard, rid: str, healthy: bool = True, failures: int = 0,
         heartbeat: bool = False) -> None:
    """One pushed result, checked now on the replica's clock (the fake clock here)."""
    health = PushedHealth(healthy, shard.clock.monotonic(), failures)
    if heartbeat:
        shard.core.report_health(KEY, rid, health)
    else:
        shard.core.report_metrics(KEY, MetricReport(rid, 0, 0, health=health))


def push_all(shard: Shard) -> None:
    for rid in running(shard):
        push(shard, rid)


def running(shard: Shard) -> list[str]:
    return [r["replica_id"] for r in shard.replicas() if r["state"] == "RUNNING"]


def health_stats(shard: Shard):
    return shard.core.status()["health"]


async def deployed(n: int, **settings) -> Shard:
    shard = Shard(**settings)
    await shard.deploy(make_spec(n))
    assert shard.status()["status"] == "HEALTHY"
    return shard


def test_fresh_pushes_stand_in_for_probes_and_probes_resume_when_they_stop():
    async def scenario():
        shard = await deployed(3)
        for _ in range(6):  # a push every period: never stale
            push_all(shard)
            await shard.advance(PERIOD)
        assert shard.client.ids("check_health") == []
        stats = health_stats(shard)
        assert (stats.pushes_total, stats.pull_probes_total) == (18, 0)

        await shard.advance(0.5 * PERIOD - 0.25)  # pushes stop; 1.5 periods not reached
        assert shard.client.ids("check_health") == []
        await shard.advance(0.25)
        assert len(shard.client.ids("check_health")) == 3
        assert health_stats(shard).pull_probes_total == 3
    run(scenario)


def test_unhealthy_push_at_the_threshold_replaces_only_that_replica():
    async def scenario():
        shard = await deployed(3)
        threshold = shard.settings.shard.unhealthy_threshold
        victim, *others = running(shard)
        for failures in range(1, threshold):
            await shard.advance(PERIOD / 2)  # each push is a newer result
            push(shard, victim, healthy=False, failures=failures)
            await shard.step()
            assert shard.client.ids("stop") == []
            assert not next(r for r in shard.replicas() if r["replica_id"] == victim)["healthy"]
        await shard.advance(PERIOD / 2)
        push(shard, victim, healthy=False, failures=threshold, heartbeat=True)
        await shard.step(3)
        assert shard.client.ids("stop") == [victim]
        assert victim not in shard.client.ids("check_health")  # the push alone was enough
        assert set(others) <= set(running(shard)) and len(shard.client.created) == 4
        stats = health_stats(shard)
        assert stats.heartbeats_total == 1
        assert stats.health_check_failures_total == threshold  # one per acted-on failure
    run(scenario)


def test_a_push_arriving_while_a_probe_is_in_flight_wins_over_the_probe():
    async def scenario():
        shard = await deployed(1)
        rid = running(shard)[0]
        shard.client.hold("check_health")
        await shard.advance(PERIOD)  # no push yet: the pull schedule probes
        assert shard.client.held("check_health") == [rid]
        shard.clock.advance(1.0)
        push(shard, rid)  # healthy, arrives while the probe is in flight
        shard.client.fail("check_health", rid, ReplicaCallFailed("timed out"))
        await shard.step(2)
        replica = shard.replicas()[0]
        assert replica["healthy"] is True
        assert health_stats(shard).health_check_failures_total == 0  # dropped: not counted
    run(scenario)


def test_pushes_from_a_stopping_replica_are_ignored():
    async def scenario():
        shard = await deployed(2)
        shard.client.hold("stop")
        await shard.deploy(make_spec(1))
        stopping = next(r["replica_id"] for r in shard.replicas() if r["state"] == "STOPPING")
        before = health_stats(shard).pushes_total
        push(shard, stopping, healthy=False, failures=3)
        await shard.step()
        assert health_stats(shard).pushes_total == before
    run(scenario)


def test_a_crashed_replica_is_replaced_at_once_by_the_death_watch_without_a_probe():
    async def scenario():
        shard = await deployed(3)
        victim = shard.id_of_rank(1)
        shard.client.crash(victim)
        await shard.step(2)
        assert shard.client.ids("check_health") == []
        assert victim not in shard.serving_ranks()
        assert shard.states() == Counter(RUNNING=3)
        assert shard.serving_ranks()[shard.client.created[3]] == 1
    run(scenario)


def test_stall_episode_defers_probes_but_not_death_detection():
    async def scenario():
        n = 2 * STALL_MIN_TRACKED
        shard = await deployed(n)
        push_all(shard)
        await shard.advance(PERIOD)
        push_all(shard)
        await shard.step()
        # Every push goes stale at once (ingest lag): visits come due together.
        for _ in range(8):
            await shard.advance(PERIOD / 2)
        stats = health_stats(shard)
        assert stats.stall_episodes_total == 1
        assert stats.pull_probes_total < n  # deferred once the verdict engaged
        probes = stats.pull_probes_total
        victim = running(shard)[-1]
        shard.client.crash(victim)
        await shard.step(2)
        assert victim not in running(shard)  # death detection is unaffected by the guard
        assert health_stats(shard).pull_probes_total == probes
        assert shard.client.ids("stop") == []  # no healthy replica replaced
    run(scenario)


def test_status_reports_replica_health_from_the_acted_on_observation():
    async def scenario():
        shard = await deployed(2)
        a, b = running(shard)
        push(shard, a, healthy=False, failures=1)
        push(shard, b)
        await shard.step()
        healthy = {r["replica_id"]: r["healthy"] for r in shard.replicas()}
        assert healthy == {a: False, b: True}
        message = next(r["message"] for r in shard.replicas() if r["replica_id"] == a)
        assert "self health check failed" in message
        await shard.advance(1.0)  # a newer result
        push(shard, a)
        await shard.step()
        assert all(r["healthy"] for r in shard.replicas())
    run(scenario)


def test_a_redeploy_with_new_health_timings_tells_serving_replicas_once():
    async def scenario():
        shard = await deployed(2)
        await shard.deploy(make_spec(2, health_check_period_s=2.0, health_check_timeout_s=1.0))
        calls = shard.client.calls_to("update_health_timings")
        assert sorted(c.replica_id for c in calls) == sorted(running(shard))
        assert {c.args for c in calls} == {(2.0, 1.0)}
        await shard.deploy(make_spec(2, health_check_period_s=2.0, health_check_timeout_s=1.0))
        assert len(shard.client.calls_to("update_health_timings")) == 2  # unchanged: no call
        await shard.advance(PERIOD)  # the visit armed under the old period comes first...
        assert len(shard.client.ids("check_health")) == 2
        await shard.advance(2.0)  # ...then the pull cadence follows the new period
        assert len(shard.client.ids("check_health")) == 4
    run(scenario)
