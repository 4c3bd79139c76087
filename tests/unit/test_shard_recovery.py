"""A restarted shard re-adopts the live replicas of its deployments without restarting any.

The "restart" is a second ``ShardCore`` over the same fake replica client (the replicas
outlive the shard actor, as detached Ray actors do), given the same desired specs, as the
controller does when it sees a shard come back.
"""

from __future__ import annotations

from controlplane.replica_client import ReplicaCallFailed
from controlplane.shard import ShardCore
from tests.unit.shard_harness import DEP, Shard, deployed, make_spec, run
from tests.unit.virtual_time import wait_all_tasks_blocked


class Restarted:
    """A fresh shard core taking over from ``old``: same replicas, same clock."""

    def __init__(self, old: Shard) -> None:
        self.old = old
        self.core = ShardCore(0, old.settings, old.client, old.clock)

    async def apply(self, ticks: int = 3) -> None:
        self.core.apply([make_spec(3)], [])
        await self.step(ticks)

    async def step(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.core.tick()
            await wait_all_tasks_blocked()

    def status(self) -> dict:
        return self.core.status()["deployments"][str(DEP)]

    def ranks(self) -> dict[str, int]:
        return {r["replica_id"]: r["rank"] for r in self.status()["replicas"]
                if r["state"] == "RUNNING"}

    def routed(self) -> list[str] | None:
        entry = self.core.routing.snapshot({}, watch_all=True).get(str(DEP))
        return None if entry is None else [r.replica_id for r in entry[1].replicas]


def test_live_replicas_are_adopted_with_their_ids_and_ranks_and_none_is_restarted():
    async def scenario():
        old = await deployed(3)
        before, created = old.serving_ranks(), len(old.client.created)
        new = Restarted(old)
        await new.apply()
        assert new.ranks() == before
        assert new.status()["status"] == "HEALTHY"
        assert len(old.client.created) == created  # nothing started
        assert old.client.ids("stop") == [] and old.client.ids("kill") == []
        assert sorted(new.routed()) == sorted(before)
        assert sorted(old.client.ids("describe")) == sorted(before)
    run(scenario)


def test_nothing_is_planned_or_routed_until_adoption_is_done():
    async def scenario():
        old = await deployed(3)
        old.client.hold("describe")
        new = Restarted(old)
        await new.apply(ticks=5)
        assert new.routed() is None  # routers keep the replica set they had
        assert new.status()["replicas"] == [] and new.status()["status"] == "UPDATING"
        assert "re-adopting" in new.status()["message"]
        assert old.client.created == [f"{DEP.app}#{DEP.name}#{i}" for i in range(3)]
        old.client.release_all("describe")
        await new.step(2)
        assert len(new.ranks()) == 3 and len(new.routed()) == 3
    run(scenario)


def test_reconcile_resumes_a_replica_killed_after_recovery_is_replaced():
    async def scenario():
        old = await deployed(3)
        new = Restarted(old)
        await new.apply()
        victim = old.id_of_rank(1)
        old.client.crash(victim)
        await new.step(3)
        ranks = new.ranks()
        assert victim not in ranks and sorted(ranks.values()) == [0, 1, 2]
        assert old.client.created[-1] == f"{DEP.app}#{DEP.name}#3"  # ids never reused
    run(scenario)


def test_a_replica_failing_its_fresh_check_or_not_answering_is_replaced():
    async def scenario():
        old = await deployed(3)
        sick, mute, fine = (old.id_of_rank(r) for r in range(3))
        old.client.handles[sick].fresh_check_error = "HealthCheckFailed: boom"
        old.client.set_outcome("describe", ReplicaCallFailed("timed out"), replica_id=mute)
        new = Restarted(old)
        await new.apply(ticks=4)
        assert mute in old.client.ids("kill") and sick in old.client.ids("stop")
        ranks = new.ranks()
        assert fine in ranks and sick not in ranks and mute not in ranks
        assert sorted(ranks.values()) == [0, 1, 2]
    run(scenario)


def test_a_replica_that_never_finished_starting_is_not_adopted():
    async def scenario():
        shard = Shard()
        starting = f"{DEP.app}#{DEP.name}#0"
        shard.client.hold("initialize", replica_id=starting)  # the constructor never ends
        await shard.deploy(make_spec(1))
        assert shard.client.held("initialize") == [starting]
        new = Restarted(shard)
        new.core.apply([make_spec(1)], [])
        await new.step(3)
        assert starting in shard.client.ids("kill")
        assert list(new.ranks()) == [f"{DEP.app}#{DEP.name}#1"]
    run(scenario)
