"""Ranks, the membership-gated consistency gate with its error backoff, and the pass."""

from __future__ import annotations

import logging
import pickle

import pytest

from controlplane.clock import FakeClock
from controlplane.deployment.lifecycle import ReplicaEvent, ReplicaState
from controlplane.deployment.ranks import (
    NO_RANK,
    RankConsistencyGate,
    RankError,
    RankManager,
    RankMove,
    run_consistency_pass,
)
from controlplane.deployment.work import WorkTotals
from controlplane.deployment.replica_set import ReplicaRecord, ReplicaSet

S = ReplicaState
E = ReplicaEvent


def manager_with(*ids: str) -> RankManager:
    manager = RankManager()
    for rid in ids:
        manager.assign(rid)
    return manager


def assert_permutation(manager: RankManager, ids) -> None:
    ranks = manager.ranks()
    assert set(ranks) == set(ids)
    assert sorted(ranks.values()) == list(range(len(ids)))


# -- RankManager -----------------------------------------------------------------------


def test_assign_takes_lowest_free_and_is_idempotent():
    manager = manager_with("a", "b", "c")
    assert manager.ranks() == {"a": 0, "b": 1, "c": 2}
    manager.release("b")
    assert manager.assign("d") == 1
    assert manager.assign("d") == 1
    assert manager.assign("e") == 3


def test_release_absent_and_rank_of():
    manager = manager_with("a")
    manager.release("nobody")
    assert manager.rank_of("a") == 0 and manager.rank_of("nobody") is None
    manager.release("a")
    assert manager.rank_of("a") is None


def test_ranks_returns_a_copy():
    manager = manager_with("a")
    manager.ranks()["a"] = 7
    assert manager.rank_of("a") == 0


def test_compact_after_scale_down_moves_the_minimum():
    manager = manager_with("r0", "r1", "r2", "r3", "r4", "r5")
    survivors = ["r0", "r2", "r4", "r5"]  # r1 and r3 scaled away: holes at 1 and 3
    moves = manager.compact(survivors)
    # Only ranks >= 4 move, highest first into the lowest hole.
    assert moves == [RankMove("r5", 5, 1), RankMove("r4", 4, 3)]
    assert manager.ranks() == {"r0": 0, "r5": 1, "r2": 2, "r4": 3}
    assert_permutation(manager, survivors)


def test_compact_after_replacement():
    manager = manager_with("a", "b", "c")
    manager.release("b")  # b died; its replacement has no rank yet
    moves = manager.compact(["a", "c", "b2"])
    assert moves == [("b2", NO_RANK, 1)]
    assert manager.ranks() == {"a": 0, "c": 2, "b2": 1}


def test_compact_releases_ids_not_listed_without_reporting_them():
    manager = manager_with("a", "b", "c")
    assert manager.compact(["a", "b"]) == []
    assert manager.ranks() == {"a": 0, "b": 1}
    assert manager.assign("z") == 2


def test_compact_mixes_movers_and_new_ids():
    manager = manager_with("a", "b", "c", "d")
    moves = manager.compact(["d", "y", "x"])  # d holds 3 >= N=3; x, y unranked
    assert moves == [("d", 3, 0), ("x", NO_RANK, 1), ("y", NO_RANK, 2)]
    assert_permutation(manager, ["d", "x", "y"])


def test_compact_second_call_is_a_no_op():
    manager = manager_with("r0", "r1", "r2", "r3")
    manager.compact(["r3", "r1", "new"])
    after = manager.ranks()
    assert manager.compact(["r3", "r1", "new"]) == []
    assert manager.ranks() == after


def test_compact_to_empty():
    manager = manager_with("a", "b")
    assert manager.compact([]) == []
    assert manager.ranks() == {}


def test_compact_rejects_duplicates_without_changing_anything():
    manager = manager_with("a", "b", "c")
    with pytest.raises(RankError, match="'a'"):
        manager.compact(["a", "a"])
    assert manager.ranks() == {"a": 0, "b": 1, "c": 2}


