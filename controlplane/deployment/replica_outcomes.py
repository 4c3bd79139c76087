"""What the replica operations report back to a deployment's state: outcomes of starts,
stops, reconfigures, adoptions and deaths, and the lifecycle transitions they make.

A part of ``DeploymentState`` (its base class), split out by concept: ``ReplicaOps``
does the I/O and calls these; they update the replica set, ranks, health watch, rollout
and backoff bookkeeping the state owns, and mark the deployment dirty for the next plan.
"""

from __future__ import annotations

import logging
from typing import Any

from controlplane.deployment.lifecycle import SERVING_STATES, TERMINAL_STATES, ReplicaEvent, ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord
from controlplane.specs import stable_hash
from controlplane.deployment.start_backoff import StartBackoff
from controlplane.wire import ReplicaDescription

logger = logging.getLogger("controlplane.deployment.state")

# Bound once: ``ReplicaState.RUNNING`` is a metaclass lookup (~0.5 us on Python 3.11),
# and a start reads several (issue 16).
STARTING, RUNNING = ReplicaState.STARTING, ReplicaState.RUNNING
STARTED = ReplicaEvent.STARTED
new_record = tuple.__new__


class ReplicaOutcomes:
    """Mixed into ``DeploymentState``; every attribute used here is one of its own."""

    def next_replica_id(self) -> str:
        seq = self._next_seq
        self._next_seq = seq + 1
        return self._id_prefix + str(seq)

    @property
    def replicas_created(self) -> int:
        return self._next_seq

    def handle(self, replica_id: str) -> Any | None:
        return self._handles.get(replica_id)

    def handles(self) -> list[Any]:
        return list(self._handles.values())

    def transition(self, replica_id: str, event: ReplicaEvent,
                   expect: ReplicaState | None = None, **changes: Any) -> ReplicaRecord | None:
        """Apply one lifecycle event; terminal states drop the replica's bookkeeping.
        With ``expect``, an outcome that arrives after the replica moved on (e.g. a start
        finishing after a scale-down began stopping it) is ignored: returns None."""
        current = self.replicas.get(replica_id)
        if current is None or (expect is not None and current.state != expect):
            return None
        record = self.replicas.apply_fields(replica_id, event, changes)
        if self._policy is not None:  # autoscaling counts serving replicas' load only
            if record.state in SERVING_STATES:
                self._metrics.include(replica_id)
            else:
                self._metrics.exclude(replica_id)
        if record.state not in SERVING_STATES:
            self.health.forget(replica_id)
            self.failing.discard(replica_id)
        if record.state in TERMINAL_STATES:
            self._forget_replica(replica_id)
        self.mark_dirty()
        return record

    def replica_created(self, replica_id: str, handle: Any, actor_name: str,
                        now: float) -> None:
        """The client accepted the actor; it is STARTING until ``replica_started``."""
        # every field by position, through ``tuple.__new__``: the NamedTuple's own
        # ``__new__`` is an interpreted call more, and keywords cost as much again (once
        # per start, issue 16)
        self.replicas.add(new_record(ReplicaRecord, (
            replica_id, STARTING, self.rollout.serving.code_version,
            self.ranks.rank_of(replica_id), actor_name, None, None, now, "", None)))
        self._config_versions[replica_id] = self.config.serving[1]
        self._handles[replica_id] = handle

    def replica_adopted(self, found: ReplicaDescription, handle: Any, actor_name: str,
                        now: float) -> bool:
        """A live replica a previous shard started: RUNNING with the rank and versions it
        reports, watched by push health. False (the caller kills it) when it had not
        finished starting or was already stopping; replaced at once when its fresh
        self-check failed."""
        self._next_seq = max(self._next_seq, _seq_of(found.replica_id) + 1)
        if not found.initialized or found.stopping or found.replica_id in self.replicas:
            return False
        self.replicas.add(ReplicaRecord(
            replica_id=found.replica_id, state=ReplicaState.RUNNING,
            version=found.code_version, rank=self.ranks.adopt(found.replica_id, found.rank),
            started_at=now, actor_name=actor_name, actor_id=found.actor_id,
            node_id=found.node_id, http_address=found.http_address))
        config = (found.user_config, stable_hash(found.user_config))
        self._config_versions[found.replica_id] = config[1]
        self.config = self.config.with_adopted(config)
        self._handles[found.replica_id] = handle
        self.health.watch(found.replica_id, now)
        if not found.healthy:
            self.ops.stop(found.replica_id, f"unhealthy when re-adopted: {found.message}",
                          event=ReplicaEvent.UNHEALTHY)
        return True

    def adopt_existing(self) -> None:
        """Before anything else, take over the live replicas of this deployment."""
        self.adopting = True
        self.spawn(self.ops.adopt_existing())

    def adoption_done(self) -> None:
        self.adopting = False
        self.mark_dirty()

    def replica_started(self, replica_id: str, info: dict, now: float) -> bool:
        """Initialized and healthy: RUNNING, watched by push health. False when the
        replica moved on meanwhile (the start is then ignored)."""
        # ``transition``'s work for this one event, inline (once per start, issue 16): a
        # STARTING record becomes RUNNING, serving, so nothing to forget or drop
        current = self.replicas.get(replica_id)
        if current is None or current.state is not STARTING:
            return False
        get = info.get
        record = self.replicas.apply_fields(replica_id, STARTED, {
            "actor_id": get("actor_id"), "node_id": get("node_id"),
            "http_address": get("http_address"), "message": ""})
        if self._policy is not None:
            self._metrics.include(replica_id)
        self._dirty = True
        self.backoff = self.backoff.with_started()
        self.demand.note_start(now - record.started_at)
        if self.rollout.rolling and record.version == self.spec.code_version:
            # failures that begin within the proving periods, once the threshold is reached
            periods = self.settings.rollout_proving_periods + self.settings.unhealthy_threshold
            self._proving[replica_id] = now + periods * self.spec.health_check_period_s
            self._proving_until = max(self._proving_until, self._proving[replica_id])
        health = self.health
        if health.unhealthy:  # else nothing to end: no count per start
            health.note_capacity(self.replicas.count(RUNNING), self.target_replicas)
        health.watch(replica_id, now)
        self._recent.append((now, replica_id))
        return True

    def recently_started(self, now: float, within_s: float = 30.0) -> list[tuple[str, str]]:
        """(replica id, HTTP address) of replicas that started serving within ``within_s``:
        those an ingress may not have heard of yet. O(recent starts), never O(replicas)."""
        while self._recent and self._recent[0][0] < now - within_s:
            self._recent.popleft()
        serving = [self.replicas.get(rid) for _, rid in self._recent]
        return [(r.replica_id, r.http_address) for r in serving
                if r is not None and r.state in SERVING_STATES and r.http_address]

    def start_failed(self, replica_id: str, message: str, now: float,
                     created: bool = True) -> None:
        """A start failed (``created=False``: the client refused the actor, so there is no
        record). Counts one failure toward backoff and the DEPLOY_FAILED budget, unless the
        replica was stopped while starting (scale-down or redeploy: not a failure)."""
        if created and self.transition(replica_id, ReplicaEvent.START_FAILED,
                                       expect=ReplicaState.STARTING) is None:
            return
        self._rollout_failure(f"replica {replica_id} failed to start:\n{message}", now)

    def _rollout_failure(self, message: str, now: float) -> None:
        """One failed start toward the start budget; the budget spent during a rollout
        rolls the deployment back to the code it ran before."""
        self.backoff = self.backoff.with_failure(message, now, self.target_replicas,
                                                 self._backoff_policy)
        self.mark_dirty()
        if self.backoff.deploy_failed and self.rollout.rolling:
            self._roll_back(message)
            return
        logger.error("%s (failure %d, next try in %.1fs)", self.backoff.last_error,
                     self.backoff.failures,
                     StartBackoff.delay_s(self._backoff_policy, self.backoff.failures))

    def _roll_back(self, cause: str) -> None:
        """The new version failed: start the previous one again (``VersionRollout``)."""
        self.rollout = self.rollout.with_failure(
            f"{cause}\nthe rollout of version {self.spec.code_version} failed; rolled back "
            f"to version {self.rollout.fallback.code_version}, which keeps serving")
        self.backoff = StartBackoff()  # the old version may start replacements again
        self._proving.clear()
        self.mark_dirty()
        logger.error("%s: %s", self.spec.id, self.rollout.failed)

    def reconfigured(self, replica_id: str, version: str) -> None:
        if self.transition(replica_id, ReplicaEvent.RECONFIGURED, expect=ReplicaState.UPDATING):
            self._config_versions[replica_id] = version

    def reconfigure_failed(self, replica_id: str, version: str, message: str) -> None:
        """The user's reconfigure to ``version`` raised (or timed out). The rollout stops
        and the replica keeps serving, told the fallback config again (``ConfigRollout``);
        only when the fallback itself failed is it replaced."""
        if self.transition(replica_id, ReplicaEvent.RECONFIGURE_FAILED,
                           expect=ReplicaState.UPDATING) is None:
            return
        error = f"reconfigure() of replica {replica_id} raised; the rollout of the new " \
                f"user_config stopped and the previous config keeps serving:\n{message}"
        self.config, restore = self.config.with_failure(version, error)
        if restore:
            logger.error("%s: %s", self.spec.id, error)
            self._config_versions[replica_id] = ""  # unknown now: plan re-sends the fallback
        else:
            logger.error("%s: replica %s could not take the serving config back; replacing "
                         "it:\n%s", self.spec.id, replica_id, message)
            self.backoff = self.backoff.with_error(f"reconfigure of {replica_id} failed:\n{message}")
            self.ops.stop(replica_id, "reconfigure failed")

    def replica_died(self, replica_id: str, message: str) -> bool:
        """A serving replica's actor is gone: replace it now. False when it was stopping
        anyway or already handled."""
        record = self.replicas.get(replica_id)
        if record is None or record.state not in SERVING_STATES:
            return False
        logger.warning("replica %s died: %s", replica_id, message)
        self.health.note_crashed()
        self.transition(replica_id, ReplicaEvent.DIED, message=message)
        return True


def _seq_of(replica_id: str) -> int:
    """The sequence number in "app#deployment#N"; -1 for a name not made here."""
    tail = replica_id.rpartition("#")[2]
    return int(tail) if tail.isdigit() else -1
