"""The replica book: the one place a lifecycle event is applied, and the one event every
owner of a deployment hears it by."""

from __future__ import annotations

import pytest

from controlplane.deployment.lifecycle import IllegalTransition, ReplicaEvent, ReplicaState
from controlplane.deployment.replica_book import ReplicaBook
from controlplane.deployment.replica_set import Moved
from controlplane.specs import DeploymentId
from controlplane.wire import ReplicaDescription

DEP = DeploymentId("app", "model")
S, E = ReplicaState, ReplicaEvent


class Ear:
    """A listener that writes down what it hears, into a log shared with the others."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def replica_moved(self, moved: Moved) -> None:
        self.log.append((self.name, moved.replica_id, moved.was, moved.record.state))


def book_with(*names: str) -> tuple[ReplicaBook, list]:
    book, log = ReplicaBook(DEP, 30.0), []
    book.listen(*(Ear(n, log) for n in names))
    return book, log


def started(book: ReplicaBook, now: float = 1.0) -> str:
    rid = book.next_id()
    book.ranks.assign(rid)
    book.add_starting(rid, f"handle-{rid}", f"actor-{rid}", "v1", "c1", now)
    book.apply(rid, E.STARTED, now, S.STARTING, {"node_id": "n1"})
    return rid


def test_each_move_is_told_once_to_every_listener_in_order():
    book, log = book_with("health", "autoscaler", "conductor")
    rid = started(book)
    assert log == [(n, rid, S.STARTING, S.RUNNING) for n in ("health", "autoscaler", "conductor")]
    log.clear()
    moved = book.apply(rid, E.STOP, 2.0, changes={"message": "scaled down"})
    assert moved.started is False and moved.record.message == "scaled down"
    assert [entry[3] for entry in log] == [S.STOPPING] * 3


def test_a_start_is_a_move_from_starting_to_running_and_is_remembered_as_recent():
    book, _ = book_with()
    rid = book.next_id()
    book.add_starting(rid, "h", "a", "v1", "c1", 1.0)
    moved = book.apply(rid, E.STARTED, 5.0, S.STARTING,
                       {"http_address": "127.0.0.1:9", "node_id": "n"})
    assert moved.started and moved.now == 5.0 and moved.record.http_address == "127.0.0.1:9"
    assert book.recently_started(6.0) == [(rid, "127.0.0.1:9")]
    assert book.recently_started(5.0 + 31.0) == []  # older than the window: forgotten


def test_an_outcome_for_a_replica_that_moved_on_is_ignored_and_told_to_nobody():
    book, log = book_with("health")
    rid = book.next_id()
    book.add_starting(rid, "h", "a", "v1", "c1", 1.0)
    book.apply(rid, E.STOP, 2.0)  # a scale-down while it was starting
    log.clear()
    assert book.apply(rid, E.STARTED, 3.0, S.STARTING) is None and log == []
    assert book.apply("app#model#99", E.STOP, 3.0) is None  # never known


def test_a_terminal_state_drops_the_replica_its_handle_rank_and_config_version():
    book, log = book_with("health")
    rid = started(book)
    assert book.handle(rid) == f"handle-{rid}" and book.ranks.rank_of(rid) == 0
    book.apply(rid, E.DIED, 2.0, changes={"message": "gone"})
    assert rid not in book.replicas and book.handle(rid) is None
    assert book.ranks.rank_of(rid) is None and book.config_versions.get(rid) is None
    assert log[-1] == ("health", rid, S.RUNNING, S.STOPPED)


def test_an_illegal_event_raises_and_changes_nothing():
    book, log = book_with("health")
    rid = started(book)
    log.clear()
    with pytest.raises(IllegalTransition):
        book.apply(rid, E.RECONFIGURED, 2.0)
    assert book.get(rid).state is S.RUNNING and log == []


def test_ids_are_never_reused_and_continue_after_those_re_adopted():
    book, log = book_with("health")
    first = started(book)
    book.apply(first, E.DIED, 2.0)
    assert book.next_id() == "app#model#1"
    found = ReplicaDescription(replica_id="app#model#7", rank=3, code_version="v1",
                               user_config=None, actor_id="a7", node_id="n2",
                               initialized=True, stopping=False, healthy=True)
    log.clear()
    assert book.adopt(found, "h7", "actor-7", "c1", 3.0)
    assert log == [("health", "app#model#7", None, S.RUNNING)]  # a move from nothing
    assert book.get("app#model#7").rank == 3 and book.next_id() == "app#model#8"
    assert not book.adopt(found, "h7", "actor-7", "c1", 3.0)  # known already


def test_a_replica_still_starting_or_stopping_is_not_adopted():
    book, log = book_with("health")
    for initialized, stopping in ((False, False), (True, True)):
        found = ReplicaDescription(replica_id="app#model#4", rank=0, code_version="v1",
                                   user_config=None, actor_id="a", node_id="n",
                                   initialized=initialized, stopping=stopping, healthy=True)
        assert not book.adopt(found, "h", "a", "c1", 1.0)
    assert len(book.replicas) == 0 and log == []


def test_off_target_counts_running_replicas_on_other_code_or_config():
    book, _ = book_with()
    ids = [started(book) for _ in range(4)]
    assert book.off_target("v1", "c1") == (0, 0)
    book.set_config_version(ids[0], "c0")
    old = book.next_id()
    book.add_starting(old, "h", "a", "v0", "c1", 1.0)  # not RUNNING: not counted
    assert book.off_target("v1", "c1") == (0, 1)
    assert book.off_target("v2", "c1") == (4, 1)


def test_a_message_shows_on_a_serving_replica_only():
    book, _ = book_with()
    rid = started(book)
    book.set_message(rid, "self health check failed (1 consecutive, push)")
    assert book.get(rid).message.startswith("self health check failed")
    book.apply(rid, E.STOP, 2.0, changes={"message": "scaled down"})
    book.set_message(rid, "late health news")
    assert book.get(rid).message == "scaled down"


def test_the_rank_pass_moves_ranks_onto_the_records():
    book, _ = book_with()
    ids = [started(book) for _ in range(3)]
    book.apply(ids[0], E.STOP, 2.0)  # rank 0 freed: ranks 1 and 2 must close up
    book.apply(ids[0], E.STOPPED, 2.0)
    moves = book.rank_moves(3.0)
    assert sorted(book.get(r).rank for r in ids[1:]) == [0, 1]
    assert [(m.replica_id, m.new_rank) for m in moves] == [(ids[2], 0)]
    assert book.rank_moves(4.0) == []  # the same membership: no walk
