"""Which ``user_config`` a deployment's replicas run, and what a failed rollout leaves.

A ``user_config`` change rolls out like a new version: a few replicas at a time
(``reconcile.plan`` paces reconfigures by the rolling surge), each applying it in place
with ``reconfigure()``. Until it is proven, the config the replicas ran before stays the
fallback. The first replica whose ``reconfigure()`` raises fails the rollout: its
traceback becomes the deployment's DEPLOY_FAILED message, no other replica is asked, and
every replica (the failed one first) is told the fallback config again, so the old
config keeps serving on every replica. New replicas start with ``serving`` too.

A deploy with another config, or new code, retries: the failure is cleared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

Config = tuple[Any, str]  # (user_config, its version)


@dataclass(frozen=True)
class ConfigRollout:
    target: Config  # the spec's
    fallback: Config | None = None  # what the replicas ran before ``target``
    failed: str = ""  # why the rollout of ``target`` failed; "" while it has not

    @property
    def serving(self) -> Config:
        """The config replicas are brought to and started with."""
        return self.fallback if self.failed and self.fallback is not None else self.target

    def retarget(self, target: Config, code_changed: bool) -> ConfigRollout:
        if target[1] != self.target[1]:
            return ConfigRollout(target, fallback=self.serving)
        if code_changed and self.failed:  # new code may fix what failed: try again
            return replace(self, failed="")
        return self

    def with_failure(self, version: str, message: str) -> tuple[ConfigRollout, bool]:
        """A replica's ``reconfigure()`` to ``version`` raised. Returns the new value and
        whether the replica can go back to the fallback config (False: the config that
        failed is the fallback itself, or there is none; the replica must be replaced)."""
        if (version == self.target[1] and self.fallback is not None
                and self.fallback[1] != version):
            return replace(self, failed=self.failed or message), True
        return self, False

    def with_adopted(self, config: Config) -> ConfigRollout:
        """A re-adopted replica runs ``config``: if it is not the target, a rollout was cut
        short by the shard's restart, and ``config`` is its fallback."""
        if config[1] != self.target[1] and self.fallback is None:
            return replace(self, fallback=config)
        return self
