"""A big plan is carried out a slice at a time (``ShardSettings.transitions_per_slice``):
the loop runs other work between slices, the rollout is not slowed, a plan that is not
cheap to redo is carried out whole, and a slice that raises is a counted tick error."""

from __future__ import annotations

import asyncio

from controlplane.deployment.lifecycle import ReplicaState
from tests.unit.shard_harness import DEP, Shard, make_spec, run
from tests.unit.virtual_time import wait_all_tasks_blocked


def test_a_scale_up_is_cut_into_slices_and_the_loop_runs_other_work_between_them():
    async def scenario():
        shard = Shard(transitions_per_slice=4)
        seen: list[int] = []

        def observe(times_left: int) -> None:  # other work, queued on the loop
            seen.append(len(shard.client.created))
            if times_left:
                asyncio.get_running_loop().call_soon(observe, times_left - 1)

        shard.core.apply([make_spec(10)], [])  # the shard's loop ticks at once...
        asyncio.get_running_loop().call_soon(observe, 3)  # ...queued behind it
        await wait_all_tasks_blocked()
        assert len(shard.client.created) == 10 and shard.core.work.slices == 2
        assert seen == [4, 8, 10, 10]  # between the slices, not after all of them
    run(scenario)


async def _rollout_ticks(per_slice: int) -> tuple[int, int]:
    shard = Shard(transitions_per_slice=per_slice, rolling_surge_fraction=0.5)
    await shard.deploy(make_spec(24))
    shard.core.apply([make_spec(24, code_version="v2")], [])
    replicas, ticks = shard.core.deployment(DEP).book.replicas, 0
    while replicas.count_state_version(ReplicaState.RUNNING, "v2") < 24 or len(replicas) > 24:
        await shard.advance(1.0, ticks=1)
        ticks += 1
    return ticks, shard.core.work.slices


def test_slicing_does_not_slow_a_rolling_update():
    async def scenario():
        whole, _ = await _rollout_ticks(0)
        sliced, slices = await _rollout_ticks(3)
        assert slices > 0 and sliced <= whole  # a slice re-plans: starts done since count
    run(scenario)


def test_a_deletion_is_carried_out_whole_in_its_tick():
    async def scenario():
        shard = Shard(transitions_per_slice=2)
        await shard.deploy(make_spec(10))
        shard.client.hold("stop")
        slices = shard.core.work.slices
        shard.core.apply([], [DEP])
        shard.core.tick()  # the full plan, not one cut from counts
        assert shard.states() == {"STOPPING": 10} and shard.core.work.slices == slices
    run(scenario)


def test_a_slice_that_raises_is_a_counted_tick_error_and_does_not_spin():
    async def scenario():
        shard = Shard(transitions_per_slice=2)
        shard.core.apply([make_spec(6)], [])
        await wait_all_tasks_blocked()
        state = shard.core.deployment(DEP)
        assert shard.core.work.slices == 2 and len(shard.client.created) == 6
        shard.core.apply([make_spec(12)], [])
        shard.core.tick()

        def broken(now: float) -> None:
            raise RuntimeError("bug in a slice")
        state.continue_slice = broken
        await wait_all_tasks_blocked()
        assert shard.core.health_totals.tick_errors_total == 1
        assert shard.core.work.slices == 3 and not state.more_now
        assert len(shard.client.created) == 8  # the tick's slice; the broken one did none
    run(scenario)
