"""Creating a replica actor can fail before any record exists: a detached actor of an
earlier shard still holds the name, or Ray refuses the options. Neither may leave a
replica stuck in STARTING."""

from __future__ import annotations

from tests.unit.shard_harness import DEP, Shard, make_spec, run


def test_a_taken_name_is_skipped_and_the_next_name_is_used():
    async def scenario():
        shard = Shard()
        shard.client.create_errors[f"{DEP.app}#{DEP.name}#0"] = ValueError("name is taken")
        await shard.deploy(make_spec(2))
        status = shard.status()
        assert status["status"] == "HEALTHY"
        assert sorted(r["replica_id"] for r in status["replicas"]) == [
            f"{DEP.app}#{DEP.name}#1", f"{DEP.app}#{DEP.name}#2"]
        assert sorted(shard.serving_ranks().values()) == [0, 1]
        assert shard.core.deployment(DEP).rollout.backoff.failures == 0
    run(scenario)


def test_a_refused_creation_counts_as_a_start_failure_and_backs_off():
    async def scenario():
        shard = Shard()
        shard.client.create_errors[f"{DEP.app}#{DEP.name}#0"] = RuntimeError("no such resource")
        await shard.deploy(make_spec(1))
        assert shard.status()["replicas"] == []  # nothing left STARTING
        assert "no such resource" in shard.core.deployment(DEP).rollout.backoff.last_error
        assert shard.client.created == []
        await shard.advance(shard.settings.shard.start_backoff_initial_s)
        assert shard.status()["status"] == "HEALTHY"
        assert shard.client.created == [f"{DEP.app}#{DEP.name}#1"]
    run(scenario)


def test_set_desired_deletes_what_it_leaves_out_and_is_idempotent():
    async def scenario():
        shard = Shard()
        shard.core.set_desired([make_spec(2)])
        await shard.step(3)
        assert shard.status()["status"] == "HEALTHY"
        shard.core.set_desired([make_spec(2)])  # the same push again changes nothing
        await shard.step(3)
        assert len(shard.client.created) == 2
        shard.core.set_desired([])  # a level-based push without it: deleted
        await shard.step(5)
        assert shard.status() is None
    run(scenario)
