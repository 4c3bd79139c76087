"""A shard reconciling one deployment against FakeReplicaClient, on a FakeClock.

Each test drives ``ShardCore`` on the virtual-time loop (``shard_harness``): the test
ticks, the harness waits until the owned tasks (start, stop, probe, reconfigure) are
blocked again, and time moves only by ``FakeClock.advance``.

ShardCore.apply() also starts the shard's own reconcile loop, which ticks once and then
waits ``tick_interval_s``; the harness parks that interval far past any test, so the loop
contributes exactly one tick and is cancelled with the event loop when the test ends.
"""

from __future__ import annotations

from collections import Counter


from controlplane.replica_client import ReplicaCallFailed

from tests.unit.shard_harness import Shard, TRACEBACK, deployed, make_spec, run


# -- deploy -------------------------------------------------------------------------------


def test_deploy_three_replicas_creates_three_and_all_run_with_ranks_0_to_2():
    async def scenario():
        shard = Shard()
        shard.client.hold("initialize")
        await shard.deploy(make_spec(3))
        await shard.step(5)  # slow starts are expected, not started twice
        assert len(shard.client.created) == 3
        assert shard.states() == Counter(STARTING=3)
        assert shard.status()["status"] == "UPDATING"

        shard.client.release_all("initialize")
        await shard.step(2)
        assert shard.status()["status"] == "HEALTHY"
        assert shard.states() == Counter(RUNNING=3)
        assert sorted(shard.serving_ranks().values()) == [0, 1, 2]
        assert set(shard.serving_ranks()) == set(shard.client.created)
        assert len(shard.client.created) == 3
    run(scenario)


def test_replicas_are_created_with_the_spec_and_their_rank():
    async def scenario():
        shard = await deployed(2, user_config={"k": 1})
        for rid, rank in shard.serving_ranks().items():
            handle = shard.client.handles[rid]
            assert handle.init.rank == rank == handle.rank
            assert handle.init.user_config == {"k": 1}
            assert handle.spec.code_version == "v1"
            assert (handle.init.app_name, handle.init.deployment) == ("app", "model")
    run(scenario)


def test_status_json_lists_each_replica_with_its_fields():
    async def scenario():
        shard = await deployed(2)
        replicas = shard.replicas()
        assert [r["rank"] for r in replicas] == [0, 1]  # sorted by rank
        for r in replicas:
            assert r["replica_id"] in shard.client.created
            assert r["state"] == "RUNNING"
            assert r["healthy"] is True
            assert r["node_id"] == "node-a"
        dep = shard.status()
        assert (dep["target_replicas"], dep["version"], dep["message"]) == (2, "v1", "")
    run(scenario)


# -- scale ----------------------------------------------------------------------------


def test_scale_down_3_to_1_stops_highest_ranks_and_keeps_rank_0():
    async def scenario():
        shard = await deployed(3)
        rank_0, rank_1, rank_2 = (shard.id_of_rank(r) for r in range(3))
        shard.client.hold("stop")
        await shard.deploy(make_spec(1))
        assert shard.client.ids("stop") == [rank_2, rank_1]
        assert shard.states() == Counter(RUNNING=1, STOPPING=2)

        shard.client.release_all("stop")
        await shard.step(2)
        assert shard.serving_ranks() == {rank_0: 0}
        assert [r["replica_id"] for r in shard.replicas()] == [rank_0]
        assert shard.status()["status"] == "HEALTHY"
        assert len(shard.client.created) == 3
        assert shard.client.handles[rank_2].killed and shard.client.handles[rank_1].killed
    run(scenario)


def test_scale_up_keeps_existing_replicas_and_adds_next_ranks():
    async def scenario():
        shard = await deployed(2)
        before = shard.serving_ranks()
        await shard.deploy(make_spec(4))
        after = shard.serving_ranks()
        assert sorted(after.values()) == [0, 1, 2, 3]
        assert {rid: after[rid] for rid in before} == before
        assert len(shard.client.created) == 4 and shard.client.ids("stop") == []
    run(scenario)


# -- user_config ------------------------------------------------------------------------


def test_user_config_change_rolls_through_the_replicas_in_place():
    """Paced like a version: at most the surge (here 1 of 3) reconfigures at once."""
    async def scenario():
        shard = await deployed(3, user_config={"threshold": 1})
        ranks_before = shard.serving_ranks()
        shard.client.hold("reconfigure")
        await shard.deploy(make_spec(3, user_config={"threshold": 2}))
        for done in range(3):
            assert len(shard.client.held("reconfigure")) == 1
            assert shard.states() == Counter(RUNNING=2, UPDATING=1)  # all still serving
            assert shard.status()["status"] == "UPDATING"
            shard.client.release_all("reconfigure")
            await shard.step(2)
        assert shard.status()["status"] == "HEALTHY"
        assert sorted(shard.client.ids("reconfigure")) == sorted(ranks_before)
        assert all(c.args[0] == {"threshold": 2} for c in shard.client.calls_to("reconfigure"))
        assert shard.serving_ranks() == ranks_before
        assert len(shard.client.created) == 3 and shard.client.ids("stop") == []
        assert all(shard.client.handles[rid].user_config == {"threshold": 2}
                   for rid in ranks_before)
    run(scenario)


