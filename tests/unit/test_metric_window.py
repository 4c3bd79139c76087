"""MetricWindow's running total against a recount, and the work it does (counted, not timed).

The window keeps each replica's load sum and the sum of the counted replicas' means up to
date per report and per expiry (``controlplane.deployment.autoscaling``). Here random sequences of
reports, queries and membership changes are checked against references written for
clarity, not speed: the definition itself for the shard's case (one monotonic clock), and
a model of the held samples for reports and queries out of time order. Then the work: a
query walks what expired since the last one, never the replicas; and in a shard, an
autoscaled deployment with reports flowing ticks in work that does not grow with N.
"""

from __future__ import annotations

import math
import random
import sys
from contextlib import contextmanager
from fractions import Fraction

import pytest

from controlplane.deployment.autoscaling import MetricWindow
from controlplane.config.schema import AutoscalingConfig
from controlplane.deployment.replica_set import ReplicaSet
from controlplane.specs import DeploymentSpec
from controlplane.wire import MetricReport, PushedHealth
from tests.unit.shard_harness import DEP, Shard, make_spec, run
from tests.unit.virtual_time import wait_all_tasks_blocked

T0 = 1000.0
KEY = (DEP.app, DEP.name)


def report(replica_id: str, load: int) -> MetricReport:
    return MetricReport(replica_id, ongoing_requests=load, queued_requests=0)


# --- references ------------------------------------------------------------------------


def means(history: dict[str, list[tuple[float, int]]], counted: set[str], now: float,
          look_back_s: float, cap: int) -> list[Fraction]:
    """Per counted replica with one, the exact mean load of its last ``cap`` reports
    received within [now - look-back, now]."""
    found = []
    for replica_id in counted:
        loads = [load for t, load in history.get(replica_id, [])[-cap:]
                 if now - look_back_s <= t <= now]
        if loads:
            found.append(Fraction(sum(loads), len(loads)))
    return found


def definition(history: dict[str, list[tuple[float, int]]], counted: set[str], now: float,
               look_back_s: float, cap: int) -> Fraction | None:
    """The sum of those means; None when no counted replica has a report in the window."""
    found = means(history, counted, now, look_back_s, cap)
    return sum(found, Fraction(0)) if found else None


class HeldSamples:
    """The window's contract for any order of times: every sample older than the newest
    time seen minus the look-back is dropped; a query reads what is still held."""

    def __init__(self, look_back_s: float, cap: int) -> None:
        self.look_back_s, self.cap, self.clock = look_back_s, cap, -math.inf
        self.held: dict[str, list[tuple[float, int]]] = {}
        self.last: dict[str, float] = {}
        self.counted: set[str] = set()

    def _advance(self, t: float) -> None:
        self.clock = max(self.clock, t)
        for rid, samples in self.held.items():
            self.held[rid] = [s for s in samples if s[0] >= self.clock - self.look_back_s]

    def record(self, rid: str, load: int, at: float) -> None:
        if at < self.last.get(rid, -math.inf):
            raise ValueError("backwards")
        self.last[rid] = at
        self._advance(at)
        if at >= self.clock - self.look_back_s:
            self.held[rid] = (self.held.get(rid, []) + [(at, load)])[-self.cap:]

    def forget(self, rid: str) -> None:
        self.held.pop(rid, None)
        self.last.pop(rid, None)
        self.counted.discard(rid)

    def query(self, now: float) -> Fraction | None:
        self._advance(now)
        return definition(self.held, self.counted, now, self.look_back_s, self.cap)


def as_float(exact: Fraction | None) -> float | None:
    return None if exact is None else float(exact)


def change_membership(rng: random.Random, w: MetricWindow, counted: set[str],
                      ids: list[str]) -> str | None:
    """One random include / exclude / include_only on both; a replica to forget, or None."""
    rid, roll = rng.choice(ids), rng.random()
    if roll < 0.4:
        w.include(rid)
        counted.add(rid)
    elif roll < 0.7:
        w.exclude(rid)
        counted.discard(rid)
    elif roll < 0.8:
        chosen = set(rng.sample(ids, rng.randrange(len(ids))))
        w.include_only(chosen)
        counted.clear()
        counted.update(chosen)
    else:
        return rid
    return None


# --- equivalence -----------------------------------------------------------------------


