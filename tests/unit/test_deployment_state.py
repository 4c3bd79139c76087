"""A shard reconciling one deployment against FakeReplicaClient, on a FakeClock.

Each test drives ``ShardCore`` (or ``DeploymentState``) inside ``asyncio.run``: the test
calls ``tick()`` itself and yields to the loop with ``asyncio.sleep(0)`` so the owned
tasks (start, stop, probe, reconfigure) run; time moves only by ``FakeClock.advance``.

ShardCore.apply() also starts the shard's own reconcile loop, which ticks once and then
sleeps on the real clock for ``tick_interval_s``. The harness sets that interval to an
hour, so the loop contributes exactly one tick (at the first yield after the first apply)
and is cancelled with the event loop when the test ends.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

import pytest

from controlplane import reconcile
from controlplane.clock import FakeClock
from controlplane.deployment_state import DeploymentState
from controlplane.replica_client import ReplicaCallFailed, ReplicaDied
from controlplane.replica_ops import ReplicaOps
from controlplane.settings import Settings, ShardSettings
from controlplane.shard import ShardCore
from controlplane.specs import DeploymentId, DeploymentSpec
from tests.unit.fakes import FakeReplicaClient

DEP = DeploymentId("app", "model")
LOOP_PARKED_S = 3600.0  # the shard's own loop ticks once, then waits past the test
YIELDS_PER_TICK = 4  # deep enough for the longest task chain (reconfigure fails -> stop)
TRACEBACK = 'Traceback (most recent call last):\n  File "model.py", line 3\nValueError: boom'
SERVING = ("RUNNING", "UPDATING")


def make_spec(num_replicas: int = 3, code_version: str = "v1", user_config=None,
              **changes) -> DeploymentSpec:
    spec = DeploymentSpec(
        id=DEP, ingress=True, code_version=code_version, serialized_def=b"",
        num_replicas=num_replicas, max_ongoing_requests=5, max_queued_requests=-1,
        user_config=user_config, autoscaling_config=None, health_check_period_s=10.0,
        health_check_timeout_s=30.0, graceful_shutdown_timeout_s=20.0,
        backpressure_config={"status_code": 503, "retry_after_s": None},
        ray_actor_options={"num_cpus": 1})
    return replace(spec, **changes)


class Shard:
    """ShardCore wired to fakes, with helpers to step the loop and read status."""

    def __init__(self, **shard_settings) -> None:
        self.settings = Settings(shard=ShardSettings(tick_interval_s=LOOP_PARKED_S,
                                                     **shard_settings))
        self.client = FakeReplicaClient()
        self.clock = FakeClock()
        self.core = ShardCore(0, self.settings, self.client, self.clock)

    async def step(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.core.tick()
            for _ in range(YIELDS_PER_TICK):
                await asyncio.sleep(0)

    async def deploy(self, spec: DeploymentSpec, ticks: int = 3) -> None:
        self.core.apply([spec], [])
        await self.step(ticks)

    async def delete(self, ticks: int = 3) -> None:
        self.core.apply([], [DEP])
        await self.step(ticks)

    async def advance(self, seconds: float, ticks: int = 2) -> None:
        self.clock.advance(seconds)
        await self.step(ticks)

    def status(self) -> dict | None:
        return self.core.status()["deployments"].get(str(DEP))

    def replicas(self) -> list[dict]:
        return self.status()["replicas"]

    def states(self) -> Counter:
        return Counter(r["state"] for r in self.replicas())

    def serving_ranks(self) -> dict[str, int]:
        return {r["replica_id"]: r["rank"] for r in self.replicas() if r["state"] in SERVING}

    def id_of_rank(self, rank: int) -> str:
        return next(rid for rid, r in self.serving_ranks().items() if r == rank)


def run(scenario) -> None:
    asyncio.run(scenario())


async def deployed(n: int = 3, **spec_changes) -> Shard:
    shard = Shard()
    await shard.deploy(make_spec(n, **spec_changes))
    assert shard.status()["status"] == "HEALTHY"
    return shard


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


def test_user_config_change_reconfigures_in_place():
    async def scenario():
        shard = await deployed(3, user_config={"threshold": 1})
        ranks_before = shard.serving_ranks()
        shard.client.hold("reconfigure")
        await shard.deploy(make_spec(3, user_config={"threshold": 2}))
        assert sorted(shard.client.ids("reconfigure")) == sorted(ranks_before)
        assert all(c.args[0] == {"threshold": 2} for c in shard.client.calls_to("reconfigure"))
        assert shard.states() == Counter(UPDATING=3)  # still serving while reconfiguring
        assert shard.status()["status"] == "UPDATING"

        shard.client.release_all("reconfigure")
        await shard.step(2)
        assert shard.status()["status"] == "HEALTHY"
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


def test_failed_reconfigure_replaces_the_replica_with_the_new_config():
    async def scenario():
        shard = await deployed(1, user_config={"k": 1})
        old = shard.client.created[0]
        shard.client.set_outcome("reconfigure", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(1, user_config={"k": 2}), ticks=4)
        assert shard.client.ids("stop") == [old]
        assert len(shard.client.created) == 2
        new = shard.client.created[1]
        assert shard.client.handles[new].init.user_config == {"k": 2}
        assert shard.serving_ranks() == {new: 0}
        assert shard.status()["status"] == "HEALTHY"
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


# -- constructor failures -----------------------------------------------------------------


def test_constructor_failure_backs_off_then_deploy_fails_with_traceback():
    async def scenario():
        shard = Shard()
        assert shard.settings.shard.max_constructor_retries == 3
        shard.client.set_outcome("initialize", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(1), ticks=5)
        assert len(shard.client.created) == 1
        assert shard.client.ids("kill") == shard.client.created
        assert shard.replicas() == []  # a failed start leaves no record
        assert shard.status()["status"] == "UPDATING"
        assert "ValueError: boom" in shard.status()["message"]

        # backoff 0.5 s after the first failure, then 1.0 s
        await shard.advance(0.25)
        assert len(shard.client.created) == 1
        await shard.advance(0.25)
        assert len(shard.client.created) == 2
        await shard.advance(0.5)
        assert len(shard.client.created) == 2
        await shard.advance(0.5)
        assert len(shard.client.created) == 3

        dep = shard.status()
        assert dep["status"] == "DEPLOY_FAILED"
        assert dep["message"].startswith(f"replica {shard.client.created[2]} failed to start")
        assert TRACEBACK in dep["message"]
        await shard.advance(3600.0, ticks=5)
        assert len(shard.client.created) == 3
        assert shard.status()["status"] == "DEPLOY_FAILED"
    run(scenario)


def test_backoff_is_capped_at_start_backoff_max_s():
    async def scenario():
        shard = Shard(max_constructor_retries=10, start_backoff_initial_s=1.0,
                      start_backoff_max_s=2.0)
        shard.client.set_outcome("initialize", ReplicaDied("actor died in __init__"))
        await shard.deploy(make_spec(1))
        for expected_delay in (1.0, 2.0, 2.0, 2.0):
            created = len(shard.client.created)
            await shard.advance(expected_delay - 0.5)
            assert len(shard.client.created) == created
            await shard.advance(0.5)
            assert len(shard.client.created) == created + 1
    run(scenario)


def test_redeploy_after_deploy_failed_starts_again_at_once():
    async def scenario():
        shard = Shard(max_constructor_retries=1)
        shard.client.set_outcome("initialize", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(1))
        assert shard.status()["status"] == "DEPLOY_FAILED"
        shard.client.set_outcome("initialize", "ok")
        await shard.deploy(make_spec(1, code_version="v2"))
        assert len(shard.client.created) == 2
        assert shard.status()["status"] == "HEALTHY"
    run(scenario)


def test_a_successful_start_resets_the_failure_count():
    async def scenario():
        shard = Shard(max_constructor_retries=2)
        await shard.deploy(make_spec(1))
        first = shard.client.created[0]
        shard.client.set_outcome("initialize", ReplicaCallFailed("boom"))
        shard.client.set_outcome("check_health", ReplicaDied("gone"), first)
        await shard.advance(10.0)  # first dies; its replacement fails once
        assert len(shard.client.created) == 2
        shard.client.set_outcome("initialize", "ok")
        await shard.advance(0.5)  # the next start succeeds
        assert len(shard.client.created) == 3
        shard.client.set_outcome("initialize", ReplicaCallFailed("boom"))
        shard.client.set_outcome("check_health", ReplicaDied("gone"))
        await shard.advance(10.0)  # one more failure is not two in a row
        assert len(shard.client.created) == 4
        assert shard.status()["status"] != "DEPLOY_FAILED"
    run(scenario)


# -- health -----------------------------------------------------------------------------


def test_failing_health_checks_in_a_row_replace_the_replica_on_its_rank():
    async def scenario():
        shard = await deployed(3)
        threshold = shard.settings.shard.unhealthy_threshold
        period = make_spec().health_check_period_s
        victim = shard.id_of_rank(1)
        shard.client.set_outcome("check_health", ReplicaCallFailed("probe failed"), victim)
        for _ in range(threshold - 1):
            await shard.advance(period)
            assert shard.client.ids("stop") == []
        assert not next(r for r in shard.replicas() if r["replica_id"] == victim)["healthy"]
        assert shard.status()["status"] == "HEALTHY"  # one bad probe is not a verdict

        shard.client.hold("initialize")
        shard.client.hold("stop")  # the victim drains while its replacement starts
        await shard.advance(period)
        assert shard.client.ids("check_health").count(victim) == threshold
        assert shard.client.ids("stop") == [victim]
        assert len(shard.client.created) == 4
        replacement = shard.client.created[3]
        assert shard.client.handles[replacement].init.rank == 1
        assert shard.states() == Counter(RUNNING=2, STOPPING=1, STARTING=1)
        assert shard.status()["status"] == "UNHEALTHY"

        shard.client.release_all("initialize")
        shard.client.release_all("stop")
        await shard.step(2)
        assert shard.serving_ranks()[replacement] == 1
        assert sorted(shard.serving_ranks().values()) == [0, 1, 2]
        assert shard.status()["status"] == "HEALTHY"
    run(scenario)


def test_health_failures_must_be_consecutive():
    async def scenario():
        shard = await deployed(1)
        rid = shard.client.created[0]
        period = make_spec().health_check_period_s
        for outcome in [ReplicaCallFailed("x"), ReplicaCallFailed("x"), "ok",
                        ReplicaCallFailed("x"), ReplicaCallFailed("x")]:
            shard.client.set_outcome("check_health", outcome, rid)
            await shard.advance(period)
        assert shard.client.ids("check_health") == [rid] * 5
        assert shard.client.ids("stop") == []
        shard.client.set_outcome("check_health", ReplicaCallFailed("x"), rid)
        await shard.advance(period)
        assert shard.client.ids("stop") == [rid]
    run(scenario)


def test_health_checks_run_once_per_period_on_the_fake_clock():
    async def scenario():
        shard = await deployed(2)
        await shard.advance(9.75)
        assert shard.client.ids("check_health") == []
        await shard.advance(0.25)
        assert len(shard.client.ids("check_health")) == 2
        await shard.step(5)
        assert len(shard.client.ids("check_health")) == 2
        await shard.advance(10.0)
        assert len(shard.client.ids("check_health")) == 4
    run(scenario)


def test_replica_died_on_a_probe_is_replaced_at_once():
    async def scenario():
        shard = await deployed(3)
        victim = shard.id_of_rank(2)
        shard.client.set_outcome("check_health", ReplicaDied("actor died"), victim)
        await shard.advance(make_spec().health_check_period_s)
        assert shard.client.ids("check_health").count(victim) == 1
        assert len(shard.client.created) == 4
        replacement = shard.client.created[3]
        assert victim not in shard.serving_ranks()
        assert shard.serving_ranks()[replacement] == 2
        assert shard.status()["status"] == "HEALTHY"
    run(scenario)


# -- delete ---------------------------------------------------------------------------------


def test_deleting_stops_all_replicas_then_the_deployment_disappears():
    async def scenario():
        shard = await deployed(2)
        shard.client.hold("stop")
        await shard.delete()
        assert sorted(shard.client.ids("stop")) == sorted(shard.client.created)
        assert shard.status()["status"] == "DELETING"
        assert shard.states() == Counter(STOPPING=2)

        shard.client.release_all("stop")
        await shard.step(2)
        assert shard.status() is None
        assert shard.core.status()["deployments"] == {}
        assert all(h.killed for h in shard.client.handles.values())
        assert len(shard.client.created) == 2
    run(scenario)


def test_deleting_while_replicas_start_stops_them_too():
    async def scenario():
        shard = Shard()
        shard.client.hold("initialize")
        await shard.deploy(make_spec(2))
        await shard.delete()
        assert sorted(shard.client.ids("stop")) == sorted(shard.client.created)
        assert shard.status() is None
    run(scenario)


# -- steady state -------------------------------------------------------------------------


@contextmanager
def counting_calls(func):
    """Count calls of ``func`` by watching the interpreter, changing nothing it runs."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is func.__code__:
            calls.append(frame)

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_steady_state_ticks_do_not_plan_or_walk_replicas():
    async def scenario():
        client, clock = FakeReplicaClient(), FakeClock()
        tasks: set[asyncio.Task] = set()

        def spawn(coro):
            task = asyncio.get_running_loop().create_task(coro)
            tasks.add(task)
            return task

        settings = ShardSettings()
        state = DeploymentState(make_spec(5), settings, spawn, lambda d: ReplicaOps(
            d, client, clock, "shard_0", "ns"))
        for _ in range(4):
            state.tick(clock.monotonic())
            await asyncio.sleep(0)
        assert state.status(clock.monotonic())["status"] == "HEALTHY"
        calls, recomputes = len(client.calls), state.replicas.memo_recomputes
        passes = state.rank_gate.passes_run

        with counting_calls(reconcile.plan) as plans:
            for _ in range(200):
                state.tick(clock.monotonic())
                await asyncio.sleep(0)
        assert plans == []
        assert len(client.calls) == calls
        assert state.replicas.memo_recomputes == recomputes
        assert state.rank_gate.passes_run == passes
        # Every task finished cleanly, but the death watches: one pending call per replica.
        pending = [t for t in tasks if not t.done()]
        assert len(pending) == len(client.ids("wait_until_stopped")) == 5
        assert all(t.exception() is None for t in tasks if t.done())
    run(scenario)


