"""The data-plane router: one per (proxy or handle process, deployment), shared code.

Owns admission (``max_queued_requests``), placement (power of two choices over the RUNNING
replicas pushed by the owning shard) and the Retry-After of a rejection. Never calls the
controller or a shard per request: replica sets and limits arrive by push
(``update_replicas`` / ``update_config`` / ``apply_routing_update``).

Invariants:

- Never sends a request to a replica outside the last pushed set (stopping) or one a call
  found unreachable, nor to one whose known load (our in-flight + others' cached queue
  length) is at ``max_ongoing_requests`` -- with one bounded exception, the starvation
  guard (``_take_ticket``): at most one request per router waits at a replica, and only
  while other routers hold all its slots. The replica's own semaphore caps execution
  whatever routers do. A slot is *reserved* (counted in flight) synchronously when it is
  chosen, so two requests of one router never race for one slot.
- FIFO: while any request waits, new arrivals queue behind it; ``_dispatch`` serves only
  the head.
- Capacity is never left idle for our own sake: when one of our requests ends, the head
  waiter is handed that slot in the same callback, with no timer. The capped backoff
  (25 ms doubling to 100 ms) only re-probes replicas whose slots other routers may hold.
  Ray Serve 2.60's proxy instead backs off up to 0.5 s, leaving ~38% of a 0.5 s,
  2-slot replica idle at 20 req/s (measured: MEASURED.md, "A saturated replica stays
  busy").
- The rejection path is O(1): no RPC, no lock, no walk over replicas.
- Everything that waits is owned: probe tasks and the backoff timer die with ``close``.

Time: ``clock.monotonic()`` for every decision; timers use the running loop, whose clock
is the same monotonic clock in production and the same FakeClock in virtual-time tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from typing import Any, AsyncIterator, Callable, Iterable

from controlplane.clock import Clock
from controlplane.errors import BackpressureError, ReplicaUnavailableError, RouterClosedError
from controlplane.routing.admission import RetryAdvisor
from controlplane.routing.affinity_choice import (AFFINITY_FLOOR, affine_replica, home_or,
                                                  is_cold, next_in_turn)
from controlplane.routing.members import ReplicaMembers
from controlplane.routing.placement import choose_replica, sample_candidates
from controlplane.routing.policies import Affinity, RoutingPolicy, kv_score
from controlplane.routing.queue_len_cache import QueueLenCache
from controlplane.routing.router_stats import RouterCounters, RouterStatistics
from controlplane.routing.routing_config import RoutingConfig
from controlplane.routing.transport import ReplicaTransport
from controlplane.settings import RouterSettings
from controlplane.wire import RouterDemand, ReplicaInfo, RoutingUpdate

logger = logging.getLogger(__name__)


class Router:
    def __init__(self, config: RoutingConfig, transport: ReplicaTransport, clock: Clock,
                 rng: random.Random, settings: RouterSettings = RouterSettings()) -> None:
        self._config = config
        self._transport = transport
        self._clock = clock
        self._rng = rng
        self._settings = settings
        self._cache = QueueLenCache(settings.queue_len_ttl_s)
        self._members = ReplicaMembers()
        self._waiters: deque[asyncio.Future[ReplicaInfo]] = deque()  # may hold cancelled
        self._queued = 0  # live waiters: the admission count
        self._retry = RetryAdvisor()  # drain and arrival rates: a rejection's Retry-After
        self._backoff: asyncio.TimerHandle | None = None
        self._backoff_streak = 0  # backoffs since a waiter last got a slot
        self._probes: set[asyncio.Task] = set()
        self._closed: str | None = None  # the reason, once closed
        self._counts = RouterCounters()

    # ---- fed by the owning shard's push ----------------------------------------------
    def update_replicas(self, replicas: Iterable[ReplicaInfo]) -> None:
        """Replace the placeable set. Replicas left out (stopping) get no new request;
        their running requests finish normally; the transport forgets them (and looks
        up the new ones' handles now)."""
        before = self._members.by_id
        self._members.replace(replicas)
        forget = getattr(self._transport, "forget", None)
        if forget is not None:
            for replica_id in before.keys() - self._members.by_id.keys():
                forget(before[replica_id])
        warm = getattr(self._transport, "warm", None)  # handles in hand before a request
        if warm is not None:
            for replica_id in self._members.by_id.keys() - before.keys():
                warm(self._members.by_id[replica_id])
        self._cache.set_members(self._members.by_id)
        self._dispatch()

    def update_config(self, config: RoutingConfig) -> None:
        """New limits apply to the next decision; queued requests keep their place. Another
        policy starts with an empty prefix index: what this router sent where under the old
        one no longer says what the engines hold (a policy that keys no prompt records
        nothing while the caches move on)."""
        if config.policy.name != self._config.policy.name:
            self._members.forget_prompts()
        self._config = config
        self._dispatch()

    def apply_routing_update(self, update: RoutingUpdate | None) -> None:
        """The owning shard's routing update; None (deployment deleted) closes."""
        if update is None:
            self.close("the deployment was deleted")
            return
        self.update_config(RoutingConfig.from_update(self._config.deployment, update))
        if update.demand is not None:
            self._retry.heard_total(update.demand, self._clock.monotonic())
        if self._members.take_push(update.replicas):  # a demand-only change keeps it
            self.update_replicas(update.replicas)

    @property
    def informed(self) -> bool:
        """It reports its demand to the owning shard: the deployment's Retry-After uses the
        routers' total (``cluster_informed``), or it scales from zero (its routers' queued
        requests are the load that wakes it)."""
        return (self._config.retry_after_policy == "cluster_informed"
                or self._config.cold_hold_s is not None)

    @property
    def waits_cold(self) -> bool:
        """No replica to place on, and its deployment scales from zero: a request waits
        here for the first (``_wait_cold``) instead of being turned away at once."""
        return not len(self._members) and self._config.cold_hold_s is not None

    def demand(self) -> RouterDemand:
        """What this router reports for ``cluster_informed`` (``demand_board``)."""
        return self._retry.demand(self._queued, self._clock.monotonic())

    def close(self, reason: str) -> None:
        """Fail every waiter with RouterClosedError; stop probes and the backoff timer."""
        self._closed = reason
        self._cancel_backoff()
        for task in list(self._probes):
            task.cancel()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(RouterClosedError(self._config.deployment, reason))
        self._queued = 0

    # ---- requests --------------------------------------------------------------------
    @property
    def policy(self) -> RoutingPolicy:
        """The deployment's routing policy (what key a request carries)."""
        return self._config.policy

    async def assign(self, request: Any, model_id: str = "",
                     affinity: Affinity | None = None) -> Any:
        """Send ``request`` to a replica with room and return its result. Raises
        BackpressureError (queue full), ReplicaUnavailableError (the replica died while
        holding it; not retried), RouterClosedError, or the user's own exception."""
        async with self.slot(model_id, affinity) as replica:
            return await self._transport.send(replica, request)

    @contextlib.asynccontextmanager
    async def slot(self, model_id: str = "",
                   affinity: Affinity | None = None) -> AsyncIterator[ReplicaInfo]:
        """Hold one slot on a replica for the body (e.g. a streamed HTTP response, whose
        slot must outlive the first reply). Raise ReplicaUnavailableError in the body when
        the replica's actor is gone; the router then routes around it. A multiplexed
        ``model_id`` goes to a replica holding that model when one has room. An
        ``affinity`` (a prompt's or a session's, ``policies``) goes to its replica
        (``_try_affinity``) within the bounded load; a request that must wait is placed by
        load when a slot frees."""
        replica = await self._wait_slot(model_id, affinity)
        try:
            yield replica
        except ReplicaUnavailableError as e:
            # Before the release below, so the freed slot is not handed to the next waiter;
            # the probe brings a replica that was only briefly unreachable straight back.
            self._cache.mark_unreachable(replica.replica_id)
            if self._cache.needs_probe(replica.replica_id, self._clock.monotonic()):
                self._start_probe(replica.replica_id)
            raise ReplicaUnavailableError(replica.replica_id, e.reason,
                                          self._config.deployment) from e
        finally:
            self._release(replica.replica_id)

    @property
    def num_replicas(self) -> int:
        """Placeable replicas (O(1), for the proxy's no-replicas fast answer)."""
        return len(self._members)

    def statistics(self) -> RouterStatistics:
        counts = self._counts
        return RouterStatistics(
            deployment=self._config.deployment, num_replicas=len(self._members),
            queued=self._queued, in_flight=self._cache.in_flight_total,
            assigned_total=counts.assigned, rejected_total=counts.rejected,
            probe_failures_total=counts.probe_failures, tickets_total=counts.tickets,
            backoff_streak=self._backoff_streak, last_retry_after_s=self._retry.last_s,
            unreachable_replicas=self._cache.unreachable_count(),
            in_flight_by_replica=self._cache.in_flight_by_replica(),
            cold_held_total=counts.held, cold_hinted_total=counts.hinted)

    # ---- admission and waiting -------------------------------------------------------
    async def _wait_slot(self, model_id: str = "",
                         affinity: Affinity | None = None) -> ReplicaInfo:
        replica = await self._wait_any_slot(model_id, affinity)
        if affinity is not None and affinity.blocks:  # its blocks are that replica's now
            self._members.index.insert(replica.replica_id, affinity.blocks)
        return replica

    async def _wait_any_slot(self, model_id: str, affinity: Affinity | None) -> ReplicaInfo:
        if self._closed is not None:
            raise RouterClosedError(self._config.deployment, self._closed)
        self._retry.arrivals.record_assignment(self._clock.monotonic())
        if self._queued == 0:  # FIFO: nobody overtakes a waiter
            replica = self._try_affinity(affinity) or self._try_place(
                hint=None, among=self._members.holders.get(model_id))
            if replica is not None:
                return replica
        limit = self._config.max_queued_requests
        if 0 <= limit <= self._queued:
            raise self._reject()
        if self.waits_cold:
            replica = await self._wait_cold()
        else:
            replica = await self._enqueue(front=False)
        while not self._cache.accepts_requests(replica.replica_id):
            # It began stopping (or died) between the handoff and our wake-up: keep our
            # place at the head and give the reserved slot back.
            waiter = self._enqueue(front=True)
            self._release(replica.replica_id)
            replica = await waiter
        return replica

    async def _wait_cold(self) -> ReplicaInfo:
        """Scale from zero: wait in the queue for the first replica up to ``cold_hold_s``,
        or, when the shard's measured start says it will take longer, be told at once
        when to come back (503 + Retry-After); a hold that runs out is told the same.
        Never an error without a time to retry."""
        config, start = self._config, self._clock.monotonic()
        eta = self._retry.cold_eta_s(start)
        if eta is not None and eta > config.cold_hold_s:
            self._counts.hinted += 1
            raise self._retry.reject_cold(config, eta, 0.0, self._queued, start)
        self._counts.held += 1
        try:
            return await asyncio.wait_for(self._enqueue(front=False), config.cold_hold_s)
        except asyncio.TimeoutError:
            now = self._clock.monotonic()
            self._counts.hinted += 1
            raise self._retry.reject_cold(config, self._retry.cold_eta_s(now), now - start,
                                          self._queued, now) from None

    def _enqueue(self, front: bool) -> asyncio.Future[ReplicaInfo]:
        """Queue a waiter; returns an awaitable that yields a reserved replica."""
        waiter: asyncio.Future[ReplicaInfo] = asyncio.get_running_loop().create_future()
        if front:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        self._queued += 1
        self._schedule_backoff()
        return self._wait_handoff(waiter)

    async def _wait_handoff(self, waiter: asyncio.Future[ReplicaInfo]) -> ReplicaInfo:
        try:
            return await waiter
        except asyncio.CancelledError:  # the caller gave up (client gone, timeout)
            if waiter.cancelled():
                self._queued -= 1  # still queued; _dispatch skips the cancelled future
            elif waiter.exception() is None:
                self._release(waiter.result().replica_id)  # handed a slot it won't use
            raise

    def _reject(self) -> BackpressureError:
        """O(1): counters and the pure Retry-After policy; no RPC, no lock."""
        config = self._config
        self._counts.rejected += 1
        return self._retry.reject(config, self._queued,
                                  self._cache.occupancy(config.max_ongoing_requests),
                                  self._backoff_streak, self._rng, self._clock.monotonic())

    # ---- placement ---------------------------------------------------------------------
    def _try_place(self, hint: str | None, among: list[str] | None = None) -> ReplicaInfo | None:
        """Choose by the policy's load rule (power of two choices, by queue length or with
        KV-cache use; or round robin) and reserve the slot, or None if none has room.
        Refreshes, in the background, the cache of every replica it looked at. ``among``
        (the holders of a multiplexed model) is tried first, then every replica."""
        if self._config.policy.name == "round_robin":
            return self._next_in_turn()
        if among:
            placed = self._place_in(among, None)
            if placed is not None:
                return placed
        return self._place_in(self._cache.member_ids(), hint)

    def _try_affinity(self, affinity: Affinity | None) -> ReplicaInfo | None:
        """The replica an affinity places on (``affinity_choice``), its slot reserved; None
        without an affinity or when none qualifies (then by load)."""
        if affinity is None or not len(self._members):
            return None
        if is_cold(self._members, affinity):
            replica_id = home_or(self._members, affinity.start,
                                 self._pick(self._cache.member_ids(), None),
                                 self._looked_at(self._policy_load_of()))
        else:
            replica_id = affine_replica(
                self._members, affinity, self._looked_at(self._load_of),
                self._cache.member_load_total(), self._config.policy.balance_factor,
                AFFINITY_FLOOR)
        return None if replica_id is None else self._reserve(replica_id, self._clock.monotonic())

    def _next_in_turn(self) -> ReplicaInfo | None:
        replica_id = next_in_turn(self._members, self._cache.member_ids(),
                                  self._looked_at(self._load_of))
        return None if replica_id is None else self._reserve(replica_id, self._clock.monotonic())

    def _looked_at(self, load_of: Callable[[str], Any]) -> Callable[[str], Any]:
        """``load_of``, refreshing (in the background) the cache of every replica a decision
        looks at, as for p2c's candidates: a replica a ring walk passed over as past the
        bound too, not only the replica chosen (its load, compared against next time,
        stayed as old as its last choice)."""
        now = self._clock.monotonic()

        def look(replica_id: str) -> Any:
            if self._cache.needs_probe(replica_id, now):
                self._start_probe(replica_id)
            return load_of(replica_id)
        return look

    def _place_in(self, replica_ids: Any, hint: str | None) -> ReplicaInfo | None:
        replica_id = self._pick(replica_ids, hint)
        return None if replica_id is None else self._reserve(replica_id, self._clock.monotonic())

    def _pick(self, replica_ids: Any, hint: str | None) -> str | None:
        """Power of two choices on the policy's load; refreshes the candidates' cache (the
        replicas it looked at: its pairs up to the first with room)."""
        return choose_replica(replica_ids, self._looked_at(self._policy_load_of()), self._rng,
                              hint=hint, max_pairs=self._settings.max_pairs).replica_id

    def _policy_load_of(self) -> Callable[[str], Any]:
        return self._kv_load_of if self._config.policy.uses_kv else self._load_of

    def _reserve(self, replica_id: str, now: float) -> ReplicaInfo:
        self._cache.reserve(replica_id)
        self._counts.assigned += 1
        self._retry.drain.record_assignment(now)
        return self._members.by_id[replica_id]

    def _load_of(self, replica_id: str) -> int | None:
        return self._cache.load_if_placeable(replica_id, self._config.max_ongoing_requests)

    def _kv_load_of(self, replica_id: str) -> float | None:
        """kv_load's score (``policies.kv_score``); None as ``_load_of``."""
        load = self._load_of(replica_id)
        if load is None:
            return None
        return kv_score(load, self._cache.kv_of(replica_id), self._config.max_ongoing_requests)

    def _release(self, replica_id: str) -> None:
        self._cache.release(replica_id)
        self._dispatch(hint=replica_id)

    def _live_head(self) -> asyncio.Future[ReplicaInfo] | None:
        """The first waiter not cancelled (dropping cancelled ones), or None."""
        while self._waiters and self._closed is None:
            if not self._waiters[0].done():
                return self._waiters[0]
            self._waiters.popleft()
        return None

    def _hand_to_head(self, replica: ReplicaInfo) -> None:
        self._waiters.popleft().set_result(replica)
        self._queued -= 1
        self._backoff_streak = 0

    def _dispatch(self, hint: str | None = None) -> None:
        """Hand slots to waiters, head first, while placement finds room. Called on every
        event that can free room: a completion (with its replica as hint), a probe answer,
        a push, the backoff timer."""
        while self._live_head() is not None:
            replica = self._try_place(hint)
            if replica is None:
                return
            self._hand_to_head(replica)
            hint = None
        self._cancel_backoff()

    # ---- backoff: slots freed by other routers, and fairness between routers -----------
    def _schedule_backoff(self) -> None:
        if self._backoff is not None or self._closed is not None:
            return
        s = self._settings
        # the exponent capped: a queue that waits minutes (a cold start) must not overflow
        delay = min(s.backoff_initial_s * 2 ** min(self._backoff_streak, 30), s.backoff_max_s)
        self._backoff = asyncio.get_running_loop().call_later(delay, self._on_backoff)

    def _cancel_backoff(self) -> None:
        if self._backoff is not None:
            self._backoff.cancel()
            self._backoff = None

    def _on_backoff(self) -> None:
        self._backoff = None
        if not self._queued:
            return
        self._backoff_streak += 1
        # Only a replica some other router may hold can hide a free slot from us; where
        # every slot is ours, our own completion will announce it, so no probe is sent.
        for replica_id in sample_candidates(self._cache.member_ids(), None, self._rng, 1):
            if self._cache.may_be_held_by_others(replica_id):
                self._start_probe(replica_id)
        self._dispatch()
        if self._backoff_streak >= self._settings.ticket_after_backoffs:
            self._take_ticket()
        if self._queued:
            self._schedule_backoff()

    def _take_ticket(self) -> None:
        """Starvation guard: queue the head request at a full replica where we hold no slot.

        A router hands each freed slot straight to its own next request, so under
        contention the router holding a replica's slots would keep them forever and
        another router (another proxy's clients) would see only rejections. After
        ``ticket_after_backoffs`` fruitless backoffs a starved router sends its head
        request anyway, to a replica where it holds nothing: the replica's semaphore is
        FIFO across callers, so that request gets the next slot there. At most one such
        request per router per replica waits at a replica, and none when one router
        holds all the load (the single-router case never queues at a replica).
        """
        if self._live_head() is None:
            return
        now = self._clock.monotonic()
        ids = self._cache.member_ids()
        for replica_id in sample_candidates(ids, None, self._rng, self._settings.max_pairs):
            if self._cache.accepts_requests(replica_id) and not self._cache.in_flight(replica_id):
                self._counts.tickets += 1
                self._hand_to_head(self._reserve(replica_id, now))
                return

    # ---- probes ------------------------------------------------------------------------
    def _start_probe(self, replica_id: str) -> None:
        self._cache.probe_started(replica_id)
        task = asyncio.get_running_loop().create_task(self._probe(self._members.by_id[replica_id]))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, replica: ReplicaInfo) -> None:
        deadline_s = self._settings.probe_deadline_s
        replica_id = replica.replica_id
        try:  # the transport should honour the deadline; wait_for makes sure
            answer = await asyncio.wait_for(
                self._transport.probe_queue_len(replica, deadline_s), deadline_s)
        except Exception as e:  # outermost frame of an owned task: count, log, carry on
            self._counts.probe_failures += 1
            logger.debug("queue-length probe of %s failed: %r", replica_id, e)
            self._cache.probe_failed(replica_id, self._clock.monotonic(),
                                     unreachable=isinstance(e, ReplicaUnavailableError))
        else:
            queue_len, kv = answer if isinstance(answer, tuple) else (answer, None)
            self._cache.probe_answered(replica_id, int(queue_len), self._clock.monotonic(), kv)
        self._dispatch(hint=replica_id)  # the head looks first where the news is
