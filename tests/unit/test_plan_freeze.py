"""The shard's collector during a big plan (plan_freeze.py): frozen after each slice, given
back when the slices stop or at the cap; the shard drives it (counted, never timed)."""

from __future__ import annotations

from controlplane.plan_freeze import NoFreeze, PlanFreeze
from tests.unit.shard_harness import Shard, make_spec, run
from tests.unit.virtual_time import wait_all_tasks_blocked


class Collector:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


def test_frozen_from_the_first_slice_until_a_tick_with_no_slice_to_come():
    gc = Collector()
    plan = PlanFreeze(gc, max_frozen_s=60.0)
    plan.at_tick(False, 0.0)
    assert gc.calls == []  # never frozen: nothing to give back
    plan.after_slice(1.0)
    plan.after_slice(1.1)
    plan.at_tick(True, 1.2)  # still slicing
    assert gc.calls == ["freeze", "freeze"] and plan.frozen
    plan.at_tick(False, 1.3)
    plan.at_tick(False, 1.4)
    assert gc.calls == ["freeze", "freeze", "unfreeze"] and not plan.frozen


def test_a_shard_that_never_stops_slicing_still_thaws_at_the_cap():
    gc = Collector()
    plan = PlanFreeze(gc, max_frozen_s=60.0)
    plan.after_slice(0.0)
    for now in range(1, 60):
        plan.after_slice(float(now))
        plan.at_tick(True, float(now))
    assert "unfreeze" not in gc.calls
    plan.at_tick(True, 60.0)  # 60 s since the first freeze
    assert gc.calls[-1] == "unfreeze" and not plan.frozen
    plan.after_slice(60.5)  # the next slice starts a new window
    assert plan.frozen and (gc.calls.count("freeze"), gc.calls.count("unfreeze")) == (61, 1)


def test_unit_tests_get_python_s_collector_as_it_is():
    gc = Collector()
    plan = NoFreeze(gc)
    plan.after_slice(0.0)
    plan.at_tick(False, 1.0)
    assert not plan.frozen and gc.calls == []


def test_the_shard_freezes_after_its_slices_and_thaws_at_its_next_tick():
    async def scenario():
        shard = Shard(transitions_per_slice=4)
        gc = Collector()
        shard.core.collector = PlanFreeze(gc)
        shard.core.apply([make_spec(10)], [])  # a tick, then slices of 4
        await wait_all_tasks_blocked()
        assert shard.core.work.slices == 2 and gc.calls == ["freeze", "freeze"]
        shard.core.tick()  # no slice to come: the plan's objects go back to the collector
        assert gc.calls == ["freeze", "freeze", "unfreeze"]
        assert not shard.core.collector.frozen
    run(scenario)