def test_passing_health_checks_do_not_trigger_a_plan():
    async def scenario():
        shard = await deployed(3)
        with counting_calls(reconcile.plan) as plans:
            for _ in range(5):
                await shard.advance(10.0)
        assert plans == []
        assert len(shard.client.ids("check_health")) == 15
        assert len(shard.client.created) == 3
    run(scenario)


def test_plan_runs_again_once_something_changes():
    async def scenario():
        shard = await deployed(2)
        with counting_calls(reconcile.plan) as plans:
            await shard.deploy(make_spec(3))
        assert len(plans) >= 1
        assert len(shard.client.created) == 3
    run(scenario)


# -- outcomes that arrive after the replica moved on ---------------------------------------
# At 699ab2b each of these raised IllegalTransition inside an owned task (logged by the
# shard as "task failed"): the start/reconfigure outcome was applied to a STOPPING replica.


def no_errors_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_replica_stopped_while_starting_finishes_quietly(caplog):
    async def scenario():
        shard = Shard()
        shard.client.hold("initialize")
        await shard.deploy(make_spec(1))
        rid = shard.client.created[0]
        shard.client.hold("stop")
        await shard.deploy(make_spec(0))
        assert shard.client.ids("stop") == [rid]
        shard.client.release("initialize", rid)  # the constructor returns mid-drain
        await shard.step(2)
        assert shard.states() == Counter(STOPPING=1)
        shard.client.release("stop", rid)
        await shard.step(2)
        assert shard.replicas() == []
        assert shard.status()["status"] == "HEALTHY"
    with caplog.at_level(logging.ERROR):
        run(scenario)
    assert no_errors_logged(caplog) == []


