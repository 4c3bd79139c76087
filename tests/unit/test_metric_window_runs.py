"""MetricWindow's runs of equal loads and its batch intake (issue 13): counted, not timed.

A replica's newest run of equal loads is held as a count, so a steady replica stores no
sample one by one and its mean is never scaled anew; a node batch's loads reach the
window in one call. Checked here: the exact total against the definition while runs
break and rejoin at random (batches and single reports, the cap, membership changes,
batches behind the clock), then the work: samples stored, shares computed, queue entries
walked, and the window's calls per node batch in a shard.
"""

from __future__ import annotations

import math
import random

import pytest

from controlplane.deployment.autoscaling import MetricWindow
from controlplane.config.schema import AutoscalingConfig
from controlplane.wire import MetricReport, PushedHealth, report_row
from tests.unit.shard_harness import DEP, Shard, make_spec, run
from tests.unit.test_metric_window import (as_float, churn_history,
                                           counting, definition, held_walk,
                                           query_or_churn)
from tests.unit.virtual_time import wait_all_tasks_blocked

T0 = 1000.0
KEY = (DEP.app, DEP.name)


# --- equivalence -----------------------------------------------------------------------


@pytest.mark.parametrize("seed,cap", [(11, 3), (12, 64), (13, 1)])
def test_runs_of_few_loads_in_batches_equal_the_definition(seed, cap):
    """Loads from {0, 1, 2}, each replica's changing now and then: long runs, broken and
    rejoined, the cap reached while steady; reported as node batches (one time each, as
    the shard passes them) and one by one, with queries and membership changes between."""
    rng, look_back_s = random.Random(seed), 5.0
    ids = [f"r{i}" for i in range(8)]
    w = MetricWindow(look_back_period_s=look_back_s, max_samples_per_replica=cap)
    history: dict[str, list[tuple[float, int]]] = {}
    counted: set[str] = set()
    level = {rid: 1 for rid in ids}
    now, answered = T0, 0
    for _ in range(4_000):
        now += rng.choice([0.0, 0.1, 0.5, 2.0, 6.0])
        roll = rng.random()
        if roll < 0.6:
            batch = []
            for rid in rng.sample(ids, rng.randrange(1, len(ids) + 1)):
                if rng.random() < 0.1:
                    level[rid] = rng.randrange(3)
                batch.append((rid, level[rid]))
            if roll < 0.45:
                w.record_loads(batch, now)
            else:
                for rid, load in batch:
                    w.record_load(rid, load, now)
            for rid, load in batch:
                history[rid] = (history.get(rid, []) + [(now, load)])[-cap:]
        elif roll < 0.9:
            got = w.average_load(now)
            assert got == as_float(definition(history, counted, now, look_back_s, cap))
            answered += got is not None
        else:
            churn_history(rng, w, counted, ids, history)
    assert answered > 500


def test_batches_behind_the_clock_match_the_held_samples():
    """A batch received before another's newer one (never from one shard clock): each of
    its reports as ``record_load`` takes it, backwards ones refused."""
    rng, ids, w, ref, look_back_s = held_walk(17)
    clock = T0
    for _ in range(3_000):
        roll = rng.random()
        if roll < 0.5:
            at = clock + rng.uniform(-look_back_s - 1.0, 1.0)
            batch = [(rid, rng.choice([2, 2, 2, 5])) for rid in rng.sample(ids, 3)]
            if any(at < ref.last.get(rid, -math.inf) for rid, _ in batch):
                continue
            clock = max(clock, at)
            w.record_loads(batch, at)
            for rid, load in batch:
                ref.record(rid, load, at)
        else:
            clock = query_or_churn(rng, roll, w, ref, ids, clock, look_back_s)
    with pytest.raises(ValueError, match="backwards"):
        w.record_loads([("r0", 1)], clock - 2 * look_back_s)


# --- work ------------------------------------------------------------------------------


def steady(w: MetricWindow, ids: list[str], load: int, start: float, seconds: int) -> float:
    """Each replica reports ``load`` once a second, all in one batch: the shard's case."""
    for s in range(seconds):
        w.record_loads([(rid, load) for rid in ids], start + s)
    return start + seconds - 1


