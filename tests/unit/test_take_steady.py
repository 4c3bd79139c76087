"""The one fast path of pushes (``DeploymentHealth.take_steady``): a node batch taken at
once leaves every structure as its rows taken one by one (each a batch of one) do: gate
states, registry entries and their dirtiness, deadlines, counters and interval
statistics, and what the ticks after decide. Rows it does not take come back, in order,
for the general path."""

from __future__ import annotations

import dataclasses
import random

from controlplane.health.gate import ProbeOutcome, ProbeResult
from controlplane.health.stats import HealthTotals
from controlplane.health.push_health import DeploymentHealth, ProbeReplica
from controlplane.wire import PushedHealth, ReportRow

T0, P = 1000.0, 10.0
IDS = [f"r{i}" for i in range(40)]


def _pair() -> tuple[DeploymentHealth, DeploymentHealth]:
    batched, by_row = DeploymentHealth(P, HealthTotals()), DeploymentHealth(P, HealthTotals())
    for health in (batched, by_row):
        for rid in IDS[:-4]:  # the last few are never watched
            health.watch(rid, T0)
    return batched, by_row


def _rows(rng: random.Random, checked: dict[str, float]) -> list[ReportRow]:
    """A node batch: at most one row per replica (the batcher keeps the newest)."""
    rows = []
    for rid in rng.sample(IDS, rng.randrange(1, 30)):
        checked[rid] = checked.get(rid, 0.0) + rng.choice([1.0, 1.0, 1.0, 0.0, -0.5])
        healthy = rng.choice([True, True, True, True, False, None])
        failures = 0 if healthy is not False else rng.randrange(1, 4)
        rows.append(ReportRow(rid, 0, 0, healthy, checked[rid], failures,
                              "" if healthy else "bad"))
    return rows


def _general(health: DeploymentHealth, rows: list[ReportRow], now: float) -> None:
    """The general path of ``DeploymentState`` for each row (all rows here are well formed)."""
    for rid, _, _, healthy, checked_at, failures, error in rows:
        if healthy is not None:
            health.record_values(rid, healthy, checked_at, failures, error, now)


def _by_row(health: DeploymentHealth, rows: list[ReportRow], now: float) -> None:
    """Each row as a single report: a batch of one, then the general path."""
    for row in rows:
        _general(health, health.take_steady([row], now), now)


def _state(health: DeploymentHealth) -> tuple:
    registry = health.registry
    return ({rid: dataclasses.astuple(s) for rid, s in health._states.items()},
            {rid: dataclasses.astuple(e) for rid, e in registry._entries.items()},
            list(registry._dirty), len(health._due), health._totals.pushes_total)


def _tick(health: DeploymentHealth, now: float) -> list:
    actions = health.tick(now)
    for action in actions:  # probes answer at once: half of them healthy
        if isinstance(action, ProbeReplica):
            result = ProbeResult.HEALTHY if hash(action.replica_id) % 2 else \
                ProbeResult.UNHEALTHY
            health.probe_resolved(action.replica_id, ProbeOutcome(result, "x"), now)
    return actions


def test_a_batch_taken_in_one_loop_leaves_what_row_by_row_leaves():
    for seed in range(12):
        rng, checked = random.Random(seed), {}
        batched, by_row = _pair()
        now = T0
        for _ in range(60):
            now += rng.choice([0.1, 0.5, 3.0, 16.0])
            rows = _rows(rng, checked)
            taken: list = []
            rest = list(batched.take_steady(rows, now, taken))
            assert sorted(map(id, taken + rest)) == sorted(map(id, rows))
            assert [r for r in rows if any(r is x for x in rest)] == rest  # in order
            _general(batched, rest, now)
            _by_row(by_row, rows, now)
            assert _state(batched) == _state(by_row)
            assert _tick(batched, now) == _tick(by_row, now)
        stats_a = batched._totals.statistics(now)
        assert stats_a == by_row._totals.statistics(now) and stats_a.pushes_total > 0


def test_only_steady_rows_are_taken_and_malformed_ones_come_back():
    health, _ = _pair()
    for rid in IDS[:3]:
        health.record_values(rid, True, 1.0, 0, "", T0)
    health.tick(T0)  # the first pushes applied: the next healthy ones are steady
    ok, older, unwatched = (ReportRow("r0", 0, 0, True, 2.0, 0, ""),
                            ReportRow("r1", 0, 0, True, 0.5, 0, ""),
                            ReportRow("r39", 0, 0, True, 2.0, 0, ""))
    bad, text = ReportRow("r2", 0, 0, False, 2.0, 1, "x"), ReportRow("r1", 0, 0, True, "2", 0, "")
    short, unhashable = ("r2", True), ReportRow([1], 0, 0, True, 2.0, 0, "")
    rows = [ok, older, unwatched, bad, short, unhashable, text]
    taken: list = []
    rest = health.take_steady(rows, T0 + 1, taken)
    assert taken == [ok] and rest == rows[1:]
    assert health.registry.get("r0").checked_at == 2.0 and health._totals.pushes_total == 4


def test_two_rows_of_a_replica_in_one_batch_apply_in_order():
    health, _ = _pair()
    for rid in ("r0", "r1"):
        health.record_push(rid, PushedHealth(True, 1.0, 0), T0)
    health.tick(T0)  # applied: their next healthy pushes are steady
    steady = [ReportRow("r0", 0, 0, True, 2.0, 0, ""), ReportRow("r0", 0, 0, True, 3.0, 0, "")]
    taken: list = []
    assert not health.take_steady(steady, T0 + 1, taken) and taken == steady
    assert health.registry.get("r0").checked_at == 3.0  # the newer one last
    sick, after = ReportRow("r1", 0, 0, False, 2.0, 1, "x"), ReportRow("r1", 0, 0, True, 3.0, 0, "")
    assert health.take_steady([sick, after], T0 + 1) == [sick, after]  # after it, not steady


def test_a_single_push_is_a_batch_of_one():
    health, _ = _pair()
    health.record_push("r0", PushedHealth(True, 1.0, 0), T0)  # the first: general, dirty
    health.tick(T0)  # which the tick consumes
    health.record_push("r0", PushedHealth(True, 2.0, 0), T0 + 1)
    assert health.registry.take_dirty() == [] and health.registry.get("r0").checked_at == 2.0
    health.record_push("r0", PushedHealth(True, 3.0, 0), T0 + 2, via_heartbeat=True)
    assert health.registry.take_dirty() == ["r0"]  # a heartbeat never takes the fast path