@pytest.mark.parametrize("seed,cap,huge,steps", [(1, 3, False, 4_000), (2, 64, False, 4_000),
                                                 (3, 5, True, 10_000)])
def test_running_total_equals_the_definition_on_one_monotonic_clock(seed, cap, huge, steps):
    """Random steps; "huge" mixes loads of 1e15 with ones of 1, where float running sums
    would lose the small ones, over a long run. The total is exact, so it equals the
    correctly rounded definition, which is within 1e-9 of a float recount."""
    rng, look_back_s = random.Random(seed), 5.0
    ids = [f"r{i}" for i in range(12)]
    w = MetricWindow(look_back_period_s=look_back_s, max_samples_per_replica=cap)
    history: dict[str, list[tuple[float, int]]] = {}
    counted: set[str] = set()
    now, answered = T0, 0
    for _ in range(steps):
        now += rng.choice([0.0, 0.05, 0.3, 1.0, 7.0])  # ties, steps, jumps past the window
        roll = rng.random()
        if roll < 0.6:
            rid = rng.choice(ids)
            load = rng.choice([0, 1, 10**15]) if huge else rng.randrange(50)
            w.record(report(rid, load), received_at=now)
            history[rid] = (history.get(rid, []) + [(now, load)])[-cap:]
        elif roll < 0.85:
            got = w.average_load(now)
            assert got == as_float(definition(history, counted, now, look_back_s, cap))
            found = means(history, counted, now, look_back_s, cap)
            if found:
                recount = math.fsum(float(mean) for mean in found)
                assert got == pytest.approx(recount, rel=1e-9, abs=1e-9)
                answered += 1
        else:
            churn_history(rng, w, counted, ids, history)
    assert answered > steps // 10


def churn_history(rng: random.Random, w: MetricWindow, counted: set[str], ids: list[str],
                  history: dict) -> None:
    """A membership change, with the definition's history and counted set kept in step."""
    forgotten = change_membership(rng, w, counted, ids)
    if forgotten is not None:
        w.forget(forgotten)
        history.pop(forgotten, None)
        counted.discard(forgotten)


def held_walk(seed: int, look_back_s: float = 3.0) -> tuple:
    """A random walk's pieces: its rng, 6 replica ids, a window (cap 4) and the held
    samples it must match, and the look-back."""
    return (random.Random(seed), [f"r{i}" for i in range(6)],
            MetricWindow(look_back_period_s=look_back_s, max_samples_per_replica=4),
            HeldSamples(look_back_s, 4), look_back_s)


def query_or_churn(rng: random.Random, roll: float, w: MetricWindow, ref: HeldSamples,
                   ids: list[str], clock: float, look_back_s: float) -> float:
    """A random walk's other step: a query now, later or about the past (``roll`` <
    0.85), else a membership change; the clock after it."""
    if roll < 0.85:
        now = clock + rng.choice([0.0, 0.5, -1.0, -2 * look_back_s])
        assert w.average_load(now) == as_float(ref.query(now))
        return max(clock, now)
    forgotten = change_membership(rng, w, ref.counted, ids)
    if forgotten is not None:
        w.forget(forgotten)
        ref.forget(forgotten)
    return clock


def test_reports_and_queries_out_of_time_order_match_the_held_samples():
    rng, ids, w, ref, look_back_s = held_walk(7)
    clock = T0
    for _ in range(5_000):
        roll = rng.random()
        if roll < 0.55:  # a report up to 1 s after the clock, or behind it (another's newer)
            rid, load = rng.choice(ids), rng.randrange(20)
            at = clock + rng.uniform(-look_back_s - 1.0, 1.0)
            if at < ref.last.get(rid, -math.inf):
                with pytest.raises(ValueError, match="backwards"):
                    w.record(report(rid, load), received_at=at)
                continue
            clock = max(clock, at)
            ref.record(rid, load, at)
            w.record(report(rid, load), received_at=at)
        else:
            clock = query_or_churn(rng, roll, w, ref, ids, clock, look_back_s)


# --- membership and odd loads ----------------------------------------------------------


