"""Where a replica's metric report goes: its node's reporter, or its shard directly.

Owns the choice per report and the fallback when the node reporter is missing, dead,
slow or says no (``replicas.node_reporter``).

Invariants:

- A report carrying an unhealthy result goes to the shard directly, never through a
  batch: a flip to unhealthy reaches the shard at once (seed 000), not an interval later.
- Any failure of the node path (the reporter died, did not answer within the report
  interval, or refused because its link to the shard is stuck) sends that same report
  directly, so a broken relay costs no freshness; the reporter is looked up again only
  after ``RETRY_REPORTER_S``, so a dead one is not hammered by every replica of its node.
- A reporter just found may still be starting (its worker waits behind the node's other
  worker starts during a scale-up burst): its reports go directly, without waiting and
  without counting as a failure, until it answers ``ready``; only one that has not
  answered in ``START_TIMEOUT_S`` counts as failed. (Before, a first report that waited
  out the 5 s timeout sent every replica of the node directly for 30 s: at one report a
  second each, a flood of single calls on the shard in the middle of a scale-up.)
- ``interval_s`` 0 (``ReplicaSettings.report_batch_interval_s``): every report is direct.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from controlplane.clock import Clock
from controlplane.wire import MetricReport, report_row

logger = logging.getLogger(__name__)

RETRY_REPORTER_S = 30.0
START_TIMEOUT_S = 60.0  # a found reporter that has not answered ``ready`` by then failed
FIRST_WAIT_S = 1.0  # how long a report waits, once, for a reporter just found
STATS_REFRESH_S = 30.0  # unchanged autoscaling stats are sent again this often


class ReportSender:
    def __init__(self, shard: Any, shard_name: str, key: tuple[str, str], clock: Clock,
                 find_reporter: Callable[[], Awaitable[Any]] | None,
                 timeout_s: float) -> None:
        self._shard = shard
        self._shard_name = shard_name
        self._key = key
        self._clock = clock
        self._find_reporter = find_reporter  # None: batching is off
        self._timeout_s = timeout_s
        self._reporter: Any = None
        self._starting: asyncio.Future | None = None  # its ``ready`` call, until answered
        self._start_by = 0.0
        self._retry_at = 0.0

    async def send(self, report: MetricReport) -> None:
        if await self._via_node(report):
            return
        # as a batch of one: the shard takes every report one way
        await self._shard.report_rows.remote(self._key, [report_row(report)])

    async def _via_node(self, report: MetricReport) -> bool:
        if self._find_reporter is None or (report.health is not None
                                           and not report.health.healthy):
            return False
        if self._reporter is None and not await self._find():
            return False
        if self._starting is not None and not self._started():
            return False
        try:
            ref = self._reporter.report.remote(self._shard_name, self._key, report_row(report))
            if await asyncio.wait_for(ref, self._timeout_s):
                return True
            return False  # its link to the shard is stuck: direct, keep the reporter
        except Exception as e:  # died or too slow: direct, and look again later
            return self._failed(f"the node reporter failed: {e!r}")

    async def _find(self) -> bool:
        """Look the reporter up (created if missing), not within the retry delay; its
        ``ready`` call is waited on for ``FIRST_WAIT_S`` here, later only looked at."""
        if self._clock.monotonic() < self._retry_at:
            return False
        try:
            self._reporter = await self._find_reporter()
            ready = getattr(self._reporter, "ready", None)  # an older reporter: none, used
            self._starting = asyncio.ensure_future(ready.remote()) if ready else None
        except Exception as e:
            return self._failed(f"finding the node reporter failed: {e!r}")
        if self._starting is not None:
            self._start_by = self._clock.monotonic() + START_TIMEOUT_S
            await asyncio.wait([self._starting], timeout=FIRST_WAIT_S)
        return True

    def _started(self) -> bool:
        """The reporter answered ``ready``; False while it starts (this report goes
        directly, nothing failed) or when it failed to start (then as any failure)."""
        starting = self._starting
        if not starting.done():
            if self._clock.monotonic() < self._start_by:
                return False
            starting.cancel()
            return self._failed(f"the node reporter did not start in {START_TIMEOUT_S:g}s")
        self._starting = None
        try:
            starting.result()
        except Exception as e:
            return self._failed(f"the node reporter failed to start: {e!r}")
        return True

    def _failed(self, why: str) -> bool:
        logger.warning("%s; reporting directly to %s for %gs", why, self._shard_name,
                       RETRY_REPORTER_S)
        self._reporter, self._starting = None, None
        self._retry_at = self._clock.monotonic() + RETRY_REPORTER_S
        return False


class AutoscalingStatsSender:
    """A replica's ``record_autoscaling_stats()`` to its shard, beside the load reports:
    sent when it changed, and again every ``STATS_REFRESH_S`` so a restarted shard learns
    it; never when the replica has none. Fire and forget: one small call per change (an
    LLM engine's change at most once per health-check read of its ``/metrics``)."""

    def __init__(self, init: Any, shard: Any, clock: Clock) -> None:
        self._key = (init.app_name, init.deployment)
        self._replica_id = init.replica_id
        self._shard, self._clock = shard, clock
        self._sent: dict[str, float] | None = None
        self._sent_at = float("-inf")

    def maybe_send(self, stats: dict[str, float] | None) -> bool:
        now = self._clock.monotonic()
        if stats is None or (stats == self._sent and now - self._sent_at < STATS_REFRESH_S):
            return False
        self._shard.report_autoscaling_stats.remote(self._key, self._replica_id, stats)
        self._sent, self._sent_at = stats, now
        return True