def test_rank_error_pickles():
    back = pickle.loads(pickle.dumps(RankError("boom")))
    assert type(back) is RankError and back.message == "boom"


# -- RankConsistencyGate ---------------------------------------------------------------


def test_gate_runs_first_then_skips_while_unchanged():
    gate = RankConsistencyGate()
    assert gate.should_run(11, now=0.0)
    gate.record_success(11)
    assert not gate.should_run(11, now=1.0)
    assert not gate.should_run(11, now=1e6)
    assert gate.should_run(12, now=1e6)  # another membership


def test_gate_runs_on_membership_change():
    gate = RankConsistencyGate()
    gate.record_success(11)
    assert gate.should_run(12, now=0.0)


def test_errored_pass_is_not_cached_and_backs_off_at_exact_times():
    clock = FakeClock(1000.0)
    gate = RankConsistencyGate(retry_after_error_s=30.0)
    gate.record_success(10)
    assert gate.should_run(11, clock.monotonic())
    gate.record_error(11, clock.monotonic())
    assert not gate.should_run(11, clock.monotonic())
    clock.advance(29.999)
    assert not gate.should_run(11, clock.monotonic())
    clock.advance(0.001)  # now == 1030.0 == errored_at + retry_after_error_s
    assert gate.should_run(11, clock.monotonic())
    gate.record_success(11)
    assert not gate.should_run(11, clock.monotonic())


def test_membership_change_bypasses_backoff():
    gate = RankConsistencyGate(retry_after_error_s=30.0)
    gate.record_error(11, now=100.0)
    assert gate.should_run(12, now=100.0)


def test_error_forgets_the_last_validated_membership():
    gate = RankConsistencyGate()
    gate.record_success(10)
    gate.record_error(11, now=0.0)
    assert gate.should_run(10, now=0.0)


def test_backoff_restarts_on_a_second_error():
    gate = RankConsistencyGate(retry_after_error_s=30.0)
    gate.record_error(11, now=0.0)
    assert gate.should_run(11, now=30.0)
    gate.record_error(11, now=30.0)
    assert not gate.should_run(11, now=59.0)
    assert gate.should_run(11, now=60.0)


# -- run_consistency_pass --------------------------------------------------------------


