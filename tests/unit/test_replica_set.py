"""ReplicaSet: membership, the summed fingerprint, and the memos keyed on it."""

from __future__ import annotations

import pytest

from controlplane.deployment.lifecycle import IllegalTransition, ReplicaEvent, ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord, ReplicaSet
from controlplane.deployment.work import WorkTotals

S = ReplicaState
E = ReplicaEvent


def rec(rid: str, state: ReplicaState = S.RUNNING, **fields) -> ReplicaRecord:
    fields.setdefault("actor_id", f"actor-{rid}")
    fields.setdefault("node_id", "node-a")
    return ReplicaRecord(replica_id=rid, state=state, version="v1", **fields)


def make_set(*records: ReplicaRecord, work: WorkTotals | None = None) -> ReplicaSet:
    replicas = ReplicaSet(work)
    for record in records:
        replicas.add(record)
    return replicas


# -- membership ------------------------------------------------------------------------


def test_add_get_contains_len_records():
    a, b = rec("a"), rec("b", S.STOPPING)
    replicas = make_set(a, b)
    assert len(replicas) == 2
    assert "a" in replicas and "z" not in replicas
    assert replicas.get("b") == b and replicas.get("z") is None
    assert replicas.records() == [a, b]


def test_add_duplicate_id_raises():
    replicas = make_set(rec("a"))
    with pytest.raises(ValueError):
        replicas.add(rec("a", S.STOPPING))
    assert replicas.get("a").state is S.RUNNING


def test_terminal_records_are_refused():
    replicas = make_set(rec("a"))
    with pytest.raises(ValueError):
        replicas.add(rec("b", S.FAILED))
    with pytest.raises(ValueError):
        replicas.replace(rec("a", S.STOPPED))
    assert replicas.get("a").state is S.RUNNING and "b" not in replicas


def test_remove_returns_record_and_updates_buckets():
    a = rec("a")
    replicas = make_set(a, rec("b"))
    assert replicas.remove("a") == a
    assert "a" not in replicas
    assert replicas.count(S.RUNNING) == 1
    with pytest.raises(KeyError):
        replicas.remove("a")


def test_replace_moves_between_buckets():
    replicas = make_set(rec("a"), rec("b"))
    replicas.replace(rec("a", S.STOPPING, message="scale down"))
    assert replicas.ids_in(S.RUNNING) == {"b"}
    assert replicas.ids_in(S.STOPPING) == {"a"}
    assert replicas.get("a").message == "scale down"


def test_replace_unknown_id_raises():
    with pytest.raises(KeyError):
        ReplicaSet().replace(rec("a"))


def test_count_and_ids_in_over_several_states():
    replicas = make_set(rec("a", S.STARTING), rec("b"), rec("c", S.UPDATING), rec("d", S.STOPPING))
    assert replicas.count(S.STARTING) == 1
    assert replicas.count(S.RUNNING, S.UPDATING) == 2
    assert replicas.count() == 0
    assert replicas.ids_in(S.RUNNING, S.STOPPING) == frozenset({"b", "d"})


def test_apply_follows_the_table():
    replicas = make_set(rec("a", S.STARTING))
    moved = replicas.apply("a", E.STARTED)
    assert moved.state is S.RUNNING
    assert replicas.get("a") == moved
    assert replicas.ids_in(S.STARTING) == frozenset()


def test_apply_terminal_removes_and_returns_new_record():
    replicas = make_set(rec("a", S.STARTING))
    failed = replicas.apply("a", E.START_FAILED)
    assert failed.state is S.FAILED
    assert "a" not in replicas and len(replicas) == 0


def test_apply_illegal_leaves_record_untouched():
    replicas = make_set(rec("a"))
    before = replicas.fingerprint
    with pytest.raises(IllegalTransition):
        replicas.apply("a", E.STARTED)
    assert replicas.get("a").state is S.RUNNING
    assert replicas.fingerprint == before


def test_with_state_returns_new_frozen_record():
    a = rec("a", S.STARTING)
    b = a.with_state(S.RUNNING, node_id="node-b")
    assert (a.state, a.node_id) == (S.STARTING, "node-a")
    assert (b.state, b.node_id, b.replica_id) == (S.RUNNING, "node-b", "a")


# -- fingerprint -----------------------------------------------------------------------


def test_pop_and_re_add_cancels_exactly():
    replicas = make_set(rec("a"), rec("b"), rec("c", S.STOPPING))
    before = replicas.fingerprint
    popped = [replicas.remove(rid) for rid in replicas.ids_in(S.RUNNING)]
    assert replicas.fingerprint != before
    for record in popped:
        replicas.add(record)
    assert replicas.fingerprint == before


def test_fingerprint_is_order_independent():
    one = make_set(rec("a"), rec("b"), rec("c"))
    other = make_set(rec("c"), rec("a"), rec("b"))
    assert one.fingerprint == other.fingerprint


def test_arrival_departure_and_state_change_alter_fingerprint():
    replicas = make_set(rec("a"))
    seen = {replicas.fingerprint}
    replicas.add(rec("b"))
    seen.add(replicas.fingerprint)
    replicas.apply("b", E.RECONFIGURE)
    seen.add(replicas.fingerprint)
    replicas.remove("a")
    seen.add(replicas.fingerprint)
    assert len(seen) == 4


