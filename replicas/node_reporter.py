"""The node reporter: one actor per node (and fleetplane namespace) that relays the metric
reports of that node's replicas to their shards in batches, so a shard takes one call
per node per interval, not one per replica report (why: ``report_batch``).

A thin shell over ``report_batch.ReportBatcher``: replicas call ``report`` (a local call:
the actor is pinned to their node), and every ``interval_s`` the reporter sends each shard
that has rows one ``report_batch`` call. It is a detached named actor (``reporter_for``),
created by the controller before a deploy's replicas start and when a node joins
(``start_reporters``), and by whichever replica of the node asks first if it is missing;
it needs no controller bookkeeping; the controller's ``shutdown`` removes the reporters
of its namespace (by the name prefix, ``settings.REPORTER_PREFIX``).

Failure behaviour (what the replica does is in ``replicas.report_sender``):

- The reporter dies: the replicas' next report fails, and they report directly to the
  shard until a new reporter is created on a later try. At most the rows of one interval
  are lost, a fraction of the 1.5-period freshness window.
- A shard restarts: the batch fails, its rows are kept (newest per replica) and sent again
  once the shard answers under its name.
- A batch hangs: after ``stuck_after_s`` the reporter answers ``report`` with False and the
  replicas report directly, so a wedged relay never looks like thousands of silent
  replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controlplane.clock import Clock
from controlplane.priority import take_control_priority
from controlplane.settings import reporter_actor_name, uses_reporter
from controlplane.wire import Batch, DeploymentKey, ReplicaInit, ReportRow
from replicas.report_batch import ReportBatcher
from replicas.report_sender import ReportSender

logger = logging.getLogger(__name__)

# A batch out this long means the relay is stuck: replicas go direct meanwhile.
STUCK_AFTER_INTERVALS = 10
MIN_STUCK_AFTER_S = 5.0


class NodeReporter:
    """The Ray actor (async): takes reports, sends batches."""

    def __init__(self, namespace: str, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        take_control_priority("node reporter")
        self._namespace = namespace
        self._interval_s = interval_s
        self._batcher = ReportBatcher(max(MIN_STUCK_AFTER_S, STUCK_AFTER_INTERVALS * interval_s))
        self._shards: dict[str, Any] = {}  # shard actor name -> handle
        self._flusher: asyncio.Task | None = None
        self._sends: set[asyncio.Task] = set()

    async def ready(self) -> bool:
        """Answered once the actor runs: a replica's sender waits for it without blocking
        its reports (``report_sender``)."""
        return True

    async def report(self, shard: str, key: DeploymentKey, row: ReportRow) -> bool:
        """Queue one replica's report for ``shard``; False: send it directly instead."""
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())
        if not self._batcher.accepts(shard, time.monotonic()):
            return False
        self._batcher.add(shard, key, row)
        return True

    async def statistics(self) -> dict:
        b = self._batcher
        return {"rows_total": b.rows_total, "batches_total": b.batches_total,
                "failed_batches_total": b.failed_batches_total,
                "pending": {s: b.pending(s) for s in self._shards}}

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            for shard, batch in self._batcher.take_ready(time.monotonic()):
                task = asyncio.get_running_loop().create_task(self._send(shard, batch))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)

    async def _send(self, shard: str, batch: Batch) -> None:
        try:
            handle = self._shards.get(shard)
            if handle is None:
                handle = self._shards[shard] = await asyncio.to_thread(
                    ray.get_actor, shard, namespace=self._namespace)
            await handle.report_batch.remote(batch)
        except Exception as e:  # restarting or gone: keep the rows, look it up again
            self._shards.pop(shard, None)
            self._batcher.failed(shard, batch)
            logger.warning("batch to %s failed (%d kept for the next try): %r",
                           shard, self._batcher.pending(shard), e)
            return
        self._batcher.sent(shard)


def reporter_for(namespace: str, node_id: str, interval_s: float) -> Any:
    """This node's reporter, created if there is none yet (safe to race: Ray returns the
    one that won). Detached, so it outlives the replica that created it."""
    return ray.remote(NodeReporter).options(
        name=reporter_actor_name(node_id), namespace=namespace, get_if_exists=True,
        lifetime="detached", num_cpus=0, max_restarts=0, max_concurrency=10_000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(namespace, interval_s)


def start_reporters(namespace: str, node_ids: list[str], interval_s: float) -> None:
    """Create the reporters of these nodes now (the controller, before a deploy's replicas
    start and when a node joins), so that a reporter's worker does not wait behind a
    scale-up's worker starts on its node (on this 2-core machine, 120 replica workers
    delayed the lazily created reporter by more than a minute). Creation is asynchronous;
    a node that has one keeps it; a failure here only leaves it to its replicas."""
    for node_id in node_ids:
        try:
            reporter_for(namespace, node_id, interval_s)
        except Exception as e:  # the replicas create it, or report directly
            logger.warning("the node reporter of %s was not created: %r", node_id[:12], e)


def report_sender(init: ReplicaInit, shard: Any, clock: Clock) -> ReportSender:
    """A replica's sender: through its node's reporter (``uses_reporter``), or directly."""
    key = (init.app_name, init.deployment)
    interval_s = init.report_batch_interval_s
    find: Callable[[], Awaitable[Any]] | None = None
    if uses_reporter(interval_s, init.metrics_report_interval_s, init.health_check_period_s):
        node_id = ray.get_runtime_context().get_node_id()

        async def find_reporter() -> Any:
            return await asyncio.to_thread(reporter_for, init.namespace, node_id, interval_s)
        find = find_reporter
    # A report through a running reporter; one still starting is waited for apart.
    timeout_s = max(5.0, 2 * init.metrics_report_interval_s)
    return ReportSender(shard, init.shard_name, key, clock, find, timeout_s)