class FailingRankManager(RankManager):
    """A real manager whose compact fails while ``failing`` is set; counts calls."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.compact_calls = 0

    def compact(self, active_ids):
        self.compact_calls += 1
        if self.failing:
            raise RankError("injected")
        return super().compact(active_ids)


def running(*ids: str, work: WorkTotals | None = None) -> ReplicaSet:
    replicas = ReplicaSet(work)
    for rid in ids:
        replicas.add(ReplicaRecord(replica_id=rid, state=S.RUNNING, version="v1"))
    return replicas


def test_pass_compacts_then_skips_while_membership_unchanged():
    gate, manager, replicas = RankConsistencyGate(), FailingRankManager(), running("a", "b")
    assert run_consistency_pass(gate, manager, replicas, now=0.0) == [
        ("a", NO_RANK, 0),
        ("b", NO_RANK, 1),
    ]
    for tick in range(1, 6):
        assert run_consistency_pass(gate, manager, replicas, now=float(tick)) == []
    assert manager.compact_calls == 1


def test_pass_skips_walks_in_steady_state():
    work = WorkTotals()
    gate, manager = RankConsistencyGate(), FailingRankManager()
    replicas = running("a", "b", work=work)
    run_consistency_pass(gate, manager, replicas, now=0.0)
    walks = work.running_sets_built
    replicas.add(replicas.remove("a"))  # health-pass churn: pop and re-add
    run_consistency_pass(gate, manager, replicas, now=1.0)
    assert manager.compact_calls == 1
    assert work.running_sets_built == walks


def test_pass_runs_on_membership_change():
    gate, manager, replicas = RankConsistencyGate(), FailingRankManager(), running("a", "b", "c")
    run_consistency_pass(gate, manager, replicas, now=0.0)
    replicas.apply("a", E.STOP)
    moves = run_consistency_pass(gate, manager, replicas, now=1.0)
    assert moves == [("c", 2, 0)]
    assert manager.ranks() == {"b": 1, "c": 0}


def test_pass_does_nothing_while_a_replica_is_starting():
    work = WorkTotals()
    gate, manager = RankConsistencyGate(work=work), FailingRankManager()
    replicas = running("a", work=work)
    replicas.add(ReplicaRecord(replica_id="s", state=S.STARTING, version="v1"))
    assert run_consistency_pass(gate, manager, replicas, now=0.0) == []
    assert manager.compact_calls == 0 and work.rank_passes == 0
    assert work.running_sets_built == 0  # no collection was built
    replicas.apply("s", E.STARTED)
    assert run_consistency_pass(gate, manager, replicas, now=1.0) == [
        ("a", NO_RANK, 0),
        ("s", NO_RANK, 1),
    ]


def test_pass_error_is_logged_once_backed_off_then_retried(caplog):
    gate = RankConsistencyGate(retry_after_error_s=30.0)
    manager, replicas = FailingRankManager(), running("a")
    manager.failing = True
    with caplog.at_level(logging.ERROR, logger="controlplane.deployment.ranks"):
        for tick in range(30):  # ticks at 0..29 s: one pass, one log line
            assert run_consistency_pass(gate, manager, replicas, now=float(tick)) == []
    assert manager.compact_calls == 1
    assert len(caplog.records) == 1 and "injected" in caplog.records[0].getMessage()
    manager.failing = False
    assert run_consistency_pass(gate, manager, replicas, now=30.0) == [("a", NO_RANK, 0)]
    assert manager.compact_calls == 2
    assert run_consistency_pass(gate, manager, replicas, now=31.0) == []


def test_pass_error_then_membership_change_runs_immediately():
    gate = RankConsistencyGate(retry_after_error_s=30.0)
    manager, replicas = FailingRankManager(), running("a")
    manager.failing = True
    run_consistency_pass(gate, manager, replicas, now=0.0)
    manager.failing = False
    replicas.add(ReplicaRecord(replica_id="b", state=S.RUNNING, version="v1"))
    assert run_consistency_pass(gate, manager, replicas, now=1.0) == [
        ("a", NO_RANK, 0),
        ("b", NO_RANK, 1),
    ]


def test_assign_is_the_lowest_free_rank_after_any_mix_of_operations() -> None:
    """Checked against a scan from 0 (the definition) over random starts, stops, adoptions
    and compactions."""
    import random

    rng, manager, live = random.Random(7), RankManager(), []
    for step in range(3000):
        op = rng.random()
        if op < 0.5 or not live:
            held = set(manager.ranks().values())
            expected = next(r for r in range(len(live) + 1) if r not in held)
            replica_id = f"r{step}"
            assert manager.assign(replica_id) == expected
            live.append(replica_id)
        elif op < 0.8:
            manager.release(live.pop(rng.randrange(len(live))))
        elif op < 0.95:
            replica_id = f"a{step}"
            manager.adopt(replica_id, rng.randrange(len(live) + 5))
            live.append(replica_id)
        else:
            manager.compact(live)
        assert len(set(manager.ranks().values())) == len(live)


def test_a_scale_up_looks_at_each_rank_about_once() -> None:
    """A start costs O(1) amortized rank probes, not a scan from 0 (O(N^2))."""
    work = WorkTotals()
    manager = RankManager(work)
    for i in range(20_000):
        manager.assign(f"r{i}")
    assert work.rank_probes <= 20_000
    for i in range(0, 20_000, 2):  # half stop, then as many replacements start
        manager.release(f"r{i}")
    before = work.rank_probes
    assert [manager.assign(f"s{i}") for i in range(10_000)] == list(range(0, 20_000, 2))
    assert work.rank_probes - before <= 10_000
