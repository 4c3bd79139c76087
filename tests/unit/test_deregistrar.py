"""The shard's side of phase 1 (``IngressDeregistrar``): the nodes' HAProxy managers are
found off the shard's event loop, and a GCS that does not answer leaves the last ones
found to be asked, without holding the loop or the stop."""

import asyncio
import threading

from controlplane.ingress.haproxy.deregister import IngressDeregistrar
from controlplane.routing.actor_lookup import ActorLookup


class Manager:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log
        self.deregister = self  # ``handle.deregister.remote(...)``

    def remote(self, deployment: str, replica_id: str, joined: list):
        self.log.append((self.name, deployment, replica_id))
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Directory:
    """What the GCS knows: a name listing and a lookup, both blocking calls that a test
    can hold (the GCS not answering) or fail."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.log, self.lists = list(names), [], 0
        self.answering = threading.Event()
        self.answering.set()
        self.error: Exception | None = None
        self.gone: set[str] = set()  # listed, then gone before their lookup

    def list_names(self, namespace: str) -> list[str]:
        self.lists += 1
        self.answering.wait()
        if self.error is not None:
            raise self.error
        return list(self.names)

    def get_actor(self, name: str, namespace: str):
        self.answering.wait()
        if name not in self.names or name in self.gone:
            raise ValueError(f"no actor {name}")
        return Manager(name, self.log)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def deregistrar(directory: Directory, clock: Clock) -> IngressDeregistrar:
    lookup = ActorLookup("ns", directory.get_actor, cache=False, wait_s=0.2)
    return IngressDeregistrar("ns", refresh_s=5.0, monotonic=clock,
                              list_names=directory.list_names, lookup=lookup, wait_s=0.2)


def test_every_nodes_manager_is_asked_and_the_listing_is_reused_within_the_refresh():
    async def main():
        directory, clock = Directory(["ingress-a", "ingress-b"]), Clock()
        d = deregistrar(directory, clock)
        await d.deregister("app#D", "r1")
        clock.now = 4.0
        await d.deregister("app#D", "r2")
        assert sorted(directory.log) == [("ingress-a", "app#D", "r1"), ("ingress-a", "app#D", "r2"),
                                         ("ingress-b", "app#D", "r1"), ("ingress-b", "app#D", "r2")]
        assert directory.lists == 1
        directory.names.append("ingress-c")  # a node joined: seen after the refresh
        clock.now = 10.0
        await d.deregister("app#D", "r3")
        assert {n for n, _, r in directory.log if r == "r3"} == {"ingress-a", "ingress-b",
                                                                 "ingress-c"}
    asyncio.run(main())


def test_a_gcs_that_does_not_answer_holds_neither_the_loop_nor_the_stop():
    async def main():
        directory, clock = Directory(["ingress-a"]), Clock()
        d = deregistrar(directory, clock)
        await d.deregister("app#D", "r1")
        directory.answering.clear()  # the head's GCS is down
        clock.now = 10.0
        ticks = 0

        async def loop_alive():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        alive = asyncio.create_task(loop_alive())
        await d.deregister("app#D", "r2")  # asks the manager found before
        alive.cancel()
        directory.answering.set()
        assert ("ingress-a", "app#D", "r2") in directory.log
        assert ticks > 1  # the loop ran while the listing waited
    asyncio.run(main())


def test_a_listing_error_keeps_the_last_managers_and_a_manager_gone_since_is_skipped():
    async def main():
        directory, clock = Directory(["ingress-a", "ingress-b"]), Clock()
        d = deregistrar(directory, clock)
        await d.deregister("app#D", "r1")
        directory.error = RuntimeError("GCS unreachable")
        clock.now = 10.0
        await d.deregister("app#D", "r2")
        assert {n for n, _, r in directory.log if r == "r2"} == {"ingress-a", "ingress-b"}

        directory.error = None
        directory.gone.add("ingress-b")
        clock.now = 20.0
        await d.deregister("app#D", "r3")  # b listed, then gone before its lookup
        assert {n for n, _, r in directory.log if r == "r3"} == {"ingress-a"}
    asyncio.run(main())
