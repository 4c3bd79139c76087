"""The acting half of a deployment's reconcile: start, stop, reconfigure, probe replicas.

Each operation moves the replica record through the transition table right away
(STARTING, STOPPING, UPDATING), then runs its remote call as an owned task; the task
reports its outcome to the ``DeploymentState`` (``replica_started``, ``start_failed``,
``reconfigured``...), which hands it to the owners concerned: this module writes no state
of theirs. Every outcome marks the deployment for a new plan, so the next tick re-plans
from the new state. Start failures back off (``StartBackoff``): never a hot loop.

Health: a replica that starts serving is watched by the deployment's push health and gets
a death watch: one pending ``wait_until_stopped`` call, which Ray fails the moment the
actor dies. Death is therefore seen without any periodic call, at no per-tick cost, and
independently of pushes, probes and the stall guard. A probe this module starts is
answered to ``DeploymentState.probe_resolved`` exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Coroutine

from controlplane.clock import Clock
from controlplane.deployment.lifecycle import ReplicaEvent, ReplicaState
from controlplane.deployment.work import WorkTotals
from controlplane.health.gate import ProbeOutcome, ProbeResult
from controlplane.replica_client import (CallTimedOut, ReplicaCallFailed, ReplicaClient,
                                         ReplicaDied, replica_actor_name)
from controlplane.settings import Settings
from controlplane.specs import DeploymentSpec
from controlplane.wire import DirectIngressInit, ReplicaInit

logger = logging.getLogger(__name__)

_NAME_TRIES = 100  # names skipped when detached actors of an earlier shard still hold them

Spawn = Callable[[Coroutine], Any]
_PROGRESS_CHARS = 200  # a replica's word on its start, as status shows it


@dataclass(frozen=True)
class OpsContext:
    """What a deployment's replica operations take from their shard."""

    client: ReplicaClient
    clock: Clock
    spawn: Spawn  # runs a coroutine as a task the shard owns
    shard_name: str
    settings: Settings
    ingress: Any = None  # haproxy mode: IngressDeregistrar (phase 1 of a stop)
    work: WorkTotals = dataclasses.field(default_factory=WorkTotals)


