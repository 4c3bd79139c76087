"""Test doubles for the shard's seams, injected through constructors (never patched in).

``FakeReplicaClient`` has the methods of ``RayReplicaClient`` (create, initialize,
check_health, wait_until_stopped, update_health_timings, reconfigure, update_rank, stop,
kill) and no Ray. Every call is recorded in order. Each async call's outcome is chosen by
the test, per method and optionally per replica: ``OK`` (the default), an exception
instance to raise (``ReplicaDied``, ``ReplicaCallFailed``), or ``HOLD``, which parks the
call on a future until the test calls ``release``/``fail``. Like the real client, ``stop`` never raises and always
ends killed. ``wait_until_stopped`` (the shard's death watch) stays pending until the
replica is stopped or killed, or until the test calls ``crash``, which fails it with
``ReplicaDied`` as Ray does when an actor dies.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from controlplane.replica_client import CallTimedOut, ReplicaDied
from controlplane.specs import DeploymentSpec
from controlplane.wire import ReplicaDescription, ReplicaInit

OK = "ok"
HOLD = "hold"
ASYNC_METHODS = ("initialize", "check_health", "reconfigure", "update_rank", "stop",
                 "update_health_timings", "describe")


@dataclass
class FakeHandle:
    """Stands in for a Ray actor handle; tracks what the replica would have seen."""

    replica_id: str
    init: ReplicaInit
    spec: DeploymentSpec
    node_id: str
    rank: int  # the rank the replica knows: from init, then from update_rank
    user_config: Any
    killed: bool = False
    initialized: bool = False
    fresh_check_error: str = ""  # what a fresh self-check of this replica fails with


@dataclass(frozen=True)
class Call:
    method: str
    replica_id: str
    args: tuple = ()


class FakeReplicaClient:
    def __init__(self, node_id: str = "node-a") -> None:
        self.node_id = node_id  # where every replica "runs"
        self.handles: dict[str, FakeHandle] = {}
        self.calls: list[Call] = []
        self._outcomes: dict[tuple[str, str | None], Any] = {}
        self._held: dict[tuple[str, str], asyncio.Future] = {}
        self._watches: dict[str, asyncio.Future] = {}  # replica id -> pending death watch
        self.phases: dict[str, str] = {}  # replica id -> what start_phase says
        # virtual seconds each start takes, against the deadline the shard passes (as the
        # Ray client's wait_for does); None: at once
        self.start_s: float | None = None

    # ---- test controls --------------------------------------------------------------
    @property
    def create_errors(self) -> dict[str, Exception]:
        """Replica id -> the error ``create`` raises once for it."""
        if not hasattr(self, "_create_errors"):
            self._create_errors: dict[str, Exception] = {}
        return self._create_errors

    def set_outcome(self, method: str, outcome: Any, replica_id: str | None = None) -> None:
        """OK, HOLD or an exception for ``method``; for one replica, or the default."""
        assert method in ASYNC_METHODS, method
        self._outcomes[(method, replica_id)] = outcome

    def hold(self, method: str, replica_id: str | None = None) -> None:
        self.set_outcome(method, HOLD, replica_id)

    def held(self, method: str) -> list[str]:
        """Replica ids whose ``method`` call is parked, in call order."""
        return [rid for (m, rid), fut in self._held.items() if m == method and not fut.done()]

    def release(self, method: str, replica_id: str) -> None:
        self._held.pop((method, replica_id)).set_result(None)

    def fail(self, method: str, replica_id: str, error: BaseException) -> None:
        self._held.pop((method, replica_id)).set_exception(error)

    def release_all(self, method: str) -> None:
        for replica_id in self.held(method):
            self.release(method, replica_id)

    def crash(self, replica_id: str, message: str = "actor died") -> None:
        """The replica's process dies: its pending death watch fails with ReplicaDied."""
        self.handles[replica_id].killed = True
        watch = self._watches.pop(replica_id, None)
        if watch is not None and not watch.done():
            watch.set_exception(ReplicaDied(message))

    # ---- reads for assertions ---------------------------------------------------------
    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def ids(self, method: str) -> list[str]:
        return [c.replica_id for c in self.calls_to(method)]

    @property
    def created(self) -> list[str]:
        return self.ids("create")

    # ---- the RayReplicaClient interface -------------------------------------------------
    def create(self, init: ReplicaInit, spec: DeploymentSpec) -> FakeHandle:
        rid = init.replica_id
        refusal = self.create_errors.pop(rid, None)
        if refusal is not None:  # as Ray refuses a taken name or unschedulable options
            self.calls.append(Call("create_refused", rid, (init.rank,)))
            raise refusal
        assert rid not in self.handles, f"replica id {rid!r} created twice"
        self.calls.append(Call("create", rid, (init.rank, spec.code_version)))
        handle = FakeHandle(rid, init, spec, self.node_id, init.rank, init.user_config)
        self.handles[rid] = handle
        return handle

    def start_phase(self, handle: FakeHandle) -> str:
        return self.phases.get(handle.replica_id, "")

    def find(self, app: str, deployment: str) -> dict[str, FakeHandle]:
        prefix = f"{app}#{deployment}#"
        return {rid: h for rid, h in self.handles.items()
                if rid.startswith(prefix) and not h.killed}

    async def describe(self, handle: FakeHandle, timeout_s: float) -> ReplicaDescription:
        await self._outcome("describe", handle, (timeout_s,))
        return ReplicaDescription(
            replica_id=handle.replica_id, rank=handle.rank,
            code_version=handle.init.code_version, user_config=handle.user_config,
            actor_id=f"actor-{handle.replica_id}", node_id=handle.node_id,
            initialized=handle.initialized, stopping=False,
            healthy=not handle.fresh_check_error, message=handle.fresh_check_error)

    async def initialize(self, handle: FakeHandle, timeout_s: float) -> dict:
        await self._outcome("initialize", handle, (timeout_s,))
        if self.start_s is not None:
            try:
                await asyncio.wait_for(asyncio.sleep(self.start_s), timeout_s)
            except asyncio.TimeoutError:
                raise CallTimedOut(f"timed out after {timeout_s}s") from None
        handle.initialized = True
        return {"actor_id": f"actor-{handle.replica_id}", "node_id": handle.node_id}

    async def check_health(self, handle: FakeHandle, timeout_s: float) -> None:
        await self._outcome("check_health", handle, (timeout_s,))

    async def wait_until_stopped(self, handle: FakeHandle) -> None:
        rid = handle.replica_id
        self.calls.append(Call("wait_until_stopped", rid))
        if handle.killed:
            raise ReplicaDied("actor died")
        watch = asyncio.get_running_loop().create_future()
        self._watches[rid] = watch
        await watch

    async def reconfigure(self, handle: FakeHandle, user_config: Any, timeout_s: float) -> None:
        await self._outcome("reconfigure", handle, (user_config, timeout_s))
        handle.user_config = user_config

    async def update_health_timings(self, handle: FakeHandle, period_s: float,
                                    timeout_s: float) -> None:
        await self._outcome("update_health_timings", handle, (period_s, timeout_s))

    async def update_rank(self, handle: FakeHandle, rank: int) -> None:
        await self._outcome("update_rank", handle, (rank,))
        handle.rank = rank

    async def stop(self, handle: FakeHandle, grace_s: float, extra_s: float) -> None:
        try:
            await self._outcome("stop", handle, (grace_s, extra_s))
        except Exception:
            pass  # the real client kills the actor anyway
        self._end_watch(handle)

    def kill(self, handle: FakeHandle) -> None:
        self.calls.append(Call("kill", handle.replica_id))
        self._end_watch(handle)

    def _end_watch(self, handle: FakeHandle) -> None:
        """Stopped or killed by the shard: the death watch returns (asked to stop)."""
        handle.killed = True
        watch = self._watches.pop(handle.replica_id, None)
        if watch is not None and not watch.done():
            watch.set_result(None)

    async def _outcome(self, method: str, handle: FakeHandle, args: tuple) -> None:
        rid = handle.replica_id
        self.calls.append(Call(method, rid, args))
        outcome = self._outcomes.get((method, rid), self._outcomes.get((method, None), OK))
        if outcome == HOLD:
            assert (method, rid) not in self._held, f"{method} of {rid} already held"
            future = asyncio.get_running_loop().create_future()
            self._held[(method, rid)] = future
            await future
        elif isinstance(outcome, BaseException):
            raise outcome
