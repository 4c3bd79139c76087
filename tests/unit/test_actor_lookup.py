"""Named-actor lookups that never stop an event loop (issue 32: the head node's GCS down).

A fake directory stands in for ``ray.get_actor``: while ``silent`` is set its lookups
block, as Ray's do while the GCS does not answer.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from controlplane.errors import ReplicaUnavailableError
from controlplane.routing.actor_lookup import ActorLookup, LookupTimeout
from controlplane.routing.transport import RayTransport
from controlplane.wire import ReplicaInfo


class Directory:
    def __init__(self) -> None:
        self.answering = threading.Event()
        self.answering.set()
        self.calls: list[str] = []
        self.actors = {"a": "handle-a", "b": "handle-b"}

    def get_actor(self, name: str, namespace: str | None = None) -> str:
        assert namespace == "ns"
        self.calls.append(name)
        self.answering.wait(30)  # the GCS silent: Ray's lookup waits
        if name not in self.actors:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return self.actors[name]


def test_a_silent_gcs_costs_a_caller_its_wait_and_the_loop_nothing():
    directory = Directory()
    lookup = ActorLookup("ns", directory.get_actor, wait_s=0.2)

    async def scenario():
        directory.answering.clear()
        ticks = 0

        async def other_work():  # what the proxy's loop also runs: other requests
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        worker = asyncio.create_task(other_work())
        callers = [asyncio.create_task(lookup.get("a")) for _ in range(50)]
        results = await asyncio.gather(*callers, return_exceptions=True)
        worker.cancel()
        assert all(isinstance(r, LookupTimeout) for r in results) and ticks > 50
        assert directory.calls == ["a"]  # fifty callers, one lookup
        directory.answering.set()  # the GCS back: the lookup in flight ends and is kept
        assert await lookup.get("a") == "handle-a"
        assert await lookup.get("a") == "handle-a" and directory.calls == ["a"]
    asyncio.run(scenario())


def test_warm_looks_up_ahead_and_forget_drops_even_a_lookup_in_flight():
    directory = Directory()
    lookup = ActorLookup("ns", directory.get_actor, wait_s=5)

    async def scenario():
        lookup.warm(["a"])
        assert await lookup.get("a") == "handle-a" and directory.calls == ["a"]
        directory.answering.clear()
        lookup.warm(["b"])
        lookup.forget("b")  # left the set while its lookup waited
        directory.answering.set()
        await asyncio.sleep(0.05)
        while lookup._pending:
            await asyncio.sleep(0.01)
        assert lookup.cached("b") is None
        lookup.forget("a")
        assert await lookup.get("a") == "handle-a" and directory.calls == ["a", "b", "a"]
    asyncio.run(scenario())


def test_a_missing_actor_raises_as_ray_does_and_is_not_kept():
    directory = Directory()
    lookup = ActorLookup("ns", directory.get_actor)

    async def scenario():
        for _ in range(2):
            with pytest.raises(ValueError, match="Failed to look up actor"):
                await lookup.get("gone")
        assert directory.calls == ["gone", "gone"]
    asyncio.run(scenario())


def test_the_transport_answers_a_silent_gcs_as_an_unreachable_replica():
    """The router then places the request elsewhere (a GET is asked of another replica)."""
    directory = Directory()
    transport = RayTransport.__new__(RayTransport)
    transport._lookup = ActorLookup("ns", directory.get_actor, wait_s=0.1)
    replica = ReplicaInfo(replica_id="app#d#0", actor_name="a", node_id="n")

    async def scenario():
        directory.answering.clear()
        with pytest.raises(ReplicaUnavailableError, match="the GCS did not answer"):
            await transport.handle(replica)
        directory.answering.set()
    asyncio.run(scenario())
