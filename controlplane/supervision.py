"""The controller's watch over the other control actors (shards, proxies).

Every control actor is created with ``max_restarts=-1``: Ray restarts it in place (same
actor id, same handle) when its process dies. What Ray cannot do is give the new process
its state back; that is this module's job. Each watched actor has one pending
``wait_until_stopped`` call, which Ray fails the moment the process dies (the shard's
death watch over replicas, one level up): no polling, no per-tick cost. On a failure the
watch retries ``recover`` (e.g. "here is your desired state" for a shard, "serve" for a
proxy) with a capped backoff until the restarted actor takes it, then watches again.

Invariants: at most one watch per name; a watch ends only when its actor answers
``wait_until_stopped`` (asked to stop) or ``stop_all`` cancels it (shutdown, before the
actors are killed for good); ``statistics()`` says per actor whether it is alive, how
often it was restarted and why, for ``status``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import ray
from ray.exceptions import RayActorError

from controlplane.errors import first_line
from controlplane.routing.backoff import ErrorBackoff

logger = logging.getLogger(__name__)

Recover = Callable[[], Awaitable[Any]]
_RECOVER_BACKOFF = ErrorBackoff(initial_s=0.1, max_s=2.0)


@dataclass
class ActorRecord:
    alive: bool = True
    restarts: int = 0
    last_restart_reason: str = ""

    def as_json(self) -> dict:
        return {"alive": self.alive, "restarts": self.restarts,
                "last_restart_reason": self.last_restart_reason}


class Supervisor:
    def __init__(self) -> None:
        self._watches: dict[str, asyncio.Task] = {}
        self._records: dict[str, ActorRecord] = {}

    def watch(self, name: str, handle: Any, recover: Recover) -> None:
        """Watch ``handle``; after each death, ``recover()`` until it succeeds."""
        if name in self._watches and not self._watches[name].done():
            return
        self._records.setdefault(name, ActorRecord())
        task = asyncio.get_running_loop().create_task(self._watch(name, handle, recover),
                                                      name=f"watch {name}")
        self._watches[name] = task

    def unwatch(self, name: str) -> None:
        """Stop watching ``name`` (its node left: Ray will not restart it) and forget it."""
        task = self._watches.pop(name, None)
        if task is not None:
            task.cancel()
        self._records.pop(name, None)

    def stop_all(self) -> None:
        for task in self._watches.values():
            task.cancel()
        self._watches.clear()

    def statistics(self) -> dict[str, dict]:
        return {name: record.as_json() for name, record in sorted(self._records.items())}

    async def _watch(self, name: str, handle: Any, recover: Recover) -> None:
        record = self._records[name]
        while True:
            try:
                await handle.wait_until_stopped.remote()
                return  # asked to stop: nothing to recover
            except RayActorError as e:
                reason = first_line(e)
            record.alive = False
            record.restarts += 1
            record.last_restart_reason = reason
            logger.warning("%s died (%s); waiting for Ray to restart it", name, reason)
            await self._recover(name, recover)
            record.alive = True
            logger.warning("%s restarted and recovered", name)

    async def _recover(self, name: str, recover: Recover) -> None:
        for failures in itertools.count(1):
            try:
                await recover()
                return
            except Exception as e:  # restarting still, or its recovery failed: retry
                if failures in (1, 10, 100):
                    logger.warning("%s: recovery failed %d time(s): %s: %s", name, failures,
                                   type(e).__name__, first_line(e))
                await asyncio.sleep(_RECOVER_BACKOFF.delay_s(failures))


def restarted_by_ray() -> bool:
    """Whether this actor process is a restart (Ray 2.60's property reads a deprecated
    field internally and warns on every call; the answer is what we need)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ray.get_runtime_context().was_current_actor_reconstructed
