"""The Retry-After evaluation harness (issue 14): its replica model and clients around the
real Router, in virtual time. No Ray; each run is a few simulated seconds."""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import replace

import pytest

from controlplane.clock import FakeClock
from controlplane.deployment.demand_board import DemandBoard
from controlplane.wire import RouterDemand
from release_tests.retry_after_eval import goal_lines, policy_rows
from release_tests.retry_after_http import Run, measures
from release_tests.retry_after_shapes import SHAPES, Shape, seeded_arrivals
from release_tests.retry_after_sim import (Outcome, PolicyRow, ScaleUp, SimConfig, SimReplicas,
                                           metrics, simulate)
from tests.unit.virtual_time import run_virtual

STATIC_1 = PolicyRow("static_1s", "static", 1.0)
DRAIN = PolicyRow("router_queue_drain_rate", "router_queue_drain_rate", 1.0)
SHORT = SimConfig(warmup_s=2.0, duration_s=10.0)
QUARTER = Shape("quarter", False, 0.25, lambda t, d: 0.25, "constant 0.25x capacity")


def _measured_arrivals(shape: Shape, config: SimConfig, seed: int) -> int:
    start, end = config.window
    times = itertools.takewhile(lambda t: t < end, seeded_arrivals(shape, config, seed))
    return sum(1 for t in times if t >= start)


@pytest.mark.parametrize("mode", ["once", "until"])
def test_every_measured_arrival_ends_admitted_and_completed_or_finally_rejected(
        mode: str) -> None:
    config = replace(SHORT, mode=mode, give_up_after_s=5.0, routers=2)
    result = simulate(SHAPES["const5x"], STATIC_1, config, seed=1)

    assert len(result.outcomes) == _measured_arrivals(SHAPES["const5x"], config, 1)
    admitted = {o.request_id for o in result.outcomes if o.done_at is not None}
    assert admitted and admitted < result.completed_ids  # ran to the end on a replica
    for o in result.outcomes:
        assert o.attempts == len(o.retry_afters) + (o.done_at is not None)
        assert o.attempts <= (2 if mode == "once" else 6)  # 1 s apart, gives up past 5 s
    # the replicas lose nothing: every request that reached one finished, or was cut by
    # the teardown (background load only: measured requests all had their outcome)
    assert result.started == len(result.completed_ids) + result.cancelled
    assert result.busy_slot_s <= config.max_ongoing * config.duration_s


def test_a_run_is_deterministic_for_a_seed() -> None:
    config = replace(SHORT, routers=2)
    first = simulate(SHAPES["poisson1x"], DRAIN, config, seed=7)
    assert simulate(SHAPES["poisson1x"], DRAIN, config, seed=7) == first
    assert simulate(SHAPES["poisson1x"], DRAIN, config, seed=8) != first


def test_far_under_capacity_nothing_is_rejected() -> None:
    result = simulate(QUARTER, STATIC_1, SHORT, seed=0)
    m = metrics(result, SHORT)
    assert m["arrivals"] == 10  # 1 per s for 10 s
    assert m["first_try_rejected_pct"] == 0.0 and m["finally_rejected_pct"] == 0.0
    assert m["retries_admitted_pct"] is None  # nothing to retry
    assert m["latency_p99_s"] == pytest.approx(0.502)  # the handler and two 1 ms hops
    # 1 req/s x 0.5 s of 2 slot-seconds per second busy; +-1 for the window edges
    assert m["idle_capacity_pct"] == pytest.approx(75.0, abs=1.0)


def test_at_five_times_capacity_most_first_tries_are_rejected() -> None:
    m = metrics(simulate(SHAPES["const5x"], STATIC_1, SHORT, seed=0), SHORT)
    assert m["first_try_rejected_pct"] > 70.0  # 4 of 20 req/s can be served
    assert m["idle_capacity_pct"] < 1.0  # and the replica never idles
    assert m["goodput_per_s"] == pytest.approx(4.0, abs=0.2)
    assert m["retry_after_p50_s"] == 1


