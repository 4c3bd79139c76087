"""One deployment's replicas: the records, their membership fingerprint, and memos on it.

Owns: the ``ReplicaRecord`` of every live replica of a deployment, bucketed by state, and
the derived id collections the controller reads on every tick.

Invariants:
- No record is ever in a terminal state: ``apply`` drops a record the moment the
  lifecycle table moves it to FAILED or STOPPED, and ``add``/``replace`` refuse one.
- ``fingerprint`` is the sum (mod 2**64) of ``hash((replica_id, state.value))`` over the
  records, kept incrementally. A sum and not a mutation counter (seed: ray-project/ray
  #64913) because the health and migration passes pop a whole bucket and re-add every
  replica in the state it came from; a counter reads that churn as a membership change
  and invalidates every memo on an idle tick, while summed terms cancel exactly. A real
  arrival, departure or state change still changes the sum. Fields other than id and
  state (actor_id, node_id, rank, message) do not enter it.
- The memoized collections are frozensets so a caller cannot mutate a shared memo. They
  are recomputed only when their key changed, and never stored while a replica is
  STARTING, because actor_id/node_id materialize during start without moving the
  fingerprint (the seed's disarm rule). The actor/node memos are also keyed on a second
  sum over (id, actor_id, node_id), so a placement change on a record that is not
  STARTING (a replace() after controller recovery, a pop-and-re-add with a new actor)
  cannot serve a stale set either; the disarm stays because during a rollout those
  fields change on most ticks and storing would only churn.
- Hashes of str are salted per process, so a fingerprint means something only inside the
  process that computed it; it is a cache key, never sent to another actor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from controlplane.lifecycle import (
    ACTIVE_STATES,
    SERVING_STATES,
    ReplicaEvent,
    ReplicaState,
    is_terminal,
    next_state,
)

_MOD = 2**64


@dataclass(frozen=True)
class ReplicaRecord:
    replica_id: str
    state: ReplicaState
    version: str  # code version the replica runs
    rank: int | None = None
    actor_name: str = ""
    actor_id: str | None = None  # materializes when the replica has started
    node_id: str | None = None  # idem
    started_at: float = 0.0
    message: str = ""  # last error / reason, for status

    def with_state(self, state: ReplicaState, **changes: object) -> ReplicaRecord:
        return dataclasses.replace(self, state=state, **changes)


def _membership_term(record: ReplicaRecord) -> int:
    return hash((record.replica_id, record.state.value))


def _placement_term(record: ReplicaRecord) -> int:
    return hash((record.replica_id, record.actor_id, record.node_id))


class ReplicaSet:
    """The live replicas of one deployment, bucketed by state, with O(1) counts."""

    def __init__(self) -> None:
        self._records: dict[str, ReplicaRecord] = {}
        self._buckets: dict[ReplicaState, dict[str, ReplicaRecord]] = {
            state: {} for state in ReplicaState
        }
        self._fingerprint = 0
        # Same construction over (id, actor_id, node_id); keys the actor/node memos.
        self._placement = 0
        self._memos: dict[str, tuple[Hashable, frozenset[str]]] = {}
        self.memo_recomputes = 0

    # -- membership -------------------------------------------------------------------

    def add(self, record: ReplicaRecord) -> None:
        if record.replica_id in self._records:
            raise ValueError(f"replica {record.replica_id!r} is already in the set")
        _refuse_terminal(record)
        self._insert(record)

    def remove(self, replica_id: str) -> ReplicaRecord:
        record = self._records[replica_id]
        self._discard(record)
        return record

    def replace(self, record: ReplicaRecord) -> None:
        """Swap in a new record for an existing id; any field, state included, may change."""
        old = self._records[record.replica_id]
        _refuse_terminal(record)
        self._discard(old)
        self._insert(record)

    def apply(self, replica_id: str, event: ReplicaEvent) -> ReplicaRecord:
        """Move a replica through the lifecycle table; a terminal result drops the record."""
        old = self._records[replica_id]
        new = old.with_state(next_state(old.state, event))
        self._discard(old)
        if not is_terminal(new.state):
            self._insert(new)
        return new

    def _insert(self, record: ReplicaRecord) -> None:
        self._records[record.replica_id] = record
        self._buckets[record.state][record.replica_id] = record
        self._fingerprint = (self._fingerprint + _membership_term(record)) % _MOD
        self._placement = (self._placement + _placement_term(record)) % _MOD

    def _discard(self, record: ReplicaRecord) -> None:
        del self._records[record.replica_id]
        del self._buckets[record.state][record.replica_id]
        self._fingerprint = (self._fingerprint - _membership_term(record)) % _MOD
        self._placement = (self._placement - _placement_term(record)) % _MOD

    # -- reads ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._records

    def get(self, replica_id: str) -> ReplicaRecord | None:
        return self._records.get(replica_id)

    def records(self) -> list[ReplicaRecord]:
        return list(self._records.values())

    def ids_in(self, *states: ReplicaState) -> frozenset[str]:
        return frozenset().union(*(self._buckets[state].keys() for state in states))

    def count(self, *states: ReplicaState) -> int:
        return sum(len(self._buckets[state]) for state in states)

    @property
    def fingerprint(self) -> int:
        return self._fingerprint

    # -- memoized collections ---------------------------------------------------------

    def running_ids(self) -> frozenset[str]:
        """Ids of replicas that can take requests (RUNNING or UPDATING)."""
        return self._memoized("running_ids", self._fingerprint, self._walk_running_ids)

    def alive_actor_ids(self) -> frozenset[str]:
        """Actor ids of active replicas whose actor has materialized."""
        key = (self._fingerprint, self._placement)
        return self._memoized("alive_actor_ids", key, self._walk_alive_actor_ids)

    def node_ids(self) -> frozenset[str]:
        """Nodes that host at least one active replica with a known node."""
        key = (self._fingerprint, self._placement)
        return self._memoized("node_ids", key, self._walk_node_ids)

    def _memoized(
        self, name: str, key: Hashable, walk: Callable[[], frozenset[str]]
    ) -> frozenset[str]:
        # While a replica is STARTING its actor_id/node_id may appear in place, so a
        # stored result could go stale without any key change: walk, and keep nothing.
        if self._buckets[ReplicaState.STARTING]:
            self.memo_recomputes += 1
            return walk()
        memo = self._memos.get(name)
        if memo is not None and memo[0] == key:
            return memo[1]
        self.memo_recomputes += 1
        value = walk()
        self._memos[name] = (key, value)
        return value

    def _walk_running_ids(self) -> frozenset[str]:
        return self.ids_in(*SERVING_STATES)

    def _walk_alive_actor_ids(self) -> frozenset[str]:
        return frozenset(
            r.actor_id for r in self._active_records() if r.actor_id is not None
        )

    def _walk_node_ids(self) -> frozenset[str]:
        return frozenset(r.node_id for r in self._active_records() if r.node_id is not None)

    def _active_records(self) -> list[ReplicaRecord]:
        return [r for state in ACTIVE_STATES for r in self._buckets[state].values()]


def _refuse_terminal(record: ReplicaRecord) -> None:
    # A terminal record has no place in the set; reach FAILED/STOPPED through apply().
    if is_terminal(record.state):
        raise ValueError(
            f"replica {record.replica_id!r} is {record.state.value}; terminal records are "
            "not kept (use apply() or remove())"
        )
