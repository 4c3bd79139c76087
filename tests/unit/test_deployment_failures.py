"""Deployment-state shell: constructor failures, health, deletion, steady state, and
outcomes that arrive after a replica moved on."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from contextlib import contextmanager

import pytest

from controlplane.deployment import reconcile
from controlplane.deployment.planner import Planner
from controlplane.deployment.replica_ops import OpsContext, ReplicaOps
from controlplane.deployment.state import DeploymentState
from controlplane.deployment.work import WorkTotals
from controlplane.replica_client import ReplicaCallFailed, ReplicaDied
from controlplane.settings import Settings
from tests.unit.fakes import FakeReplicaClient
from tests.unit.virtual_time import loop_clock, wait_all_tasks_blocked

from tests.unit.shard_harness import Shard, TRACEBACK, deployed, make_spec, run


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


def test_a_slow_start_says_how_long_and_a_timed_out_one_says_what_it_was_doing():
    async def scenario():
        shard = Shard(replica_start_timeout_s=60.0)
        shard.client.hold("initialize")
        await shard.deploy(make_spec(1))
        await shard.advance(12.0)
        [replica] = shard.replicas()
        assert replica["state"] == "STARTING"
        assert replica["message"] == "starting for 12s (gives up after 60s and retries)"
        shard.client.phases[replica["replica_id"]] = "waiting for Ray to place it"
        assert shard.replicas()[0]["message"].startswith("waiting for Ray to place it for 12s")
        shard.client.fail("initialize", replica["replica_id"], asyncio.TimeoutError())
        await shard.step(2)
        message = shard.status()["message"]
        assert "not started within replica_start_timeout_s (60s)" in message
        assert "constructor or first health check was still running" in message
        assert "ray_actor_options {'num_cpus': 1}" in message
        await shard.advance(1.0)  # retried after the start backoff
        assert len(shard.client.created) == 2
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
        client, clock = FakeReplicaClient(), loop_clock()
        tasks: set[asyncio.Task] = set()

        def spawn(coro):
            task = asyncio.get_running_loop().create_task(coro)
            tasks.add(task)
            return task

        settings, work = Settings(), WorkTotals()
        context = OpsContext(client, clock, spawn, "shard_0", settings, work=work)
        state = DeploymentState(make_spec(5), settings.shard,
                                lambda d: ReplicaOps(d, context), work=work)
        for _ in range(4):
            state.tick(clock.monotonic())
            await wait_all_tasks_blocked()
        assert state.status(clock.monotonic())["status"] == "HEALTHY"
        calls, recomputes = len(client.calls), work.running_sets_built
        passes = work.rank_passes

        with counting_calls(Planner.next_slice) as plans:
            for _ in range(200):
                state.tick(clock.monotonic())
                await wait_all_tasks_blocked()
        assert plans == []
        assert len(client.calls) == calls
        assert work.running_sets_built == recomputes
        assert work.rank_passes == passes
        # Every task finished cleanly, but the death watches: one pending call per replica.
        pending = [t for t in tasks if not t.done()]
        assert len(pending) == len(client.ids("wait_until_stopped")) == 5
        assert all(t.exception() is None for t in tasks if t.done())
    run(scenario)


def test_passing_health_checks_do_not_trigger_a_plan():
    async def scenario():
        shard = await deployed(3)
        with counting_calls(Planner.next_slice) as plans:
            for _ in range(5):
                await shard.advance(10.0)
        assert plans == []
        assert len(shard.client.ids("check_health")) == 15
        assert len(shard.client.created) == 3
    run(scenario)


def test_plan_runs_again_once_something_changes():
    async def scenario():
        shard = await deployed(2)
        with counting_calls(Planner.next_slice) as plans:
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
        shard = Shard(rolling_surge_fraction=1.0)  # both reconfigure at once
        await shard.deploy(make_spec(2, user_config={"k": 1}))
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


# -- regressions -----------------------------------------------------------------------------


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


def test_a_scale_up_and_down_are_planned_from_counts_without_walking_replicas():
    """Issue 16: every tick of a scale-up or scale-down of code and config already on
    target plans from counts; a scale-down stops the highest ranks."""
    async def scenario():
        shard = await deployed(2)
        with counting_calls(reconcile.plan) as full, \
                counting_calls(Planner.next_slice) as ticks:
            await shard.deploy(make_spec(40))
            for _ in range(5):
                await shard.advance(0.1)
        assert len(shard.client.created) == 40 and ticks and full == []
        with counting_calls(reconcile.plan) as full:
            await shard.deploy(make_spec(10))
        assert full == []
        assert sorted(shard.serving_ranks().values()) == list(range(10))
    run(scenario)


def test_a_scale_up_keeps_at_most_max_starting_replicas_starting():
    async def scenario():
        shard = Shard(max_starting_replicas=4)
        shard.client.hold("initialize")
        await shard.deploy(make_spec(10))
        assert len(shard.client.created) == 4  # the rest wait for these to be RUNNING
        most_in_flight = 0
        while len(shard.client.held("initialize")):
            most_in_flight = max(most_in_flight, len(shard.client.held("initialize")))
            shard.client.release(*[("initialize", rid) for rid in
                                   shard.client.held("initialize")[:1]][0])
            await shard.step(2)
        assert most_in_flight == 4 and len(shard.client.created) == 10
    run(scenario)
