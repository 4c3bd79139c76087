"""A deployment's safe rollout: which code and ``user_config`` its replicas run, the
proving windows of a new version's replicas, and the start backoff with its
DEPLOY_FAILED budget.

Composes three frozen values, each with its own rules and tests: ``VersionRollout``
(code, and the rollback of a failed rollout), ``ConfigRollout`` (``user_config``, and
what a failed ``reconfigure()`` leaves) and ``StartBackoff``. This owner applies what
happens to them: a retarget on each deploy, a start that succeeded or failed, a new
replica turning unhealthy while it proves itself, a reconfigure that failed.

Invariants:
- A new version's replica is proving from its start until ``rollout_proving_periods`` +
  ``unhealthy_threshold`` health periods later: failing its checks within that window
  rolls the whole rollout back (to the code that ran before), not only the replica.
- The rollout is settled (nothing left to roll back to) once every active replica runs
  the target code and the last proving window has ended.
- A deploy of new code or config starts a fresh ``StartBackoff``; so does a rollback
  (the old version may start replacements again).
"""

from __future__ import annotations

import logging

from controlplane.deployment.config_rollout import Config, ConfigRollout
from controlplane.deployment.lifecycle import TERMINAL_STATES
from controlplane.deployment.replica_set import Moved
from controlplane.deployment.start_backoff import StartBackoff, StartBackoffPolicy
from controlplane.deployment.version_rollout import VersionRollout
from controlplane.settings import ShardSettings
from controlplane.specs import DeploymentSpec

logger = logging.getLogger(__name__)


class Rollout:
    def __init__(self, spec: DeploymentSpec, settings: ShardSettings) -> None:
        # read by every start: ``serving``/``serving_config`` are kept beside the values
        # they come from (``_set_version``, ``_set_config``), not computed per read
        self._set_version(VersionRollout(spec))
        self._set_config(ConfigRollout((spec.user_config, spec.user_config_version)))
        self.backoff = StartBackoff()
        self._policy = StartBackoffPolicy(settings.start_backoff_initial_s,
                                          settings.start_backoff_max_s,
                                          settings.max_constructor_retries)
        # a new version's replica proves itself for this many health periods
        self._proving_periods = settings.rollout_proving_periods + settings.unhealthy_threshold
        self._proving: dict[str, float] = {}  # new-version replica id -> end of its proving
        self._proving_until = 0.0  # the latest of those ends

    # ---- desired state ---------------------------------------------------------------
    def retarget(self, spec: DeploymentSpec) -> None:
        """A deploy: new code or config rolls out (and retries what failed)."""
        old = self.version.target
        code_changed = spec.code_version != old.code_version
        if code_changed or spec.user_config_version != old.user_config_version:
            self.backoff = StartBackoff()
        self._set_config(self.config.retarget((spec.user_config, spec.user_config_version),
                                              code_changed))
        self._set_version(self.version.retarget(spec))
        if code_changed:  # proving windows belong to the rollout they were opened for
            self._proving.clear()

    def _set_version(self, version: VersionRollout) -> None:
        self.version = version
        # the spec replicas are started with (the fallback's code after a rollback)
        self.serving: DeploymentSpec = version.serving

    def _set_config(self, config: ConfigRollout) -> None:
        self.config = config
        self.serving_config: Config = config.serving  # the user_config replicas are given

    def adopted(self, config: Config) -> None:
        """A re-adopted replica runs ``config`` (a rollout cut short by a shard restart)."""
        self._set_config(self.config.with_adopted(config))

    # ---- what happened ---------------------------------------------------------------
    def replica_moved(self, moved: Moved) -> None:
        if moved.started:
            self.backoff = self.backoff.with_started()
            version = self.version
            if version.rolling and moved.record[2] == version.target.code_version:
                # failures that begin within the proving periods, once the threshold is met
                until = moved.now + self._proving_periods * version.target.health_check_period_s
                self._proving[moved.replica_id] = until
                self._proving_until = max(self._proving_until, until)
        elif self._proving and moved.record[1] in TERMINAL_STATES:
            self._proving.pop(moved.replica_id, None)

    def start_failed(self, message: str, now: float, target_replicas: int) -> None:
        """One failed start toward the start budget; the budget spent during a rollout
        rolls the deployment back to the code it ran before."""
        self.backoff = self.backoff.with_failure(message, now, target_replicas, self._policy)
        if self.backoff.deploy_failed and self.version.rolling:
            self.roll_back(message)
            return
        logger.error("%s (failure %d, next try in %.1fs)", self.backoff.last_error,
                     self.backoff.failures,
                     StartBackoff.delay_s(self._policy, self.backoff.failures))

    def turned_unhealthy(self, replica_id: str, message: str, now: float) -> None:
        """A replica is replaced for failing its checks: within a new version's proving
        window, the rollout rolls back."""
        if self.version.rolling and now < self._proving.get(replica_id, now):
            self.roll_back(f"replica {replica_id} of the new version turned unhealthy soon "
                           f"after starting: {message}")

    def roll_back(self, cause: str) -> None:
        """The new version failed: start the previous one again (``VersionRollout``)."""
        target = self.version.target
        self._set_version(self.version.with_failure(
            f"{cause}\nthe rollout of version {target.code_version} failed; rolled back "
            f"to version {self.version.fallback.code_version}, which keeps serving"))
        self.backoff = StartBackoff()  # the old version may start replacements again
        self._proving.clear()
        logger.error("%s: %s", target.id, self.version.failed)

    def reconfigure_failed(self, replica_id: str, version: str, message: str) -> bool:
        """A replica's ``reconfigure()`` to ``version`` raised: the config rollout stops.
        True when the replica can be told the fallback config again; False when it must
        be replaced (the config that failed is the fallback itself)."""
        error = f"reconfigure() of replica {replica_id} raised; the rollout of the new " \
                f"user_config stopped and the previous config keeps serving:\n{message}"
        config, restore = self.config.with_failure(version, error)
        self._set_config(config)
        if restore:
            logger.error("%s: %s", self.version.target.id, error)
        else:
            self.backoff = self.backoff.with_error(
                f"reconfigure of {replica_id} failed:\n{message}")
        return restore

    # ---- the tick ----------------------------------------------------------------------
    def backoff_expired(self, now: float) -> bool:
        """A start hold ended by ``now``: True once (the caller re-plans)."""
        if not self.backoff.expired(now):
            return False
        self.backoff = self.backoff.with_expired()
        return True

    def settle(self, now: float, on_target: bool) -> None:
        """Every active replica runs the target and proved itself: later failures are
        ordinary ones."""
        if self.version.rolling and on_target and now >= self._proving_until:
            self._set_version(self.version.settled())
            self._proving.clear()

    def starts_blocked(self, now: float) -> bool:
        return self.backoff.blocked(now)

    # ---- status ------------------------------------------------------------------------
    @property
    def deploy_failed(self) -> bool:
        return self.backoff.deploy_failed or bool(self.config.failed or self.version.failed)

    def message(self, status: str) -> str:
        """Why the deployment is where it is: a failed rollout, else the newest start
        error while it is updating or has failed."""
        return self.version.failed or self.config.failed or (
            self.backoff.last_error if status in ("DEPLOY_FAILED", "UPDATING") else "")