def test_same_user_config_again_reconfigures_nothing():
    async def scenario():
        shard = await deployed(2, user_config={"threshold": 1})
        await shard.deploy(make_spec(2, user_config={"threshold": 1}))
        assert shard.client.ids("reconfigure") == []
        assert len(shard.client.created) == 2
    run(scenario)


def test_a_failed_reconfigure_stops_the_rollout_and_the_old_config_keeps_serving():
    async def scenario():
        shard = await deployed(3, user_config={"k": 1})
        replicas = sorted(shard.serving_ranks())
        shard.client.hold("reconfigure")
        await shard.deploy(make_spec(3, user_config={"k": 2}))
        [first] = shard.client.held("reconfigure")  # the only one asked for {"k": 2}
        shard.client.set_outcome("reconfigure", "ok")
        shard.client.fail("reconfigure", first, ReplicaCallFailed(TRACEBACK))
        await shard.step(3)
        assert [c.args[0] for c in shard.client.calls_to("reconfigure")] == [{"k": 2}, {"k": 1}]
        assert shard.client.ids("reconfigure") == [first, first]  # told the old config again
        assert sorted(shard.serving_ranks()) == replicas and shard.states() == Counter(RUNNING=3)
        assert shard.client.ids("stop") == [] and len(shard.client.created) == 3
        dep = shard.status()
        assert dep["status"] == "DEPLOY_FAILED"
        assert "previous config keeps serving" in dep["message"] and "boom" in dep["message"]

        shard.client.crash(replicas[2])  # a replacement starts with the config that works
        await shard.step(3)
        assert shard.client.handles[shard.client.created[-1]].init.user_config == {"k": 1}
        assert shard.states() == Counter(RUNNING=3)

        await shard.deploy(make_spec(3, user_config={"k": 3}), ticks=8)  # a fixed config
        assert shard.status()["status"] == "HEALTHY"
        assert all(shard.client.handles[r].user_config == {"k": 3} for r in shard.serving_ranks())
    run(scenario)


def test_a_replica_that_cannot_take_the_old_config_back_is_replaced():
    async def scenario():
        shard = await deployed(1, user_config={"k": 1})
        old = shard.client.created[0]
        shard.client.set_outcome("reconfigure", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(1, user_config={"k": 2}), ticks=6)
        assert [c.args[0] for c in shard.client.calls_to("reconfigure")] == [{"k": 2}, {"k": 1}]
        assert shard.client.ids("stop") == [old]
        new = shard.client.created[1]
        assert shard.client.handles[new].init.user_config == {"k": 1}
        assert shard.serving_ranks() == {new: 0}
        assert shard.status()["status"] == "DEPLOY_FAILED"
    run(scenario)


# -- rolling update ---------------------------------------------------------------------


def test_code_version_change_rolls_to_new_replicas_with_compact_ranks():
    async def scenario():
        shard = await deployed(3)
        old_ids = set(shard.client.created)
        shard.client.hold("initialize")
        shard.core.apply([make_spec(3, code_version="v2")], [])
        surge = 1  # max(1, int(0.2 * 3))
        for _ in range(20):
            await shard.step()
            states = shard.states()
            assert states["RUNNING"] + states["UPDATING"] >= 3, states
            assert states["STARTING"] + states["RUNNING"] + states["UPDATING"] <= 3 + surge
            shard.client.release_all("initialize")
            await shard.step()
        assert shard.status()["status"] == "HEALTHY"
        ranks = shard.serving_ranks()
        assert sorted(ranks.values()) == [0, 1, 2]
        assert not set(ranks) & old_ids
        assert all(shard.client.handles[rid].spec.code_version == "v2" for rid in ranks)
        assert all(shard.client.handles[rid].killed for rid in old_ids)
        assert len(shard.client.created) == 6
        # every replica was told the rank the status reports
        assert {rid: shard.client.handles[rid].rank for rid in ranks} == ranks
    run(scenario)


def test_new_version_failing_to_construct_leaves_old_version_serving():
    async def scenario():
        shard = await deployed(2)
        old_ids = set(shard.client.created)
        shard.client.set_outcome("initialize", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(2, code_version="v2"))
        for _ in range(10):
            await shard.advance(60.0)
        dep = shard.status()
        assert dep["status"] == "DEPLOY_FAILED"
        assert "ValueError: boom" in dep["message"]
        assert set(shard.serving_ranks()) == old_ids
        assert shard.client.ids("stop") == []
        assert len(shard.client.created) == 2 + 3 * 2  # 3 tries per target replica
    run(scenario)