def test_reports_held_before_a_replica_counts_count_once_it_is_included():
    """A STARTING replica reports; its samples count from the moment it serves."""
    w = MetricWindow(look_back_period_s=10.0)
    w.include("a")
    w.record(report("a", 2), received_at=T0)
    w.record(report("starting", 40), received_at=T0 + 1)
    assert w.average_load(T0 + 1) == 2.0
    w.include("starting")
    assert w.average_load(T0 + 2) == 42.0
    w.exclude("starting")  # STOPPING: held, not counted
    assert w.average_load(T0 + 2) == 2.0
    w.exclude("never-seen")
    assert w.statistics().replicas == 2


def test_a_forgotten_replica_reporting_again_under_its_id_starts_afresh():
    w = MetricWindow(look_back_period_s=10.0, max_samples_per_replica=2)
    w.include("a")
    w.record(report("a", 100), received_at=T0)
    w.forget("a")
    w.include("a")
    w.record(report("a", 4), received_at=T0 + 1)
    w.record(report("a", 6), received_at=T0 + 2)
    # T0's queue entry expires first: it must not take out the new samples.
    assert w.average_load(T0 + 10.5) == 5.0
    assert w.average_load(T0 + 11.5) == 6.0
    assert w.average_load(T0 + 12.5) is None


def test_a_non_int_load_is_summed_per_query_and_leaves_with_its_sample():
    w = MetricWindow(look_back_period_s=2.0)
    w.include_only(["a", "b"])
    w.record(report("a", 3), received_at=T0)
    w.record(MetricReport("b", 0, 0), received_at=T0)
    w.record(_Garbled("b", math.nan), received_at=T0 + 1)
    assert math.isnan(w.average_load(T0 + 1))
    w.record(report("a", 3), received_at=T0 + 2)
    w.record(report("b", 1), received_at=T0 + 2)
    assert math.isnan(w.average_load(T0 + 2))
    assert w.average_load(T0 + 3.5) == 4.0  # the NaN left: back on the exact total
    walked = w.statistics().entries_walked
    assert w.average_load(T0 + 3.5) == 4.0
    assert w.statistics().entries_walked == walked  # no samples summed per query any more


class _Garbled:
    """A buggy sender's report: a float load (``MetricReport`` is typed int)."""

    def __init__(self, replica_id: str, load: float) -> None:
        self.replica_id, self.load = replica_id, load


def test_cap_is_bounded_so_the_scale_stays_small():
    with pytest.raises(ValueError, match="max_samples_per_replica"):
        MetricWindow(look_back_period_s=1.0, max_samples_per_replica=1025)


def autoscaled(max_replicas: int) -> DeploymentSpec:
    """A target that follows the load at once, 1 per replica, within [1, max_replicas]."""
    auto = AutoscalingConfig(min_replicas=1, max_replicas=max_replicas,
                             target_ongoing_requests=1.0, upscale_delay_s=0.0,
                             downscale_delay_s=0.0, look_back_period_s=30.0).model_dump()
    return make_spec(1, autoscaling_config=auto)


def test_in_a_shard_only_serving_replicas_reports_count():
    """As before the running total: a STARTING replica's reports are held and count once it
    is RUNNING; a STOPPING one's stop counting at once."""
    async def scenario():
        shard = Shard()
        await shard.deploy(autoscaled(max_replicas=6))
        state, [first] = shard.core.deployment(DEP), shard.client.created
        shard.client.hold("initialize")
        shard.core.report_metrics(KEY, MetricReport(first, 2, 0))
        await shard.advance(1.0)
        assert state.target_replicas == 2
        [second] = shard.client.held("initialize")
        shard.core.report_metrics(KEY, MetricReport(second, 3, 0))
        await shard.advance(1.0)
        assert state.target_replicas == 2  # 2 + 3 if the STARTING replica counted
        shard.client.release("initialize", second)
        await shard.step()
        assert shard.states()["RUNNING"] == 2
        await shard.advance(1.0)
        assert state.target_replicas == 5  # RUNNING: its report, held since, counts
        shard.client.hold("stop")
        await shard.deploy(autoscaled(max_replicas=1))  # clamps to 1: `second` stops
        await shard.deploy(autoscaled(max_replicas=6))  # same look-back: same window
        assert second in shard.client.held("stop")
        await shard.advance(1.0)
        assert state.target_replicas == 2  # 2 + 3 if the STOPPING replica counted
    run(scenario)


# --- work ------------------------------------------------------------------------------