def test_static_is_one_row_per_value_and_computed_policies_fall_back_to_the_first() -> None:
    rows = policy_rows(["static", "router_queue_drain_rate"], [5.0, 1.0])
    assert [(r.label, r.policy, r.retry_after_s) for r in rows] == [
        ("static_5s", "static", 5.0), ("static_1s", "static", 1.0),
        ("router_queue_drain_rate", "router_queue_drain_rate", 5.0)]


def test_goals_compare_the_computed_policy_with_static() -> None:
    base = {"first_try_rejected_pct": 50.0, "retries_admitted_pct": 10.0,
            "finally_rejected_pct": 45.0, "idle_capacity_pct": 1.0, "goodput_per_s": 4.0,
            "attempts_per_admitted": 3.0, "latency_p50_s": 1.0, "latency_p99_s": 6.0}
    good = {**base, "retries_admitted_pct": 96.0, "idle_capacity_pct": 4.0}
    rows = policy_rows(["static", "new"], [5.0])
    lines = goal_lines({"poisson1x": {"static_5s": base, "new": good},
                        "const2x": {"static_5s": base, "new": {**base, "latency_p99_s": 6.6}}},
                       rows)
    assert [line.split(": ")[-1].split(" (")[0] for line in lines] == [
        "new MET", "new MISSED", "new MISSED"]
    assert "const2x latency_p99_s 6.60 vs 6.00" in lines[2]  # 10% worse than static


def test_a_scale_up_serves_mid_window_and_the_shard_view_shows_it_starting() -> None:
    shape = replace(SHAPES["scaleup"], start_s=4.0)
    result = simulate(shape, STATIC_1, SHORT, seed=3)
    # 1 replica for the 10 s window, 1 more for its last 6 s; 2 slots each
    assert result.slot_s == pytest.approx(SHORT.max_ongoing * (10.0 + 6.0))
    m = metrics(result, SHORT)
    assert m["goodput_per_s"] > SHORT.capacity_per_s  # the second replica served

    clock = FakeClock(0.0)
    scale_up, board = ScaleUp(shape, SHORT), DemandBoard()
    board.note_start(4.0)
    board.record("router-0", RouterDemand(3, 4.0, 6.0), 0.0)
    seen = []

    async def watch() -> None:
        replicas = SimReplicas(clock, SHORT, random.Random(0))
        task = asyncio.get_running_loop().create_task(scale_up.run(replicas, [], clock))
        for at in (1.0, 3.0, 5.0, 7.0):  # window from 2 s; serving from 6 s
            await asyncio.sleep(at - clock.monotonic())
            board.record("router-0", RouterDemand(3, 4.0, 6.0), at)
            total = board.total(at, scale_up)
            seen.append((total.scaleup_eta_s, total.capacity_growth, len(replicas.infos())))
        await task
    run_virtual(clock, watch)
    assert seen == [(None, 1.0, 1), (3.0, 2.0, 1), (1.0, 2.0, 1), (None, 1.0, 2)]


def test_the_http_run_is_measured_by_the_simulations_own_metrics():
    run = Run((10.0, 20.0))
    run.outcomes += [Outcome(0, 10.5, 1, (), 11.0),  # admitted at once
                     Outcome(1, 11.0, 2, (5,), 16.5),  # rejected, admitted on retry
                     Outcome(2, 12.0, 2, (5, 5), None)]  # rejected twice
    run.completions += [9.9, 11.0, 16.5, 19.0, 20.5]  # 3 inside the window
    m = measures(run)
    assert (m["arrivals"], m["first_try_rejected_pct"], m["retries_admitted_pct"]) == \
        (3, pytest.approx(200 / 3), 50.0)
    assert m["goodput_per_s"] == pytest.approx(0.3)
    # 3 x 0.5 s of work in 2 slots x 10 s
    assert m["idle_capacity_pct"] == pytest.approx(92.5)
    assert m["retry_after_p50_s"] == 5 and m["latency_p99_s"] == pytest.approx(5.5)
