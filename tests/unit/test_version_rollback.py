"""A new version that fails rolls back to the one that served (issue 17): through the
shard's real objects, fakes for the replicas, virtual time."""

from __future__ import annotations

from collections import Counter

from controlplane.replica_client import ReplicaCallFailed
from tests.unit.shard_harness import TRACEBACK, Shard, make_spec, run
from tests.unit.test_shard_push_health import PERIOD, push


def versions(shard: Shard) -> Counter:
    return Counter((r["version"], r["state"]) for r in shard.replicas())


async def rolled_to_v2(shard: Shard) -> list[str]:
    """v1 serving on 2 replicas, then v2 deployed and fully rolled in; v2's ids."""
    await shard.deploy(make_spec(2, "v1"))
    await shard.deploy(make_spec(2, "v2"), ticks=12)
    assert versions(shard) == Counter({("v2", "RUNNING"): 2})
    return [r["replica_id"] for r in shard.replicas()]


def test_a_new_version_turning_unhealthy_after_starting_rolls_back():
    async def scenario():
        shard = Shard()
        new = await rolled_to_v2(shard)
        threshold = shard.settings.shard.unhealthy_threshold
        await shard.advance(PERIOD / 2)
        push(shard, new[0], healthy=False, failures=threshold)
        await shard.step(12)
        assert new[0] in shard.client.ids("stop")
        created_v1 = [rid for rid in shard.client.created
                      if shard.client.handles[rid].init.code_version == "v1"]
        assert len(created_v1) == 4  # the 2 before, and 2 again after the rollback
        assert versions(shard) == Counter({("v1", "RUNNING"): 2})  # v2 retired as v1 came up
        dep = shard.status()
        assert dep["status"] == "DEPLOY_FAILED"
        assert "turned unhealthy" in dep["message"]
        assert "rolled back to version v1, which keeps serving" in dep["message"]
    run(scenario)


def test_unhealthy_after_the_proving_window_is_an_ordinary_replacement():
    async def scenario():
        shard = Shard()
        new = await rolled_to_v2(shard)
        settings = shard.settings.shard
        periods = settings.rollout_proving_periods + settings.unhealthy_threshold
        await shard.advance(PERIOD * periods + 1)
        push(shard, new[0], healthy=False, failures=settings.unhealthy_threshold)
        await shard.step(6)
        assert versions(shard) == Counter({("v2", "RUNNING"): 2})
        assert shard.status()["status"] == "HEALTHY"
    run(scenario)


def test_a_proven_rollout_settles_and_a_later_replacement_cannot_roll_it_back():
    async def scenario():
        shard = Shard()
        new = await rolled_to_v2(shard)
        settings = shard.settings.shard
        await shard.advance(PERIOD * (settings.rollout_proving_periods
                                      + settings.unhealthy_threshold) + 1)
        shard.client.crash(new[0])  # replaced by a v2 replica, which then turns unhealthy
        await shard.step(4)
        [fresh] = set(r["replica_id"] for r in shard.replicas()) - set(new)
        push(shard, fresh, healthy=False, failures=settings.unhealthy_threshold)
        await shard.step(6)
        assert versions(shard) == Counter({("v2", "RUNNING"): 2})
        assert shard.status()["status"] == "HEALTHY"
    run(scenario)


def test_a_new_version_that_cannot_start_rolls_back_and_replaces_old_deaths():
    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(2, "v1"))
        old = [r["replica_id"] for r in shard.replicas()]
        shard.client.set_outcome("initialize", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(2, "v2"))
        for _ in range(10):  # the start budget is spent, backoff and all
            await shard.advance(30.0)
        dep = shard.status()
        assert dep["status"] == "DEPLOY_FAILED" and "rolled back to version v1" in dep["message"]
        assert versions(shard) == Counter({("v1", "RUNNING"): 2})
        shard.client.set_outcome("initialize", "ok")
        shard.client.crash(old[0])  # an old replica dies after the rollback: replaced
        await shard.step(4)
        assert versions(shard) == Counter({("v1", "RUNNING"): 2})
        assert shard.client.handles[shard.client.created[-1]].init.code_version == "v1"
    run(scenario)