def test_replica_stopped_while_starting_whose_constructor_fails_is_no_failure(caplog):
    async def scenario():
        shard = Shard(max_constructor_retries=1)
        shard.client.hold("initialize")
        await shard.deploy(make_spec(1))
        rid = shard.client.created[0]
        shard.client.hold("stop")
        await shard.deploy(make_spec(0))
        shard.client.fail("initialize", rid, ReplicaCallFailed(TRACEBACK))
        await shard.step(2)
        shard.client.release("stop", rid)
        await shard.step(2)
        dep = shard.status()
        assert (dep["status"], dep["message"]) == ("HEALTHY", "")
    with caplog.at_level(logging.ERROR):
        run(scenario)
    assert no_errors_logged(caplog) == []


def test_scale_down_with_a_config_change_reconfigures_only_the_survivors(caplog):
    async def scenario():
        shard = await deployed(3, user_config={"k": 1})
        keep = shard.id_of_rank(0)
        await shard.deploy(make_spec(1, user_config={"k": 2}))
        assert shard.serving_ranks() == {keep: 0}
        assert shard.client.ids("reconfigure") == [keep]
        assert shard.status()["status"] == "HEALTHY"
    with caplog.at_level(logging.ERROR):
        run(scenario)
    assert no_errors_logged(caplog) == []


