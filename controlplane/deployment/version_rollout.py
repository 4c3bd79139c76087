"""Which code version a deployment's replicas run, and the rollback of a failed rollout.

New code rolls out replica by replica (``reconcile.plan``); until it is proven, the spec
the replicas ran before is the fallback. The rollout fails when its replicas cannot
start (the start-failure budget is spent: DEPLOY_FAILED) or when they turn unhealthy
within their proving window after starting. Then the deployment rolls back: ``serving``
is the fallback's code again, so reconcile starts old-version replicas as needed and
retires the new ones as those come up; status keeps DEPLOY_FAILED with the reason until
a deploy with other code retries. The spec's other fields (replica count, limits,
timings, ``user_config``: see ``config_rollout``) stay the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from controlplane.specs import DeploymentSpec


@dataclass(frozen=True)
class VersionRollout:
    target: DeploymentSpec
    fallback: DeploymentSpec | None = None  # what the replicas ran before ``target``
    failed: str = ""  # why the rollout of ``target`` failed; "" while it has not

    @property
    def rolled_back(self) -> bool:
        return bool(self.failed) and self.fallback is not None

    @property
    def rolling(self) -> bool:
        """A new version is on its way in and can still roll back."""
        return not self.failed and self.fallback is not None

    # Cached: read several times per replica start, and after a rollback each read would
    # build a new spec (``replace``).
    @cached_property
    def serving(self) -> DeploymentSpec:
        """The spec replicas are started with: the target's, with the fallback's code
        after a rollback."""
        if not self.rolled_back:
            return self.target
        fb = self.fallback
        return replace(self.target, serialized_def=fb.serialized_def,
                       code_version=fb.code_version, ray_actor_options=fb.ray_actor_options,
                       runtime_env=fb.runtime_env)

    def retarget(self, spec: DeploymentSpec) -> VersionRollout:
        if spec.code_version == self.target.code_version:
            return replace(self, target=spec)
        serving = self.serving
        back = {serving.code_version, self.fallback.code_version if self.fallback else None}
        if spec.code_version in back:  # back to what runs (or ran): nothing to prove
            return VersionRollout(spec)
        return VersionRollout(spec, fallback=serving)

    def settled(self) -> VersionRollout:
        """Every replica runs the target and proved itself: nothing to roll back to now."""
        return VersionRollout(self.target) if self.rolling else self

    def with_failure(self, message: str) -> VersionRollout:
        """Roll back (when there is something to roll back to)."""
        return replace(self, failed=message) if self.rolling else self