def test_fields_other_than_state_do_not_alter_fingerprint():
    replicas = make_set(rec("a"))
    before = replicas.fingerprint
    replicas.replace(rec("a", actor_id="actor-new", node_id="node-z", rank=3, message="x"))
    assert replicas.fingerprint == before


def test_empty_fingerprint_is_zero_and_returns_there():
    replicas = ReplicaSet()
    assert replicas.fingerprint == 0
    replicas.add(rec("a"))
    replicas.apply("a", E.DIED)
    assert replicas.fingerprint == 0


# -- memos -----------------------------------------------------------------------------


def steady_set() -> tuple[ReplicaSet, WorkTotals]:
    work = WorkTotals()
    return make_set(
        rec("a", node_id="n1"),
        rec("b", S.UPDATING, node_id="n2"),
        rec("c", S.STOPPING, node_id="n3"),
        work=work,
    ), work


def test_memo_value_is_a_frozenset_of_serving_ids():
    replicas, _ = steady_set()
    assert replicas.running_ids() == frozenset({"a", "b"})
    assert type(replicas.running_ids()) is frozenset


def test_steady_state_does_no_walk():
    replicas, work = steady_set()
    first = replicas.running_ids()
    assert work.running_sets_built == 1
    for _ in range(5):
        assert replicas.running_ids() is first
    assert work.running_sets_built == 1


def test_pop_and_re_add_keeps_memo():
    replicas, work = steady_set()
    replicas.running_ids()
    before = work.running_sets_built
    replicas.add(replicas.remove("a"))
    assert replicas.running_ids() == {"a", "b"}
    assert work.running_sets_built == before


def test_state_change_recomputes_once():
    replicas, work = steady_set()
    replicas.running_ids()
    before = work.running_sets_built
    replicas.apply("a", E.STOP)
    assert replicas.running_ids() == {"b"}
    assert replicas.running_ids() == {"b"}
    assert work.running_sets_built == before + 1


def test_a_replica_that_starts_serving_is_seen_at_once():
    replicas, _ = steady_set()
    replicas.add(rec("s", S.STARTING, actor_id=None, node_id=None))
    assert replicas.running_ids() == {"a", "b"}
    replicas.apply("s", E.STARTED)
    assert replicas.running_ids() == {"a", "b", "s"}


def test_the_running_set_is_rebuilt_when_the_serving_set_moves_and_only_then():
    work = WorkTotals()
    replicas = make_set(rec("a"), rec("b"), work=work)

    def rebuilt() -> int:
        before = work.running_sets_built
        replicas.running_ids()
        return work.running_sets_built - before
    assert rebuilt() == 1 and rebuilt() == 0
    replicas.add(rec("c", S.STARTING))
    replicas.add(rec("d", S.STOPPING))
    replicas.replace(rec("a", message="slow check"))  # status only: routers see none of it
    assert rebuilt() == 0
    replicas.replace(rec("c", S.RUNNING))
    assert rebuilt() == 1 and replicas.running_ids() == {"a", "b", "c"}
    replicas.replace(rec("c", S.RUNNING, http_address="127.0.0.1:9000"))  # what routers see
    assert rebuilt() == 1
    replicas.remove("c")
    assert rebuilt() == 1 and replicas.running_ids() == {"a", "b"}


def test_routing_sends_deltas_of_the_serving_set_and_nothing_for_starts_and_stops():
    from controlplane.deployment.routing import DeploymentRouting
    from controlplane.wire import RoutingDelta
    from tests.unit.shard_harness import make_spec

    spec, routing = make_spec(), DeploymentRouting()
    replicas = make_set(rec("a"), rec("b"))
    assert [r.replica_id for r in routing.update(spec, replicas, 0.0).replicas] == ["a", "b"]
    replicas.add(rec("c", S.STARTING))
    replicas.replace(rec("b", S.STOPPING))
    assert routing.update(spec, replicas, 0.0) == RoutingDelta((), ("b",))
    replicas.add(rec("d", S.STARTING))
    replicas.remove("b")
    replicas.replace(rec("a", message="slow"))  # nothing routers see
    assert routing.update(spec, replicas, 0.0) is None
    replicas.replace(rec("c", S.RUNNING))
    delta = routing.update(spec, replicas, 0.0)
    assert [i.replica_id for i in delta.added] == ["c"] and delta.removed == ()
    assert [r.replica_id for r in routing.update(make_spec(max_ongoing_requests=9),
                                                 replicas, 0.0).replicas] == ["a", "c"]


def test_deltas_applied_in_order_equal_the_whole_update_after_random_churn():
    import random

    from controlplane.deployment.routing import DeploymentRouting
    from controlplane.wire import RoutingDelta, apply_routing_delta
    from tests.unit.shard_harness import make_spec

    rng, spec = random.Random(3), make_spec()
    routing, replicas = DeploymentRouting(), ReplicaSet()
    held = routing.update(spec, replicas, 0.0)
    for step in range(400):
        rid = f"r{rng.randrange(30)}"
        state = rng.choice([S.STARTING, S.RUNNING, S.UPDATING, S.STOPPING])
        record = rec(rid, state, node_id=rng.choice(["n1", "n2"]))
        if rid in replicas:
            replicas.remove(rid) if rng.random() < 0.3 else replicas.replace(record)
        else:
            replicas.add(record)
        update = routing.update(spec, replicas, 0.0)
        if isinstance(update, RoutingDelta):
            held = apply_routing_delta(held, update)
        whole = DeploymentRouting().update(spec, replicas, 0.0)
        assert held == whole, step
