"""The status summary: O(1) per deployment, equal to what the full listing says, filtered
at the source.

Work is counted, not timed: the deployment's ``ReplicaSet`` and ``DeploymentHealth`` are
wrapped in a delegating counter, and a summary of 1,000 replicas must make exactly the
calls a summary of 10 makes, none of them a walk (``records``, ``ids_in``) or a per-replica
read (``get``, ``failures``).
"""

from __future__ import annotations

import random
from collections import Counter

from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.reconcile import (DeploymentSnapshot, ReplicaView, StatusCounts,
                                    deployment_status, status_from_counts)
from controlplane.specs import DeploymentId
from controlplane.status import assemble_status
from controlplane.wire import MetricReport, PushedHealth
from tests.unit.shard_harness import DEP, Shard, make_spec, run

LIVE_STATES = (ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.UPDATING,
               ReplicaState.STOPPING)


# ---- the pure twin -------------------------------------------------------------------------

def random_snapshot(rng: random.Random) -> DeploymentSnapshot:
    views = tuple(ReplicaView(f"r{i}", rng.choice(LIVE_STATES), rng.choice("ab"),
                              rng.choice("xy"), i) for i in range(rng.randrange(7)))
    return DeploymentSnapshot(target_replicas=rng.randrange(5), target_version=rng.choice("ab"),
                              target_config_version=rng.choice("xy"), replicas=views,
                              deleting=rng.random() < 0.1)


def test_status_from_counts_agrees_with_the_snapshot_status_on_random_states():
    rng = random.Random(13)
    words = Counter()
    for _ in range(20_000):
        s = random_snapshot(rng)
        failed, unhealthy = rng.random() < 0.1, rng.random() < 0.3
        word = deployment_status(s, failed, unhealthy)
        assert status_from_counts(StatusCounts.of(s), failed, unhealthy) == word, s
        words[word] += 1
    assert set(words) == {"HEALTHY", "UPDATING", "UNHEALTHY", "DEPLOY_FAILED", "DELETING"}


# ---- counting work -----------------------------------------------------------------------

class Counting:
    """Delegates every attribute to ``inner``; counts the methods called through it."""

    def __init__(self, inner) -> None:
        self.__dict__.update(_inner=inner, calls=Counter())

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)
        return counted

    def __len__(self) -> int:
        self.calls["__len__"] += 1
        return len(self._inner)

    def __contains__(self, item) -> bool:
        self.calls["__contains__"] += 1
        return item in self._inner


async def settled(n: int, shard: Shard | None = None, dep: DeploymentId = DEP) -> Shard:
    shard = shard or Shard()
    shard.core.apply([make_spec(n, id=dep)], [])
    while shard.core.status(summary=True)["deployments"][str(dep)]["status"] != "HEALTHY":
        await shard.step()
    return shard


def summary_work(shard: Shard, dep: DeploymentId = DEP) -> tuple[dict, Counter]:
    """The summary entry of ``dep`` and the calls it made on its replicas and health."""
    d = shard.core.deployment(dep)
    replicas, health = Counting(d.book.replicas), Counting(d.health)
    d.book.replicas, d.health = replicas, health
    try:
        entry = shard.core.status(summary=True)["deployments"][str(dep)]
    finally:
        d.book.replicas, d.health = replicas._inner, health._inner
    return entry, replicas.calls + health.calls


PER_REPLICA = ("records", "ids_in", "get", "failures", "running_ids", "__contains__")


def test_a_summary_of_1000_replicas_does_the_work_of_a_summary_of_10():
    async def scenario():
        small, small_work = summary_work(await settled(10))
        large, work = summary_work(await settled(1000))
        assert work == small_work
        assert not any(work[name] for name in PER_REPLICA), work
        assert large["replica_counts"] == {"STARTING": 0, "RUNNING": 1000, "UPDATING": 0,
                                           "STOPPING": 0}
        assert (large["status"], large["healthy_replicas"]) == ("HEALTHY", 1000)
        assert "replicas" not in large and "replicas" not in small
    run(scenario)


def test_a_summary_during_a_rollout_looks_only_at_replicas_in_flight():
    async def scenario():
        shard = await settled(1000)
        shard.client.hold("initialize")
        shard.core.apply([make_spec(1000, code_version="v2")], [])
        await shard.step(3)
        entry, work = summary_work(shard)
        counts = entry["replica_counts"]
        in_flight = counts["STARTING"] + counts["STOPPING"] + counts["UPDATING"]
        assert 0 < in_flight <= 200 and counts["RUNNING"] == 1000
        assert work["records"] == 0 and work["get"] == in_flight
        assert entry["status"] == shard.status()["status"] == "UPDATING"
    run(scenario)


# ---- the summary equals the full listing -----------------------------------------------------

def assert_summary_agrees(shard: Shard) -> dict:
    """The summary is the full entry without its rows, and its counts are the rows'."""
    full = shard.core.status()["deployments"][str(DEP)]
    summary = shard.core.status(summary=True)["deployments"][str(DEP)]
    assert summary == {k: v for k, v in full.items() if k != "replicas"}
    rows = full["replicas"]
    assert +Counter(summary["replica_counts"]) == Counter(r["state"] for r in rows)
    assert summary["healthy_replicas"] == sum(r["healthy"] for r in rows)
    return summary