def test_a_steady_replica_stores_no_sample_and_computes_no_share():
    ids = ["a", "b", "c"]
    w = MetricWindow(look_back_period_s=30.0)
    w.include_only(ids)
    now = steady(w, ids, 2, T0, 100)
    stats = w.statistics()
    assert w.average_load(now) == 6.0
    assert stats.samples == 3 * 31  # [now - 30, now], once a second
    assert stats.stored == 0  # each a run of 2s: a count
    assert stats.shares_computed == 3  # each one's first sample; expiries moved no mean
    assert stats.entries_walked == 3 * (100 - 31)  # each expired report, once
    # "b" changes its load: its 2s are stored one by one while 4s follow them out
    now = steady(w, ["b"], 4, now + 0.5, 1)
    assert w.statistics().stored == 30  # its 2s since now - 30
    now = steady(w, ids, 4, now + 0.5, 40)
    assert w.average_load(now) == 12.0
    stats = w.statistics()
    assert stats.stored == 0  # the 2s left: a run again
    steady(w, ids, 4, now + 1, 60)
    assert w.statistics().shares_computed == stats.shares_computed  # steady: none more


def test_a_report_equal_to_the_mean_moves_nothing():
    w = MetricWindow(look_back_period_s=30.0)
    w.include("a")
    for i, load in enumerate([1, 3]):
        w.record_load("a", load, T0 + i)
    shares = w.statistics().shares_computed
    w.record_load("a", 2, T0 + 2)  # the mean was 2, and stays 2
    assert w.average_load(T0 + 2) == 2.0
    assert w.statistics().shares_computed == shares


def test_the_cap_reached_while_steady_drops_the_oldest_by_its_queue_entry():
    w = MetricWindow(look_back_period_s=100.0, max_samples_per_replica=4)
    w.include("a")
    for i in range(10):
        w.record_load("a", 5, T0 + i)
    stats = w.statistics()
    assert (stats.samples, stats.stored, stats.arrivals) == (4, 0, 10)
    w.record_load("a", 1, T0 + 10)  # the three newest 5s and this 1
    assert w.average_load(T0 + 10) == 4.0
    assert w.average_load(T0 + 107.5) == 11 / 3  # the 5 of T0 + 7 left on time
    assert w.average_load(T0 + 108.5) == 3.0
    assert w.average_load(T0 + 111) is None
    assert w.statistics().entries_walked == 11  # every entry once, the skipped ones too


async def batched_autoscaled_work(n: int, reporters: int) -> tuple[int, int, int]:
    """An autoscaled deployment of n replicas, ``reporters`` of them in one node batch
    every 0.1 s tick for 3 s (steady load, healthy), look-back 1 s. Returns the window
    modules' calls during ingest, the samples it stores one by one, and the shares it
    computes, in the last 2 s."""
    auto = AutoscalingConfig(min_replicas=1, max_replicas=2 * n, initial_replicas=n,
                             target_ongoing_requests=1.0, upscale_delay_s=0.0,
                             downscale_delay_s=0.0, look_back_period_s=1.0).model_dump()
    shard = Shard()
    await shard.deploy(make_spec(n, autoscaling_config=auto), ticks=4)
    state = shard.core.deployment(DEP)
    ids = sorted(r["replica_id"] for r in shard.replicas())[:reporters]
    files = ("controlplane/deployment/autoscaling.py", "controlplane/deployment/metric_window.py")
    calls = shares = 0
    for t in range(30):
        shard.clock.advance(0.1)
        health = PushedHealth(True, shard.clock.monotonic(), 0)
        rows = [report_row(MetricReport(rid, n // reporters, 0, health)) for rid in ids]
        if t == 10:
            shares = state.autoscaler.statistics().shares_computed
        with counting(files, ()) as ingest:
            shard.core.report_batch({KEY: rows})
        calls += ingest["calls"] if t >= 10 else 0
        shard.core.tick()
        await wait_all_tasks_blocked()
    assert state.target_replicas == n  # the reporters' means, exactly
    stats = state.autoscaler.statistics()
    return calls, stats.stored, stats.shares_computed - shares


def test_a_node_batch_hands_its_loads_to_the_window_in_one_call():
    async def scenario():
        few, many = await batched_autoscaled_work(40, 4), await batched_autoscaled_work(40, 40)
        calls, stored, shares = many
        assert calls == few[0]  # per batch, whatever its rows: the rows cost no call
        assert calls <= 20 * 3  # record_loads, and the expiry of the batch before
        assert (stored, shares) == (0, 0) == few[1:]
    run(scenario)
