"""The replica's push health: self-checks on the replica's clock, pushed to its shard.

Owns, for one replica: the self-health task (``SelfHealth.run_forever``), the heartbeat
tasks, and the send decisions (``HealthPusher``). The pure rules live in
``replicas.self_health`` and ``replicas.health_pusher``; this is only their shell. It
touches no Ray: the replica actor injects the check, the ``Clock`` and the heartbeat
sender, and keeps the remote methods (``check_health``, ``update_health_timings``) as
one-line delegations. The shard's death watch (``wait_until_stopped``) is the actor's
lifecycle, not health, and lives on ``Replica``.

Invariants (seed 000, ray-project/ray#64913, and its review fixes):

- ``start`` runs a fresh user check (``check_fresh``), never the cached result, and a
  failing one fails it (so replica initialization fails) before the self-health task
  starts (the seed's High Severity finding: a recent failure in the cache failed a live
  replica that a fresh check passes).
- While the self-health task runs, a probe is answered from the cache: concurrent probes
  never re-run a user check.
- Every metric report carries the newest result (``for_report``, then ``report_sent``); a
  heartbeat fills the gap only when ``HealthPusher`` says so, at most one in flight,
  except that a flip to unhealthy goes out at once. A heartbeat's outcome is reported
  back to the pusher exactly once, whether the send returned or raised.
- Every task started here is owned (kept in ``_tasks``, failures logged) and is cancelled
  by ``stop``; after ``stop`` no new task starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine

from controlplane.clock import Clock
from controlplane.wire import PushedHealth
from replicas.health_pusher import HealthPusher, to_pushed
from replicas.self_health import Check, HealthSnapshot, SelfHealth

logger = logging.getLogger(__name__)

SendHeartbeat = Callable[[PushedHealth], Awaitable[object]]


class ReplicaHealth:
    def __init__(self, check: Check, *, clock: Clock, send_heartbeat: SendHeartbeat,
                 replica_id: str, shard_name: str, period_s: float, timeout_s: float,
                 unhealthy_threshold: int, report_interval_s: float) -> None:
        """``send_heartbeat(payload)`` pushes one result to the shard (the replica binds
        the shard handle, app, deployment and replica id); ``replica_id`` and
        ``shard_name`` only label log lines."""
        self._clock = clock
        self._send = send_heartbeat
        self._replica_id = replica_id
        self._shard_name = shard_name
        self._pusher = HealthPusher(period_s, report_interval_s)
        self._self = SelfHealth(check, period_s=period_s, timeout_s=timeout_s, clock=clock,
                                unhealthy_threshold=unhealthy_threshold, logger=logger,
                                on_result=self._on_result)
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._stopped = False

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Fresh user check (``HealthCheckFailed`` if it fails), then the self-health task."""
        if self._started or self._stopped:
            raise RuntimeError("ReplicaHealth.start: already started or stopped")
        self._started = True
        await self._self.check_fresh()
        self._spawn(self._self.run_forever(), "self-health")

    def stop(self) -> None:
        """Cancel every task (self-health and heartbeats); start no new one."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()

    # ---- what metric reports carry ---------------------------------------------------
    def for_report(self) -> PushedHealth | None:
        """The newest result for a metric report; None before any check completed."""
        return to_pushed(self._self.snapshot())

    @property
    def healthy(self) -> bool:
        """The newest result (True before the first one)."""
        return self._self.snapshot().healthy

    def report_sent(self) -> None:
        """A metric report carrying ``for_report()`` was sent just now."""
        self._pusher.on_report_sent(self._self.snapshot(), self._clock.monotonic())

    # ---- what the replica's remote methods delegate to ----------------------------------
    async def check_fresh(self) -> None:
        """Run the user check now, bypassing the cache (a recovering shard re-adopting this
        replica must not judge it by a stale result); ``HealthCheckFailed`` if it fails."""
        await self._self.check_fresh()

    async def check_for_probe(self) -> None:
        """A pull probe: the cached result while the self-health task runs, else a fresh
        check; raises ``HealthCheckFailed`` when unhealthy."""
        await self._self.check_for_probe()

    def set_timings(self, period_s: float, timeout_s: float) -> None:
        """A redeploy changed health_check_period_s / _timeout_s in place."""
        self._self.set_timings(period_s, timeout_s)
        self._pusher.set_period(period_s)

    # ---- heartbeats ------------------------------------------------------------------
    def _on_result(self, snapshot: HealthSnapshot) -> None:
        """Every self-check result (sync, from ``SelfHealth``): heartbeat it if needed."""
        now = self._clock.monotonic()
        if self._stopped or not self._pusher.should_heartbeat(snapshot, now):
            return
        payload = self._pusher.heartbeat_payload(snapshot)
        self._pusher.on_heartbeat_sent(payload, now)
        self._spawn(self._heartbeat(payload), "heartbeat")

    async def _heartbeat(self, payload: PushedHealth) -> None:
        try:
            await self._send(payload)
        except Exception as e:  # the shard may be restarting; the next result retries
            logger.warning("replica %s: heartbeat to %s failed: %r",
                           self._replica_id, self._shard_name, e)
        finally:
            self._pusher.on_heartbeat_done(payload)

    # ---- owned tasks -------------------------------------------------------------------
    def _spawn(self, coro: Coroutine, what: str) -> None:
        if self._stopped:  # e.g. stopped while start's fresh check ran
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("replica %s: %s task failed", self._replica_id, task.get_name(),
                         exc_info=task.exception())