def walked_by_queries(n: int) -> list[int]:
    """n replicas reporting once each over 10 s, 30 s look-back; later five report again.
    The expiry-queue entries each of four queries walks."""
    ids = [f"app#model#{i}" for i in range(n)]
    w = MetricWindow(look_back_period_s=30.0)
    w.include_only(ids)
    for i, rid in enumerate(ids):
        w.record(report(rid, 2), received_at=T0 + 10.0 * i / n)
    walked, before = [], w.statistics().entries_walked

    def query(now: float) -> float | None:
        nonlocal before
        load = w.average_load(now)
        walked.append(w.statistics().entries_walked - before)
        before = w.statistics().entries_walked
        return load

    assert query(T0 + 12.0) == 2 * n  # nothing due
    assert query(T0 + 45.0) is None  # every report expired: each walked once
    for rid in ids[:5]:
        w.record(report(rid, 3), received_at=T0 + 50.0)
    before = w.statistics().entries_walked  # a record expires too: count queries only
    assert query(T0 + 60.0) == 15  # nothing due
    assert query(T0 + 80.5) is None  # the five expired
    return walked


def test_a_query_walks_what_expired_not_the_replicas():
    assert walked_by_queries(10) == [0, 10, 0, 5]
    assert walked_by_queries(10_000) == [0, 10_000, 0, 5]


@contextmanager
def counting(files: tuple[str, ...], funcs: tuple) -> dict:
    """Python calls of code in ``files`` and of ``funcs``, by watching the interpreter."""
    counts = {"calls": 0, "walks": 0}
    codes = {f.__code__ for f in funcs}

    def profile(frame, event, arg):
        if event != "call":
            return
        if frame.f_code.co_filename.endswith(files):
            counts["calls"] += 1
        if frame.f_code in codes:
            counts["walks"] += 1

    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(None)


async def steady_autoscaled_work(n: int, reporters: int = 4) -> tuple[int, int, int]:
    """An autoscaled deployment of n replicas, ``reporters`` of them pushing a report (with
    health) every 0.1 s tick for 3 s; look-back 1 s, so samples expire all along. Returns
    the autoscaling module's calls during ticks, during ingest, and replica-set walks."""
    auto = AutoscalingConfig(min_replicas=1, max_replicas=2 * n, initial_replicas=n,
                             target_ongoing_requests=1.0, upscale_delay_s=0.0,
                             downscale_delay_s=0.0, look_back_period_s=1.0).model_dump()
    shard = Shard()
    await shard.deploy(make_spec(n, autoscaling_config=auto), ticks=4)
    assert shard.status()["status"] == "HEALTHY"
    ids = sorted(r["replica_id"] for r in shard.replicas())[:reporters]
    state = shard.core.deployment(DEP)
    recomputes = shard.core.work.running_sets_built
    files = ("controlplane/deployment/autoscaling.py", "controlplane/deployment/metric_window.py")
    walks = (ReplicaSet.records, ReplicaSet.ids_in)
    tick_calls = ingest_calls = walked = 0
    for _ in range(30):
        shard.clock.advance(0.1)
        health = PushedHealth(True, shard.clock.monotonic(), 0)
        with counting(files, walks) as ingest:
            for rid in ids:  # each carries n / reporters: the mean sum stays n
                shard.core.report_metrics(KEY, MetricReport(rid, n // reporters, 0, health))
        with counting(files, walks) as tick:
            shard.core.tick()
        await wait_all_tasks_blocked()
        tick_calls, ingest_calls = tick_calls + tick["calls"], ingest_calls + ingest["calls"]
        walked += tick["walks"] + ingest["walks"]
    assert state.target_replicas == n  # the window counted exactly the reporters' means
    assert shard.core.work.running_sets_built == recomputes
    return tick_calls, ingest_calls, walked


def test_steady_autoscaled_ticks_with_reports_flowing_do_not_grow_with_replicas():
    async def scenario():
        small, large = await steady_autoscaled_work(8), await steady_autoscaled_work(400)
        assert small == large  # same reports, same work, at 8 replicas and at 400
        tick_calls, ingest_calls, walked = large
        assert walked == 0
        assert tick_calls <= 3 * 8  # 3 autoscaling runs in 3 s, a few calls each
        assert ingest_calls <= 30 * 4 * 12  # per report: a record and its expiries
    run(scenario)