@pytest.mark.parametrize("outcome", ["ok", ReplicaCallFailed(TRACEBACK)])
def test_replica_stopped_while_reconfiguring_finishes_quietly(caplog, outcome):
    async def scenario():
        shard = await deployed(2, user_config={"k": 1})
        shard.client.hold("reconfigure")
        await shard.deploy(make_spec(2, user_config={"k": 2}))
        victim = shard.id_of_rank(1)
        shard.client.hold("stop")
        await shard.deploy(make_spec(1, user_config={"k": 2}))  # stops the UPDATING one
        assert shard.client.ids("stop") == [victim]
        if outcome == "ok":  # the reconfigure returns mid-drain
            shard.client.release("reconfigure", victim)
        else:
            shard.client.fail("reconfigure", victim, outcome)
        shard.client.release_all("reconfigure")
        await shard.step(2)
        assert shard.states() == Counter(RUNNING=1, STOPPING=1)
        shard.client.release("stop", victim)
        await shard.step(2)
        assert shard.client.ids("stop") == [victim]
        assert shard.states() == Counter(RUNNING=1)
        assert len(shard.client.created) == 2
        dep = shard.status()
        assert (dep["status"], dep["message"]) == ("HEALTHY", "")
    with caplog.at_level(logging.ERROR):
        run(scenario)
    assert no_errors_logged(caplog) == []


# -- known bugs -----------------------------------------------------------------------------


def test_a_fixed_deploy_does_not_show_the_old_error_while_updating():
    async def scenario():
        shard = Shard(max_constructor_retries=1)
        shard.client.set_outcome("initialize", ReplicaCallFailed(TRACEBACK))
        await shard.deploy(make_spec(1))
        assert shard.status()["status"] == "DEPLOY_FAILED"
        shard.client.set_outcome("initialize", "ok")
        await shard.deploy(make_spec(1, code_version="v2"))
        assert shard.status()["status"] == "HEALTHY"
        shard.client.hold("initialize")
        await shard.deploy(make_spec(2, code_version="v2"))
        assert shard.status()["status"] == "UPDATING"
        assert shard.status()["message"] == ""
    run(scenario)