class ReplicaOps:
    def __init__(self, state: Any, context: OpsContext) -> None:
        self._d = state  # the DeploymentState these operations report to
        self._ctx = context
        self._client, self._clock, self.spawn = context.client, context.clock, context.spawn
        self._phase1 = context.settings.replica.deregister_before_stop
        # (spec, user_config, world size, unhealthy threshold) and the ReplicaInit they
        # make, less the replica's id and rank: one per spec version and target, not one
        # per start
        self._template: tuple | None = None
        # what starting replicas said they are doing: replica id -> (text, since); an
        # entry lives from the replica's first word until its start ends
        self._progress: dict[str, tuple[str, float]] = {}

    @property
    def start_timeout_s(self) -> float:
        """The deployment's start deadline (``replica_start_timeout_s`` of its config), or
        the shard's default; getattr: a spec checkpointed before the field has none."""
        own = getattr(self._d.spec, "replica_start_timeout_s", None)
        return own if own is not None else self._ctx.settings.shard.replica_start_timeout_s

    # ---- start ------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        d, book = self._d, self._d.book
        for _ in range(_NAME_TRIES):
            replica_id = book.next_id()
            try:
                handle = self._client.create(self._init_for(replica_id), d.rollout.serving)
                break
            except ValueError as e:  # the name is held by an actor from an earlier shard
                book.ranks.release(replica_id)
                logger.warning("replica name %s is taken (%s); using the next", replica_id, e)
            except Exception as e:  # scheduling refused (bad resources...): back off
                book.ranks.release(replica_id)
                d.start_failed(replica_id, f"{type(e).__name__}: {e}", now, created=False)
                return
        else:
            d.start_failed(replica_id, f"{_NAME_TRIES} replica names were taken", now,
                           created=False)
            return
        d.replica_created(replica_id, handle, replica_actor_name(replica_id), now)
        self.spawn(self._wait_started(replica_id, handle))

    def _init_for(self, replica_id: str) -> ReplicaInit:
        d, built = self._d, self._template
        spec, user_config = d.rollout.serving, d.rollout.serving_config[0]
        world_size = max(1, d.target_replicas)
        threshold = self._ctx.settings.shard.unhealthy_threshold
        # the same spec and user_config objects (immutable once made: identity is
        # equality, in O(1)) and equal numbers
        if built is None or not (built[0] is spec and built[1] is user_config
                                 and built[2] == world_size and built[3] == threshold):
            built = self._template = (spec, user_config, world_size, threshold,
                                      self._shared_init(spec, user_config, world_size, threshold))
            self._ctx.work.replica_inits_built += 1
        return built[4].for_replica(replica_id, d.book.ranks.assign(replica_id))

    def _shared_init(self, spec: DeploymentSpec, user_config: Any, world_size: int,
                     unhealthy_threshold: int) -> ReplicaInit:
        """What every replica started from ``spec`` (with this config and target) is
        told; ``for_replica`` adds its id and rank."""
        replica = self._ctx.settings.replica
        return ReplicaInit(
            replica_id="", rank=-1, app_name=spec.id.app, deployment=spec.id.name,
            serialized_def=spec.serialized_def, user_config=user_config,
            max_ongoing_requests=spec.max_ongoing_requests,
            shard_name=self._ctx.shard_name, namespace=self._ctx.settings.namespace,
            metrics_report_interval_s=replica.metrics_report_interval_s,
            code_version=spec.code_version, drain_min_s=replica.drain_min_s,
            health_check_period_s=spec.health_check_period_s,
            health_check_timeout_s=spec.health_check_timeout_s,
            unhealthy_threshold=unhealthy_threshold,
            direct_ingress=self._direct_ingress(spec.direct_ingress),
            world_size=world_size, report_batch_interval_s=replica.report_batch_interval_s)

    def _direct_ingress(self, init: DirectIngressInit | None) -> DirectIngressInit | None:
        if init is None or self._phase1:
            return init
        return dataclasses.replace(init, deregistration_window_s=0.0)  # phase 1 off

    async def _wait_started(self, replica_id: str, handle: Any) -> None:
        d = self._d
        timeout_s = self.start_timeout_s
        try:
            info = await self._client.initialize(handle, timeout_s)
        except Exception as e:  # any failure to start, typed or not, must end STARTING
            said = self._progress.pop(replica_id, None)
            if said is not None and isinstance(e, (asyncio.TimeoutError, CallTimedOut)):
                e = CallTimedOut(f"last said: {said[0]}")
            self._client.kill(handle)
            d.start_failed(replica_id, _start_failure(e, timeout_s, d.spec.ray_actor_options),
                           self._clock.monotonic())
            return
        self._progress.pop(replica_id, None)
        if not d.replica_started(replica_id, info, self._clock.monotonic()):
            return
        try:  # ``_watch_death``'s body, in the same coroutine: one task and frame per life
            await self._client.wait_until_stopped(handle)
        except (ReplicaDied, ReplicaCallFailed) as e:
            self._death_watch_ended(replica_id, e)

    def note_start_progress(self, replica_id: str, text: str, now: float) -> None:
        """A starting replica's own word on its start (``report_start_progress``); kept
        only while it starts, and its ``since`` only while the words stay the same."""
        record = self._d.book.get(replica_id)
        if record is None or record.state is not ReplicaState.STARTING or not text:
            return  # late: the start ended (a word in flight must not outlive it)
        said = self._progress.get(replica_id)
        if said is None or said[0] != text:
            self._progress[replica_id] = (str(text)[:_PROGRESS_CHARS], now)

    def start_progress(self, replica_id: str) -> tuple[str, float] | None:
        return self._progress.get(replica_id)

    def start_phase(self, replica_id: str) -> str:
        handle = self._d.book.handle(replica_id)
        return self._client.start_phase(handle) if handle is not None else ""

    # ---- re-adoption --------------------------------------------------------------------------
    def adopt_existing(self) -> None:
        self.spawn(self._adopt_existing())

    async def _adopt_existing(self) -> None:
        """Take over the deployment's live replicas (this shard restarted): each describes
        itself, with a fresh self-check; one that cannot is killed, and reconcile replaces
        it once adoption is done."""
        d = self._d
        found = self._client.find(d.spec.id.app, d.spec.id.name)
        timeout_s = d.spec.health_check_timeout_s + self._ctx.settings.shard.stop_grace_extra_s
        answers = await asyncio.gather(*(self._client.describe(h, timeout_s)
                                         for h in found.values()), return_exceptions=True)
        now = self._clock.monotonic()
        for (replica_id, handle), answer in zip(found.items(), answers):
            if isinstance(answer, BaseException):
                logger.warning("replica %s could not be re-adopted (%s); replacing it",
                               replica_id, answer)
                self._client.kill(handle)
            elif d.replica_adopted(answer, handle, replica_actor_name(replica_id), now):
                self.spawn(self._watch_death(replica_id, handle))
            else:
                self._client.kill(handle)
        if found:
            logger.info("%s: re-adopted %d of %d live replicas", d.spec.id,
                        len(d.book.replicas), len(found))
        d.adoption_done()

    # ---- stop --------------------------------------------------------------------------------
    def stop(self, replica_id: str, reason: str, event: ReplicaEvent = ReplicaEvent.STOP) -> None:
        d = self._d
        handle = d.book.handle(replica_id)
        if d.transition(replica_id, event, self._clock.monotonic(), message=reason) is None:
            return
        d.book.ranks.release(replica_id)
        self.spawn(self._wait_stopped(replica_id, handle))

    async def _wait_stopped(self, replica_id: str, handle: Any) -> None:
        d = self._d
        try:
            if (handle is not None and d.spec.direct_ingress is not None and self._ctx.ingress
                    and self._phase1):
                # with the replicas that just started: HAProxy must hold them before the
                # leaving one is in maint, or it might have no server for a moment (503)
                await self._ctx.ingress.deregister(
                    str(d.spec.id), replica_id, d.book.recently_started(self._clock.monotonic()))
            if handle is not None:
                await self._client.stop(handle, d.spec.graceful_shutdown_timeout_s,
                                        self._ctx.settings.shard.stop_grace_extra_s)
        finally:  # whatever happened, the record must not stay STOPPING
            d.transition(replica_id, ReplicaEvent.STOPPED, self._clock.monotonic())

    # ---- reconfigure, ranks, health ----------------------------------------------------------
    def reconfigure(self, replica_id: str) -> None:
        d = self._d
        if d.transition(replica_id, ReplicaEvent.RECONFIGURE, self._clock.monotonic()) is None:
            return
        user_config, version = d.rollout.serving_config
        self.spawn(self._wait_reconfigured(replica_id, d.book.handle(replica_id), user_config,
                                           version))

    async def _wait_reconfigured(self, replica_id: str, handle: Any, user_config: Any,
                                 version: str) -> None:
        d = self._d
        try:
            await self._client.reconfigure(handle, user_config, self.start_timeout_s)
        except ReplicaDied as e:
            d.transition(replica_id, ReplicaEvent.DIED, self._clock.monotonic(), message=str(e))
        except Exception as e:  # ReplicaCallFailed, or anything untyped
            d.reconfigure_failed(replica_id, version, str(e), self._clock.monotonic())
        else:
            d.reconfigured(replica_id, version, self._clock.monotonic())

    def update_health_timings(self, replica_id: str) -> None:
        """Tell a serving replica the spec's new health period and timeout (in place)."""
        handle, spec = self._d.book.handle(replica_id), self._d.spec
        if handle is not None:
            self.spawn(self._wait_health_timings(replica_id, handle, spec.health_check_period_s,
                                                 spec.health_check_timeout_s))

    async def _wait_health_timings(self, replica_id: str, handle: Any, period_s: float,
                                   timeout_s: float) -> None:
        try:
            await self._client.update_health_timings(handle, period_s, timeout_s)
        except (ReplicaDied, ReplicaCallFailed) as e:  # health and the death watch cover it
            logger.warning("replica %s: health timings not updated: %s", replica_id, e)

    def update_rank(self, replica_id: str, rank: int) -> None:
        handle = self._d.book.handle(replica_id)
        if handle is not None:
            self.spawn(self._client.update_rank(handle, rank))

    def probe(self, replica_id: str) -> None:
        """Start the pull probe push health asked for; its outcome goes to
        ``probe_resolved`` exactly once."""
        handle = self._d.book.handle(replica_id)
        if handle is None:  # cannot happen for a watched replica; never leave it unanswered
            logger.error("replica %s: no actor handle to probe", replica_id)
            outcome = ProbeOutcome(ProbeResult.ACTOR_CRASHED, "no actor handle")
            self._d.probe_resolved(replica_id, outcome, self._clock.monotonic())
            return
        self.spawn(self._wait_probe(replica_id, handle))

    async def _wait_probe(self, replica_id: str, handle: Any) -> None:
        d = self._d
        try:
            await self._client.check_health(handle, d.spec.health_check_timeout_s)
            outcome = ProbeOutcome(ProbeResult.HEALTHY)
        except ReplicaDied as e:  # authoritative: replace now
            outcome = ProbeOutcome(ProbeResult.ACTOR_CRASHED, str(e))
        except ReplicaCallFailed as e:
            outcome = ProbeOutcome(ProbeResult.UNHEALTHY, str(e))
        except Exception as e:  # a client bug must not leave the probe unanswered forever
            logger.exception("replica %s: probe failed unexpectedly", replica_id)
            outcome = ProbeOutcome(ProbeResult.UNHEALTHY, repr(e))
        d.probe_resolved(replica_id, outcome, self._clock.monotonic())

    async def _watch_death(self, replica_id: str, handle: Any) -> None:
        """Wait on the replica's pending ``wait_until_stopped``: it returns on a requested
        stop and raises ``ReplicaDied`` when the actor dies."""
        try:
            await self._client.wait_until_stopped(handle)
        except (ReplicaDied, ReplicaCallFailed) as e:
            self._death_watch_ended(replica_id, e)

    def _death_watch_ended(self, replica_id: str, error: Exception) -> None:
        if isinstance(error, ReplicaDied):
            self.replica_died(replica_id, str(error))
        else:  # ReplicaCallFailed: the watch itself broke; probes still cover health
            logger.warning("replica %s: death watch ended: %s", replica_id, error)

    def replica_died(self, replica_id: str, message: str) -> None:
        """The actor is gone (death watch or a crashed probe): replace it now."""
        handle = self._d.book.handle(replica_id)
        died = self._d.replica_died(replica_id, message, self._clock.monotonic())
        if died and handle is not None:
            self._client.kill(handle)  # no-op on a dead actor; a wrong verdict leaks nothing


def _start_failure(error: Exception, timeout_s: float, actor_options: Any) -> str:
    if isinstance(error, (asyncio.TimeoutError, CallTimedOut)):
        said = str(error) if str(error).startswith("last said: ") else ""
        return (f"not started within replica_start_timeout_s ({timeout_s:g}s): its "
                f"constructor or first health check was still running, or Ray found no node "
                f"with room for it (ray_actor_options {dict(actor_options)})"
                + (f"; {said}" if said else "")
                + "; raise replica_start_timeout_s in the deployment's config if it needs longer")
    if isinstance(error, (ReplicaDied, ReplicaCallFailed)):
        return str(error)
    return f"{type(error).__name__}: {error}"
