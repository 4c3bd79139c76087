"""Test doubles for Router: a transport whose sends the test finishes, and a harness.

``FakeTransport`` parks every send on a future the test resolves (``finish``/``fail``) and
answers probes with the replica's load: our pending sends on it plus ``others[replica]``
(the load other routers put there), or an outcome the test sets (an exception, or HOLD: no
answer). ``Harness`` runs a test's ``main`` on ``VirtualTimeLoop``: time moves only when
every task waits on a timer, so "no timed wait happened" is "the clock did not move".
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from controlplane.clock import FakeClock
from controlplane.routing.router import Router
from controlplane.routing.routing_config import RoutingConfig
from controlplane.wire import ReplicaInfo
from tests.unit.virtual_time import run_virtual, wait_all_tasks_blocked

HOLD = "hold"
DEP = "app/model"


@dataclass(frozen=True)
class Sent:
    replica_id: str
    request: Any
    at: float


class FakeTransport:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[Sent] = []
        self.probed: list[str] = []
        self.others: dict[str, int] = {}
        self.kv: dict[str, float] = {}  # KV-cache use a replica reports with its queue length
        self.probe_outcome: dict[str, Any] = {}
        self._pending: dict[Any, tuple[str, asyncio.Future]] = {}

    async def send(self, replica: ReplicaInfo, request: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending[request] = (replica.replica_id, future)
        self.sent.append(Sent(replica.replica_id, request, self.clock.monotonic()))
        try:
            return await future
        finally:
            self._pending.pop(request, None)

    async def probe_queue_len(self, replica: ReplicaInfo,
                              deadline_s: float) -> int | tuple[int, float]:
        rid = replica.replica_id
        self.probed.append(rid)
        outcome = self.probe_outcome.get(rid)
        if outcome == HOLD:
            await asyncio.sleep(3600)
        if isinstance(outcome, BaseException):
            raise outcome
        queue_len = len(self.on(rid)) + self.others.get(rid, 0)
        return (queue_len, self.kv[rid]) if rid in self.kv else queue_len

    # ---- test controls ---------------------------------------------------------------
    def on(self, replica_id: str) -> list[Any]:
        return [req for req, (rid, _) in self._pending.items() if rid == replica_id]

    def where(self, request: Any) -> str:
        return next(s.replica_id for s in self.sent if s.request == request)

    def finish(self, request: Any) -> None:
        self._pending[request][1].set_result(f"done {request}")

    def fail(self, request: Any, error: BaseException) -> None:
        self._pending[request][1].set_exception(error)


class Harness:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.transport = FakeTransport(self.clock)
        self.router: Router | None = None

    def make(self, replicas: int = 1, max_ongoing: int = 1, max_queued: int = -1, seed: int = 0,
             **config_fields: Any) -> Router:
        config = RoutingConfig(DEP, max_ongoing, max_queued, **config_fields)
        self.router = Router(config, self.transport, self.clock, random.Random(seed))
        self.router.update_replicas(replica(i) for i in range(replicas))
        return self.router

    def run(self, main: Callable[[], Awaitable[Any]]) -> Any:
        return run_virtual(self.clock, main)

    def start(self, request: Any) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self.router.assign(request))


def replica(i: int) -> ReplicaInfo:
    return ReplicaInfo(f"r{i}", f"fleetplane_replica::r{i}", "node-a")


async def settle() -> None:
    """Let every ready task run until all are blocked again (no time passes)."""
    await wait_all_tasks_blocked()
