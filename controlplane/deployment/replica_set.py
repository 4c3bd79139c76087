"""One deployment's replicas: the records, their membership fingerprint, and a memo on it.

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
- ``running_ids`` is memoized on the fingerprint, as a frozenset so a caller cannot mutate
  the shared memo: it depends on ids and states only, so it is recomputed exactly when
  the fingerprint moves. (A memo of fields outside the fingerprint, such as actor or node
  ids, would need its own key and the seed's disarm-while-STARTING rule.)
- Hashes of str are salted per process, so a fingerprint means something only inside the
  process that computed it; it is a cache key, never sent to another actor.
"""

from __future__ import annotations

from typing import NamedTuple

from controlplane.deployment.lifecycle import (
    SERVING_STATES,
    TERMINAL_STATES,
    ReplicaEvent,
    ReplicaState,
    is_terminal,
    next_state,
)
from controlplane.deployment.rank_index import RunningRankIndex
from controlplane.deployment.work import WorkTotals

_MOD = 2**64
RUNNING = ReplicaState.RUNNING


class ReplicaRecord(NamedTuple):
    """Immutable; a NamedTuple rather than a frozen dataclass because one is made per
    transition, and a tuple is built in one step where a frozen dataclass sets each
    field through ``object.__setattr__``."""

    replica_id: str
    state: ReplicaState
    version: str  # code version the replica runs
    rank: int | None = None
    actor_name: str = ""
    actor_id: str | None = None  # materializes when the replica has started
    node_id: str | None = None  # idem
    started_at: float = 0.0
    message: str = ""  # last error / reason, for status
    http_address: str | None = None  # its direct ingress (haproxy mode), once started

    def with_state(self, state: ReplicaState, **changes: object) -> ReplicaRecord:
        return self.with_fields(state, changes)

    def with_fields(self, state: ReplicaState, changes: dict[str, object]) -> ReplicaRecord:
        """``with_state`` with the changes as a dict, passed on as is (``**`` would copy
        them at each call they go through). What ``_replace(state=state, **changes)``
        does, by field index instead of a ``kwargs.pop`` per field: it runs per
        transition."""
        values = list(self)
        values[1] = state
        for name, value in changes.items():
            try:
                values[_FIELD_INDEX[name]] = value
            except KeyError:
                raise ValueError(f"Got unexpected field names: {[name]!r}") from None
        return _new_tuple(ReplicaRecord, values)


_FIELD_INDEX = {name: i for i, name in enumerate(ReplicaRecord._fields)}
_new_tuple = tuple.__new__


class Moved(NamedTuple):
    """One lifecycle event applied to a replica (``ReplicaBook.apply``), as each owner of
    the deployment hears it. ``was`` is None for a replica taken over alive (re-adopted);
    ``record`` is the record after the event (for a terminal state, the last one, with
    that state: it has left the set); ``started``: a start finished (STARTING to RUNNING),
    the event most owners act on."""

    replica_id: str
    was: ReplicaState | None
    record: ReplicaRecord
    now: float
    started: bool = False


def _bump(counts: dict, key: object, by: int) -> int:
    """``counts[key] += by``, dropping a key that reaches 0; the new count."""
    n = counts.get(key, 0) + by
    if n:
        counts[key] = n
    else:
        del counts[key]
    return n


def _serving_term(record: ReplicaRecord) -> int:
    """What routers see of a serving replica (``ReplicaInfo``'s fields but its models)."""
    return hash((record.replica_id, record.actor_name, record.node_id, record.http_address))