def push(shard: Shard, rid: str, healthy: bool, failures: int) -> None:
    health = PushedHealth(healthy, shard.clock.monotonic(), failures)
    shard.core.report_metrics((DEP.app, DEP.name), MetricReport(rid, 0, 0, health=health))


def serving(shard: Shard) -> list[str]:
    return [r["replica_id"] for r in shard.replicas() if r["state"] in ("RUNNING", "UPDATING")]


async def random_step(shard: Shard, rng: random.Random) -> None:
    """One random thing happening to the deployment: a redeploy (count, code, config),
    starts or stops parked or let go, a health push, a crash, time passing."""
    roll = rng.random()
    if roll < 0.2:
        shard.core.apply([make_spec(rng.randrange(6), code_version=rng.choice(["v1", "v2"]),
                                    user_config={"k": rng.randrange(2)})], [])
    elif roll < 0.35:
        method = rng.choice(["initialize", "stop", "reconfigure"])
        if rng.random() < 0.5:
            shard.client.hold(method)
        else:
            shard.client.set_outcome(method, "ok")
            shard.client.release_all(method)
    elif roll < 0.7 and serving(shard):
        healthy = rng.random() < 0.5
        push(shard, rng.choice(serving(shard)), healthy, 0 if healthy else rng.randrange(1, 4))
    elif roll < 0.75 and serving(shard):
        shard.client.crash(rng.choice(serving(shard)))
    else:
        shard.clock.advance(rng.choice([0.5, 5.0, 30.0]))
    await shard.step()


def test_the_summary_agrees_with_the_full_listing_through_random_histories():
    async def scenario():
        rng = random.Random(7)
        words, unhealthy_seen = Counter(), 0
        for _ in range(12):
            shard = Shard()
            await shard.deploy(make_spec(3))
            for _ in range(60):
                await random_step(shard, rng)
                summary = assert_summary_agrees(shard)
                words[summary["status"]] += 1
                counts = summary["replica_counts"]
                unhealthy_seen += counts["RUNNING"] + counts["UPDATING"] > \
                    summary["healthy_replicas"]
        assert {"HEALTHY", "UPDATING"} <= set(words)
        assert unhealthy_seen  # the histories did reach failing replicas
    run(scenario)


def test_a_failing_replica_is_counted_until_it_passes_again():
    async def scenario():
        shard = await settled(3)
        victim = serving(shard)[0]
        push(shard, victim, healthy=False, failures=1)
        await shard.step()
        assert assert_summary_agrees(shard)["healthy_replicas"] == 2
        shard.clock.advance(5.0)
        push(shard, victim, healthy=True, failures=0)
        await shard.step()
        assert assert_summary_agrees(shard)["healthy_replicas"] == 3
    run(scenario)


# ---- filters at the source -----------------------------------------------------------------

def test_filters_build_entries_only_for_the_deployments_asked_for():
    async def scenario():
        ids = [DeploymentId("app", "model"), DeploymentId("app", "other"),
               DeploymentId("shop", "model")]
        shard = Shard()
        for dep in ids:
            await settled(2, shard, dep)
        wrapped = {dep: Counting(shard.core.deployment(dep).book.replicas) for dep in ids}
        for dep, counting in wrapped.items():
            shard.core.deployment(dep).book.replicas = counting

        def shown(**filters) -> list[str]:
            answer = shard.core.status(**filters)
            assert answer["deployments_owned"] == 3
            return sorted(answer["deployments"])
        assert shown(app="app", deployment="model") == ["app/model"]
        assert wrapped[ids[0]].calls["records"] > 0  # the full listing walked it, only it
        assert not any(wrapped[d].calls for d in ids[1:])
        assert shown(app="shop") == ["shop/model"]
        assert shown(deployment="model") == ["app/model", "shop/model"]
        assert wrapped[ids[1]].calls["records"] == 0
        assert shown(app="nope") == [] and shown(summary=True) == [str(d) for d in ids]
    run(scenario)


def test_a_steady_shard_s_work_counters_stand_still_but_its_ticks_and_reach_status():
    async def scenario():
        shard = await settled(50)
        await shard.step(3)  # the rank pass once the last start is in
        before = shard.core.status()["work"]
        await shard.step(30)
        after = shard.core.status()["work"]
        assert after["ticks"] == before["ticks"] + 30
        assert {k: v for k, v in after.items() if k not in ("ticks", "last_tick_s")} == \
            {k: v for k, v in before.items() if k not in ("ticks", "last_tick_s")}
        assert before["replica_inits_built"] == 1 and before["rank_probes"] >= 50
        [entry] = assemble_status(None, [shard.core.status(summary=True)], 1)["controller"]["shards"]
        assert entry["work"] == shard.core.status()["work"]
    run(scenario)
