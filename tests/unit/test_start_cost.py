"""The work of one replica start, counted: what is shared by the replicas of a spec is
built once, a transition copies its changes once, a scale-up does not keep the
retirement index in order on every start, and a replica's whole life is one coroutine
frame of the shard's (the client's call below it)."""

from __future__ import annotations

import pickle
import random

import pytest

from controlplane.deployment.lifecycle import IllegalTransition, ReplicaEvent, ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord, ReplicaSet
from controlplane.deployment.work import WorkTotals
from controlplane.wire import ReplicaInit
from tests.unit.shard_harness import DEP, Shard, make_spec, run

S = ReplicaState


def _inits(shard: Shard) -> dict[str, ReplicaInit]:
    return {rid: handle.init for rid, handle in shard.client.handles.items()}


def _whole(init: ReplicaInit) -> ReplicaInit:
    """The same init built field by field, as without the shared template."""
    return ReplicaInit(**init._asdict())


def test_the_replicas_of_one_spec_share_one_init_built_once():
    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(8, user_config={"k": 1}))
        work = shard.core.work
        assert work.replica_inits_built == 1
        inits = _inits(shard)
        assert sorted(i.rank for i in inits.values()) == list(range(8))
        for rid, init in inits.items():
            assert init.replica_id == rid and init.rank == shard.serving_ranks()[rid]
            assert (init.world_size, init.user_config, init.code_version) == (8, {"k": 1}, "v1")
            assert init == _whole(init) and pickle.loads(pickle.dumps(init)) == init

        await shard.deploy(make_spec(12, user_config={"k": 1}))  # a new target: rebuilt
        assert work.replica_inits_built == 2
        assert {i.world_size for rid, i in _inits(shard).items() if rid not in inits} == {12}

        await shard.deploy(make_spec(12, code_version="v2", user_config={"k": 1}), ticks=12)
        assert {i.code_version for i in _inits(shard).values()} == {"v1", "v2"}
        assert work.replica_inits_built == 3  # one per spec version, not per start
    run(scenario)


def test_a_replica_life_is_one_coroutine_frame_over_the_clients_call():
    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(5))
        tasks = list(shard.core._tasks)
        assert len(tasks) == 5  # one owned task per replica life
        for task in tasks:
            coro = task.get_coro()
            assert coro.cr_code.co_name == "_wait_started"
            assert coro.cr_await.cr_code.co_name == "wait_until_stopped"  # the client's
    run(scenario)


def test_with_fields_is_replace_and_refuses_unknown_fields():
    rng = random.Random(16)
    record = ReplicaRecord("a#m#0", S.STARTING, "v1", 0, "actor", started_at=1.0)
    for _ in range(200):
        names = rng.sample(ReplicaRecord._fields[2:], rng.randrange(0, 5))
        changes = {name: rng.random() for name in names}
        new = record.with_fields(S.RUNNING, changes)
        assert type(new) is ReplicaRecord
        assert new == record._replace(state=S.RUNNING, **changes)
        assert new == record.with_state(S.RUNNING, **changes)
    with pytest.raises(ValueError, match="unexpected field names"):
        record.with_state(S.RUNNING, colour="red")


def test_a_transition_hands_its_changes_down_without_a_copy_per_call():
    replicas = ReplicaSet()
    replicas.add(ReplicaRecord("a#m#0", S.STARTING, "v1", 0, "actor"))
    changes = {"node_id": "n1", "message": ""}
    seen = []
    original = ReplicaRecord.with_fields

    def spy(self, state, fields):
        seen.append(fields)
        return original(self, state, fields)

    ReplicaRecord.with_fields = spy
    try:
        new = replicas.apply_fields("a#m#0", ReplicaEvent.STARTED, changes)
    finally:
        ReplicaRecord.with_fields = original
    assert seen == [changes] and seen[0] is changes
    assert (new.state, new.node_id) == (S.RUNNING, "n1") and replicas.get("a#m#0") == new


def _running(replicas: ReplicaSet, first: int, count: int) -> None:
    for i in range(first, first + count):
        rid = f"a#m#{i}"
        replicas.add(ReplicaRecord(rid, S.STARTING, "v1", i, rid))
        replicas.apply(rid, ReplicaEvent.STARTED, node_id="n")


def test_a_scale_up_orders_the_retirement_index_once_at_its_first_query():
    work = WorkTotals()
    replicas = ReplicaSet(work)

    def ordered() -> tuple[int, int]:
        return work.rank_heaps_ordered, work.rank_entries_sifted
    _running(replicas, 0, 5000)  # each start the highest rank yet: the heap's new top
    assert ordered() == (0, 0)  # no O(log N) climb per start
    assert replicas.retire_first(None, 3) == ["a#m#4999", "a#m#4998", "a#m#4997"]
    assert ordered() == (1, 0)  # one O(N) heapify
    _running(replicas, 5000, 10)  # a few more: sifted in one by one at the next query
    assert replicas.retire_first("v2", 2) == ["a#m#5009", "a#m#5008"]
    assert ordered() == (1, 10)
    assert replicas.retire_first(None, 1) == ["a#m#5009"]
    assert ordered() == (1, 10)  # nothing new: nothing to order


def test_a_created_replica_is_the_record_its_fields_name():
    # the book builds a new record by position: a field added to ``ReplicaRecord`` must not
    # shift what it means
    async def scenario():
        shard = Shard()
        shard.client.hold("initialize")
        await shard.deploy(make_spec(2))
        book = shard.core.deployment(DEP).book
        for rid in shard.client.held("initialize"):
            record = book.get(rid)
            assert record == ReplicaRecord(
                replica_id=rid, state=S.STARTING, version="v1",
                rank=book.ranks.rank_of(rid), actor_name=record.actor_name,
                started_at=record.started_at)
            assert record.actor_name.endswith(rid) and record.started_at >= 0
        assert shard.states() == {"STARTING": 2}
    run(scenario)


def test_a_transition_within_a_version_moves_the_record_as_discard_and_insert_would():
    rng = random.Random(13)
    moved, reference = ReplicaSet(), ReplicaSet()
    for i in range(40):
        for replicas in (moved, reference):
            replicas.add(ReplicaRecord(f"a#m#{i}", S.STARTING, "v1", i, f"r{i}"))
    events = [ReplicaEvent.STARTED, ReplicaEvent.RECONFIGURE, ReplicaEvent.RECONFIGURED,
              ReplicaEvent.STOP]
    for _ in range(300):
        rid, event = f"a#m#{rng.randrange(40)}", rng.choice(events)
        old = moved.get(rid)
        try:
            new = moved.apply(rid, event, node_id="n")
        except IllegalTransition:
            continue  # not a move the table allows from this state
        if rid in moved:
            reference.replace(new)  # the general path: discard, then insert
        else:
            reference.remove(rid)
            for replicas in (moved, reference):  # a new one in its place
                replicas.add(ReplicaRecord(rid + "x", S.STARTING, "v1", None, "x"))
        assert old is not None and new.node_id == "n"
    assert moved.records() == reference.records()
    assert moved.fingerprint == reference.fingerprint
    assert moved.running_ids() == reference.running_ids()
    assert moved.take_serving_changes() == reference.take_serving_changes()
    for state in S:
        assert moved.count_state_version(state, "v1") == reference.count_state_version(state, "v1")
    assert moved.retire_first(None, 5) == reference.retire_first(None, 5)