class ReplicaSet:
    """The live replicas of one deployment, bucketed by state, with O(1) counts."""

    def __init__(self, work: WorkTotals | None = None) -> None:
        self._work = work if work is not None else WorkTotals()
        self._records: dict[str, ReplicaRecord] = {}
        self._buckets: dict[ReplicaState, dict[str, ReplicaRecord]] = {
            state: {} for state in ReplicaState
        }
        self._fingerprint = 0
        # Of the serving replicas alone: STARTING/STOPPING churn leaves it unchanged, so
        # the running-id memo (keyed on it) is not rebuilt when only that moved.
        self._serving_fingerprint = 0
        # Serving records that changed since the last ``take_serving_changes`` (None: it
        # left the serving states): routing's deltas, O(changes).
        self._serving_changes: dict[str, ReplicaRecord | None] = {}
        self._versions: dict[str, int] = {}  # code version -> records running it
        self._state_versions: dict[tuple[ReplicaState, str], int] = {}
        self._seq = 0  # insertions so far: a record's latest one orders the records
        self._insert_seq: dict[str, int] = {}
        self._ranked = RunningRankIndex(self._live_entry, self._work)
        self._running_memo: tuple[int, frozenset[str]] | None = None  # (fingerprint, ids)

    # -- membership -------------------------------------------------------------------

    def add(self, record: ReplicaRecord) -> None:
        if record[0] in self._records:
            raise ValueError(f"replica {record.replica_id!r} is already in the set")
        if record[1] in TERMINAL_STATES:
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

    def apply(self, replica_id: str, event: ReplicaEvent, **changes: object) -> ReplicaRecord:
        """Move a replica through the lifecycle table (with ``changes`` to its other
        fields, unless the result is terminal); a terminal result drops the record."""
        return self.apply_fields(replica_id, event, changes)

    def apply_fields(self, replica_id: str, event: ReplicaEvent,
                     changes: dict[str, object]) -> ReplicaRecord:
        """``apply`` with the changes as a dict (``ReplicaRecord.with_fields``)."""
        old = self._records[replica_id]
        state = next_state(old.state, event)
        if is_terminal(state):
            self._discard(old)
            return old.with_fields(state, {})
        new = old.with_fields(state, changes)
        if new[2] == old[2]:
            self._move(old, new)
        else:
            self._discard(old)
            self._insert(new)
        return new

    def _move(self, old: ReplicaRecord, new: ReplicaRecord) -> None:
        """``_discard(old)`` then ``_insert(new)`` for a record that keeps its version (a
        transition): the per-version count stands, the rest in one pass."""
        rid, was, state = old[0], old[1], new[1]
        records, buckets = self._records, self._buckets
        del records[rid]
        records[rid] = new  # re-added: a record's latest insertion orders the records
        del buckets[was][rid]
        buckets[state][rid] = new
        version, by_key = new[2], self._state_versions
        _bump(by_key, (was, version), -1)
        key = (state, version)
        by_key[key] = in_key = by_key.get(key, 0) + 1
        self._seq = seq = self._seq + 1
        self._insert_seq[rid] = seq
        if state is RUNNING:
            self._ranked.push(version, new[3], seq, rid, in_key)
        self._fingerprint = (self._fingerprint - hash((rid, was._value_))
                             + hash((rid, state._value_))) % _MOD
        serving = self._serving_changes
        if was in SERVING_STATES:
            self._serving_fingerprint = (self._serving_fingerprint - _serving_term(old)) % _MOD
            serving[rid] = None
        if state in SERVING_STATES:
            self._serving_fingerprint = (self._serving_fingerprint + _serving_term(new)) % _MOD
            serving[rid] = new

    def _insert(self, record: ReplicaRecord) -> None:
        # Plain dicts and locals, counts bumped inline (an increment never empties one):
        # this and ``_discard`` run on every transition.
        rid, state, version = record[0], record[1], record[2]
        self._records[rid] = record
        self._buckets[state][rid] = record
        versions, by_key, key = self._versions, self._state_versions, (state, version)
        versions[version] = versions.get(version, 0) + 1
        by_key[key] = in_key = by_key.get(key, 0) + 1
        self._seq = seq = self._seq + 1
        self._insert_seq[rid] = seq
        if state is RUNNING:
            self._ranked.push(version, record.rank, seq, rid, in_key)
        # the membership term; ``_value_`` as ``.value`` is a slow descriptor
        self._fingerprint = (self._fingerprint + hash((rid, state._value_))) % _MOD
        if state in SERVING_STATES:
            self._serving_fingerprint = (self._serving_fingerprint + _serving_term(record)) % _MOD
            self._serving_changes[rid] = record

    def _discard(self, record: ReplicaRecord) -> None:
        rid, state, version = record[0], record[1], record[2]
        del self._records[rid]
        del self._buckets[state][rid]
        _bump(self._versions, version, -1)
        _bump(self._state_versions, (state, version), -1)
        del self._insert_seq[rid]
        self._fingerprint = (self._fingerprint - hash((rid, state._value_))) % _MOD
        if state in SERVING_STATES:
            self._serving_fingerprint = (self._serving_fingerprint - _serving_term(record)) % _MOD
            self._serving_changes[rid] = None

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
        if len(states) == 1:  # the usual call, without a generator
            return len(self._buckets[states[0]])
        return sum(len(self._buckets[state]) for state in states)

    def count_version(self, version: str) -> int:
        """Records (any state) running code ``version``, in O(1)."""
        return self._versions.get(version, 0)

    def take_serving_changes(self) -> dict[str, ReplicaRecord | None]:
        """Serving replicas that joined or changed (their record) or left (None) since
        the last call."""
        changes, self._serving_changes = self._serving_changes, {}
        return changes

    def count_state_version(self, state: ReplicaState, version: str) -> int:
        """Records in ``state`` running code ``version``, in O(1)."""
        return self._state_versions.get((state, version), 0)

    def records_in(self, state: ReplicaState) -> list[ReplicaRecord]:
        """The records in ``state``, in record order (O(records in that state))."""
        return list(self._buckets[state].values())

    def retire_first(self, exclude_version: str | None, k: int) -> list[str] | None:
        """The k RUNNING replicas not at ``exclude_version`` that a rollout retires first
        (highest rank first, ties in record order), in O(k log N); None when fewer."""
        return self._ranked.highest(exclude_version, k)

    def _live_entry(self, entry: tuple[int, int, str], version: str) -> bool:
        record = self._records.get(entry[2])
        return (record is not None and self._insert_seq[entry[2]] == entry[1]
                and record.state == ReplicaState.RUNNING and record.version == version)

    @property
    def fingerprint(self) -> int:
        return self._fingerprint

    # -- the memo -----------------------------------------------------------------------

    def running_ids(self) -> frozenset[str]:
        """Ids of replicas that can take requests (RUNNING or UPDATING)."""
        memo = self._running_memo
        if memo is not None and memo[0] == self._serving_fingerprint:
            return memo[1]
        self._work.running_sets_built += 1
        ids = self.ids_in(*SERVING_STATES)
        self._running_memo = (self._serving_fingerprint, ids)
        return ids


def _refuse_terminal(record: ReplicaRecord) -> None:
    # A terminal record has no place in the set; reach FAILED/STOPPED through apply().
    if is_terminal(record.state):
        raise ValueError(
            f"replica {record.replica_id!r} is {record.state.value}; terminal records are "
            "not kept (use apply() or remove())"
        )


class CountedMap:
    """A dict (replica id -> version) that also counts each value in O(1)."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._counts: dict[str, int] = {}

    def __setitem__(self, key: str, value: str) -> None:
        if key in self._values:
            self.pop(key)
        self._values[key] = value
        self._counts[value] = self._counts.get(value, 0) + 1

    def pop(self, key: str, default: str | None = None) -> str | None:
        if key not in self._values:
            return default
        value = self._values.pop(key)
        self._counts[value] -= 1
        if not self._counts[value]:
            del self._counts[value]
        return value

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._values.get(key, default)

    def count(self, value: str) -> int:
        return self._counts.get(value, 0)

    def __len__(self) -> int:
        return len(self._values)
