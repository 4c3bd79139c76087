"""What one router knows about the load of each replica of one deployment.

A replica's load, as this router sees it, is two numbers:

- ``in_flight``: this router's own requests on the replica, from the moment a slot is
  reserved until the request ends. Exact and free: this router is the only one changing it.
- ``others``: everyone else's requests on it, from the queue length the replica last
  reported to a probe, minus this router's share at the time. Cached: refreshed when
  older than ``ttl_s``; unknown (None) until the first answer and after a failed probe.

``load = in_flight + (others or 0)``: an unknown ``others`` counts as 0, so a failed probe
never stalls placement (the replica's own semaphore still caps execution). Keeping only
the others' part in the cache means our own completions free capacity immediately, with no
probe, which is what lets a queued request take a slot the moment one of ours ends.

Invariants: only members (the RUNNING set last pushed by the owning shard) are placeable;
a departed replica keeps an entry only while this router still has requests on it, so the
table never grows past members + draining. ``occupancy`` costs O(1): the member sums are
maintained on every change, never recomputed by a walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass
class _Entry:
    in_flight: int = 0
    others: int | None = None  # None: unknown
    checked_at: float | None = None  # last probe answer or failure; None: probe now
    probing: bool = False
    probe_base: int = 0  # in_flight when the running probe was sent
    unreachable: bool = False  # a call found the actor gone; out of placement until it answers
    member: bool = True
    kv: float = 0.0  # the engine's KV-cache use (0-1) the replica last reported, if any


class QueueLenCache:
    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._entries: dict[str, _Entry] = {}
        self._member_ids: list[str] = []
        self._member_in_flight = 0
        self._member_others = 0
        self.in_flight_total = 0  # over members and draining replicas alike

    # ---- membership ------------------------------------------------------------------
    def set_members(self, replica_ids: Iterable[str]) -> None:
        """Make exactly ``replica_ids`` placeable (O(N), on membership change only)."""
        wanted = dict.fromkeys(replica_ids)
        for replica_id, entry in list(self._entries.items()):
            if entry.member and replica_id not in wanted:
                self._leave(replica_id, entry)
        for replica_id in wanted:
            entry = self._entries.get(replica_id)
            if entry is None:
                self._entries[replica_id] = _Entry()
            elif not entry.member:  # came back before its last request ended
                entry.member = True
                self._member_in_flight += entry.in_flight
                self._member_others += entry.others or 0
        self._member_ids = list(wanted)

    def _leave(self, replica_id: str, entry: _Entry) -> None:
        entry.member = False
        self._member_in_flight -= entry.in_flight
        self._member_others -= entry.others or 0
        if entry.in_flight == 0:
            del self._entries[replica_id]

    def member_ids(self) -> list[str]:
        """The placeable set, for sampling; callers must not mutate it."""
        return self._member_ids

    def accepts_requests(self, replica_id: str) -> bool:
        """A member (not stopping) that no call has found unreachable."""
        entry = self._entries.get(replica_id)
        return entry is not None and entry.member and not entry.unreachable

    # ---- load ------------------------------------------------------------------------
    def in_flight(self, replica_id: str) -> int:
        entry = self._entries.get(replica_id)
        return entry.in_flight if entry else 0

    def load_if_placeable(self, replica_id: str, max_ongoing: int) -> int | None:
        """The known load, or None when the replica must not get a new request: not a
        member (stopping), unreachable, or known load already at ``max_ongoing``."""
        if not self.accepts_requests(replica_id):
            return None
        entry = self._entries[replica_id]
        load = entry.in_flight + (entry.others or 0)
        return load if load < max_ongoing else None

    def member_load_total(self) -> int:
        """The known load over the members (this router's and others'), O(1)."""
        return self._member_in_flight + self._member_others

    def occupancy(self, max_ongoing: int) -> float:
        """Known load over fleet capacity, in [0, 1]; 1 with no replicas (nothing drains)."""
        capacity = len(self._member_ids) * max_ongoing
        if capacity <= 0:
            return 1.0
        return min(1.0, self.member_load_total() / capacity)

    # ---- this router's requests --------------------------------------------------------
    def reserve(self, replica_id: str) -> None:
        entry = self._entries[replica_id]
        entry.in_flight += 1
        self.in_flight_total += 1
        if entry.member:
            self._member_in_flight += 1

    def release(self, replica_id: str) -> None:
        entry = self._entries[replica_id]
        entry.in_flight -= 1
        self.in_flight_total -= 1
        if entry.member:
            self._member_in_flight -= 1
        elif entry.in_flight == 0:
            del self._entries[replica_id]

    def in_flight_by_replica(self) -> dict[str, int]:
        return {rid: e.in_flight for rid, e in self._entries.items() if e.in_flight}

    # ---- probes ----------------------------------------------------------------------
    def needs_probe(self, replica_id: str, now: float) -> bool:
        """A member with no probe running whose ``others`` is missing or older than ttl."""
        entry = self._entries.get(replica_id)
        if entry is None or not entry.member or entry.probing:
            return False
        return entry.checked_at is None or now - entry.checked_at >= self._ttl_s

    def may_be_held_by_others(self, replica_id: str) -> bool:
        """False only when the cache says nobody else holds a slot there: then a probe
        cannot reveal a slot that our own completions will not announce first."""
        entry = self._entries.get(replica_id)
        return entry is not None and entry.member and not entry.probing and entry.others != 0

    def probe_started(self, replica_id: str) -> None:
        entry = self._entries[replica_id]
        entry.probing = True
        entry.probe_base = entry.in_flight

    def kv_of(self, replica_id: str) -> float:
        """The KV-cache use (0-1) the replica's last probe answer carried; 0 without."""
        entry = self._entries.get(replica_id)
        return entry.kv if entry is not None else 0.0

    def probe_answered(self, replica_id: str, queue_len: int, now: float,
                       kv: float | None = None) -> None:
        """Store the others' share of a reported queue length.

        Our share is taken as the larger of our in-flight count when the probe was sent
        and now: a request of ours that ended or started while the probe was out is then
        never counted as someone else's, so the estimate errs toward a free slot (the
        replica's semaphore absorbs the rare overshoot) and never idles one.
        """
        entry = self._entries.get(replica_id)
        if entry is None:
            return
        entry.probing = False
        if not entry.member:
            return
        if kv is not None:
            entry.kv = min(1.0, max(0.0, kv))
        others = max(0, queue_len - max(entry.probe_base, entry.in_flight))
        self._member_others += others - (entry.others or 0)
        entry.others, entry.checked_at, entry.unreachable = others, now, False

    def probe_failed(self, replica_id: str, now: float, unreachable: bool) -> None:
        """Forget ``others`` (unknown counts as 0); retry after ttl. ``unreachable`` also
        takes the replica out of placement until a probe answers."""
        entry = self._entries.get(replica_id)
        if entry is None:
            return
        entry.probing = False
        self._forget_others(entry)
        entry.checked_at = now
        entry.unreachable = entry.unreachable or unreachable

    def mark_unreachable(self, replica_id: str) -> None:
        """A request found the actor gone: no new requests until a probe answers, and
        probe at once (checked_at None) so a live replica is back within one round trip."""
        entry = self._entries.get(replica_id)
        if entry is None:
            return
        self._forget_others(entry)
        entry.unreachable, entry.checked_at = True, None

    def _forget_others(self, entry: _Entry) -> None:
        if entry.member:
            self._member_others -= entry.others or 0
        entry.others = None

    def unreachable_count(self) -> int:
        return sum(1 for e in self._entries.values() if e.member and e.unreachable)
