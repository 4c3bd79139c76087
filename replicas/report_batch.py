"""Node-batched metric reports: the per-node batcher. No Ray, no I/O.

Why: one Ray actor call per replica report cost a shard ~555 us of CPU per
update, so one shard could not hold 32K replicas. The replicas of a node hand their
reports to that node's reporter (``replicas.node_reporter.NodeReporter``; the row format,
``ReportRow``, is the wire's) over a local call; it
sends each shard one batch per interval, and the shard takes in a batch with one call.

Owns ``ReportBatcher``: the rows waiting per shard, newest per replica, and the flush
  bookkeeping the reporter shell acts on.

Invariants:

- At most one pending row per replica per shard (a newer report replaces an older one:
  reports are absolute, so nothing is lost by keeping the newest), so a batcher's memory
  is bounded by its node's replicas, however long a shard is away.
- At most one batch in flight per shard. A batch that failed is merged back under the
  rows that arrived meanwhile (newer rows win), and sent on the next flush.
- A flush stuck past ``stuck_after_s`` makes ``accepts`` False for that shard: the
  reporter then tells replicas to report directly, so a wedged reporter or shard link
  never silences thousands of replicas at once (seed 000's stall guard is for controller
  lag, not for a broken relay).
- Unhealthy results never wait for a batch: the replica sends them to the shard directly
  (``replicas.report_sender``); the batcher is for the steady majority.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from controlplane.wire import Batch, DeploymentKey, ReportRow

@dataclass
class _ShardQueue:
    pending: dict[str, tuple[DeploymentKey, ReportRow]]  # replica id -> newest row
    in_flight_since: float | None = None  # a batch is out since then; None when none


class ReportBatcher:
    """The rows of one node's replicas waiting for each shard."""

    def __init__(self, stuck_after_s: float) -> None:
        if stuck_after_s <= 0:
            raise ValueError(f"stuck_after_s must be > 0, got {stuck_after_s}")
        self._stuck_after_s = stuck_after_s
        self._shards: dict[str, _ShardQueue] = {}
        self.rows_total = 0  # rows taken in
        self.batches_total = 0  # batches handed out to send
        self.failed_batches_total = 0

    def accepts(self, shard: str, now: float) -> bool:
        """False while a batch to ``shard`` has been in flight too long."""
        queue = self._shards.get(shard)
        since = queue.in_flight_since if queue is not None else None
        return since is None or now - since < self._stuck_after_s

    def add(self, shard: str, key: DeploymentKey, row: ReportRow) -> None:
        queue = self._shards.get(shard)
        if queue is None:
            queue = self._shards[shard] = _ShardQueue({})
        queue.pending[row.replica_id] = (key, row)
        self.rows_total += 1

    def pending(self, shard: str) -> int:
        queue = self._shards.get(shard)
        return len(queue.pending) if queue is not None else 0

    def take_ready(self, now: float) -> list[tuple[str, Batch]]:
        """The batches to send now: every shard with rows and no batch in flight."""
        ready = []
        for shard, queue in self._shards.items():
            if queue.pending and queue.in_flight_since is None:
                ready.append((shard, _group(queue.pending.values())))
                queue.pending = {}
                queue.in_flight_since = now
                self.batches_total += 1
        return ready

    def sent(self, shard: str) -> None:
        """The shard took the batch in."""
        self._shards[shard].in_flight_since = None

    def failed(self, shard: str, batch: Batch) -> None:
        """Sending failed (the shard is restarting): keep the rows, newer ones winning."""
        queue = self._shards[shard]
        queue.in_flight_since = None
        self.failed_batches_total += 1
        merged = {row.replica_id: (key, row) for key, rows in batch.items() for row in rows}
        merged.update(queue.pending)
        queue.pending = merged


def _group(pending: Iterable[tuple[DeploymentKey, ReportRow]]) -> Batch:
    batch: Batch = {}
    for key, row in pending:
        rows = batch.get(key)
        if rows is None:
            rows = batch[key] = []
        rows.append(row)
    return batch
