"""The replica book of one deployment: every live replica's record, rank, actor handle,
config version and id, and the only place a lifecycle event is applied.

Owns: the ``ReplicaSet`` (records bucketed by state, with counts and fingerprints), the
ranks (``RankManager`` and the membership-gated consistency pass), the actor handles, the
``user_config`` version each replica runs (a ``CountedMap``: O(1) counts for plans and
status), the id sequence, and the replicas that started serving recently.

Invariants:
- ``apply`` is the one way a replica's state changes: it moves the record through the
  transition table, drops the book's own entries when the state is terminal, and tells
  every listener (the deployment's other owners) of the move with one ``Moved`` event,
  in the order the listeners were given. Nothing else writes a record's state.
- Replica ids are never reused within the book's life (``app#deployment#N``, N growing);
  a book built for a deployment a previous shard ran continues after the highest N it
  re-adopted.
- ``recently_started`` costs O(recent starts), never O(replicas).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from controlplane.deployment.lifecycle import (SERVING_STATES, TERMINAL_STATES, ReplicaEvent,
                                               ReplicaState)
from controlplane.deployment.ranks import (RankConsistencyGate, RankManager, RankMove,
                                           run_consistency_pass)
from controlplane.deployment.replica_set import CountedMap, Moved, ReplicaRecord, ReplicaSet
from controlplane.deployment.work import WorkTotals
from controlplane.specs import DeploymentId
from controlplane.wire import ReplicaDescription

logger = logging.getLogger(__name__)

STARTING, RUNNING = ReplicaState.STARTING, ReplicaState.RUNNING
_new_record = tuple.__new__  # every field given, by position: no defaults to fill in


class ReplicaListener(Protocol):
    """An owner told of every lifecycle event the book applies."""

    def replica_moved(self, moved: Moved) -> None: ...


class ReplicaBook:
    def __init__(self, dep_id: DeploymentId, rank_error_retry_s: float,
                 work: WorkTotals | None = None) -> None:
        self.replicas = ReplicaSet(work)
        self.ranks = RankManager(work)
        self.rank_gate = RankConsistencyGate(rank_error_retry_s, work)
        self.config_versions = CountedMap()  # replica id -> the user_config version it runs
        self._handles: dict[str, Any] = {}  # replica id -> the client's actor handle
        self._listeners: Sequence[ReplicaListener] = ()
        self._id_prefix = f"{dep_id.app}#{dep_id.name}#"  # a redeploy keeps the id
        self._next_seq = 0
        self._recent: deque[tuple[float, str]] = deque()  # (started at, id), oldest first

    def listen(self, *listeners: ReplicaListener) -> None:
        """The owners to tell of each move, in this order."""
        self._listeners = listeners

    # ---- ids and handles ---------------------------------------------------------------
    def next_id(self) -> str:
        seq = self._next_seq
        self._next_seq = seq + 1
        return self._id_prefix + str(seq)

    @property
    def ids_issued(self) -> int:
        return self._next_seq

    def handle(self, replica_id: str) -> Any | None:
        return self._handles.get(replica_id)

    def handles(self) -> list[Any]:
        return list(self._handles.values())

    def get(self, replica_id: str) -> ReplicaRecord | None:
        return self.replicas.get(replica_id)

    # ---- new records -------------------------------------------------------------------
    def add_starting(self, replica_id: str, handle: Any, actor_name: str, version: str,
                     config_version: str, now: float) -> None:
        """The client accepted the actor: STARTING until its start is applied."""
        self.replicas.add(_new_record(ReplicaRecord, (
            replica_id, STARTING, version, self.ranks.rank_of(replica_id), actor_name, None,
            None, now, "", None)))
        self.config_versions[replica_id] = config_version
        self._handles[replica_id] = handle

    def adopt(self, found: ReplicaDescription, handle: Any, actor_name: str,
              config_version: str, now: float) -> bool:
        """A live replica a previous shard started, RUNNING with the rank and versions it
        reports; listeners hear it as a move from nothing. False (the caller kills it)
        when it had not finished starting, was already stopping, or is known here."""
        self._next_seq = max(self._next_seq, _seq_of(found.replica_id) + 1)
        if not found.initialized or found.stopping or found.replica_id in self.replicas:
            return False
        record = ReplicaRecord(
            replica_id=found.replica_id, state=RUNNING, version=found.code_version,
            rank=self.ranks.adopt(found.replica_id, found.rank), started_at=now,
            actor_name=actor_name, actor_id=found.actor_id, node_id=found.node_id,
            http_address=found.http_address)
        self.replicas.add(record)
        self.config_versions[found.replica_id] = config_version
        self._handles[found.replica_id] = handle
        moved = Moved(found.replica_id, None, record, now)
        for listener in self._listeners:
            listener.replica_moved(moved)
        return True

    # ---- the lifecycle ---------------------------------------------------------------
    def apply(self, replica_id: str, event: ReplicaEvent, now: float,
              expect: ReplicaState | None = None,
              changes: dict[str, Any] | None = None) -> Moved | None:
        """Apply one lifecycle event (with ``changes`` to the record's other fields) and
        tell the listeners. With ``expect``, an event for a replica that moved on meanwhile
        (a start finishing after a scale-down began stopping it) is ignored: None."""
        current = self.replicas.get(replica_id)
        if current is None or (expect is not None and current[1] is not expect):
            return None
        record = self.replicas.apply_fields(replica_id, event, changes or {})
        was, state = current[1], record[1]
        started = state is RUNNING and was is STARTING
        if started:
            self._recent.append((now, replica_id))
        elif state in TERMINAL_STATES:
            self._handles.pop(replica_id, None)
            self.config_versions.pop(replica_id, None)
            self.ranks.release(replica_id)
        moved = Moved(replica_id, was, record, now, started)
        for listener in self._listeners:
            listener.replica_moved(moved)
        return moved

    # ---- other fields ------------------------------------------------------------------
    def set_config_version(self, replica_id: str, version: str) -> None:
        if replica_id in self.replicas:
            self.config_versions[replica_id] = version

    def set_message(self, replica_id: str, text: str) -> None:
        """What status shows on a serving replica (its health, its last error)."""
        record = self.replicas.get(replica_id)
        if record is not None and record[1] in SERVING_STATES and record.message != text:
            self.replicas.replace(record.with_state(record.state, message=text))

    def rank_moves(self, now: float) -> list[RankMove]:
        """The consistency pass (O(1) unless membership changed): the ranks it moved,
        each already on its record."""
        moves = run_consistency_pass(self.rank_gate, self.ranks, self.replicas, now)
        for replica_id, _old, new in moves:
            record = self.replicas.get(replica_id)
            if record is not None:
                self.replicas.replace(record.with_state(record.state, rank=new))
        return moves

    def recently_started(self, now: float, within_s: float = 30.0) -> list[tuple[str, str]]:
        """(replica id, HTTP address) of replicas that started serving within ``within_s``:
        those an ingress may not have heard of yet. O(recent starts)."""
        while self._recent and self._recent[0][0] < now - within_s:
            self._recent.popleft()
        serving = [self.replicas.get(rid) for _, rid in self._recent]
        return [(r.replica_id, r.http_address) for r in serving
                if r is not None and r.state in SERVING_STATES and r.http_address]

    def off_target(self, version: str, config: str) -> tuple[int, int]:
        """(replicas not running code ``version``, replicas not on config ``config``) among
        the RUNNING ones. O(1) when every replica is on target; else O(replicas not
        RUNNING), bounded by what is in flight, not by the fleet."""
        replicas, configs = self.replicas, self.config_versions
        n = len(replicas)
        off_version = n - replicas.count_version(version)
        # a replica without a config entry reads as "" (as a snapshot does)
        off_config = n - configs.count(config) - (n - len(configs) if config == "" else 0)
        if off_version or off_config:
            for replica_id in replicas.ids_in(*_NOT_RUNNING):
                off_version -= replicas.get(replica_id).version != version
                off_config -= configs.get(replica_id, "") != config
        return off_version, off_config


_NOT_RUNNING = tuple(s for s in ReplicaState if s is not RUNNING)


def _seq_of(replica_id: str) -> int:
    """The sequence number in "app#deployment#N"; -1 for a name not made here."""
    tail = replica_id.rpartition("#")[2]
    return int(tail) if tail.isdigit() else -1
