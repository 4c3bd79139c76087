"""Router under replica-set changes and failures: stopping replicas get no new
requests, a replica that dies mid-request fails its request fast and is not retried,
closing fails waiters. FakeTransport in virtual time (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.errors import BackpressureError, ReplicaUnavailableError, RouterClosedError
from controlplane.wire import ReplicaInfo, RoutingUpdate
from tests.unit.router_fakes import DEP, Harness, Sent, replica, settle


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- replica set changes and failures ----------------------------------------------------------


def test_stopping_replica_gets_no_new_requests(h: Harness) -> None:
    router = h.make(replicas=2, max_ongoing=1)

    async def main() -> None:
        h.start("a"), h.start("b")
        await settle()
        on_r1 = h.transport.on("r1")[0]
        h.start("c")
        await settle()
        router.update_replicas([replica(0)])  # r1 is stopping
        h.transport.finish(on_r1)  # its request ends normally; its slot is not reused
        await settle()
        assert h.transport.sent[-1].request != "c"
        h.transport.finish(h.transport.on("r0")[0])
        await settle()
        assert h.transport.where("c") == "r0"
        assert router.statistics().in_flight_by_replica == {"r0": 1}

    h.run(main)


def test_waiter_handed_a_replica_that_stops_before_it_wakes_goes_elsewhere(h: Harness) -> None:
    router = h.make(replicas=2, max_ongoing=1)

    async def main() -> None:
        h.start("a"), h.start("b")
        await settle()
        h.start("c")
        await settle()
        first = h.transport.where("a")
        other = "r1" if first == "r0" else "r0"
        h.transport.finish("a")  # "c" is handed `first` ...
        await asyncio.sleep(0)
        router.update_replicas([replica(int(other[1]))])  # ... which stops before "c" sends
        await settle()
        assert h.transport.sent[-1].request == "b"
        h.transport.finish("b")
        await settle()
        assert h.transport.where("c") == other

    h.run(main)


def test_replica_death_mid_request_fails_fast_and_is_not_retried(h: Harness) -> None:
    router = h.make(replicas=2, max_ongoing=1)

    async def main() -> None:
        task = h.start("a")
        await settle()
        dead = h.transport.where("a")
        alive = "r1" if dead == "r0" else "r0"
        h.transport.probe_outcome[dead] = ReplicaUnavailableError(dead, "actor died")
        h.transport.fail("a", ReplicaUnavailableError(dead, "ActorDiedError: the actor died"))
        await settle()
        assert task.done() and h.clock.monotonic() == 1000.0
        error = task.exception()
        assert isinstance(error, ReplicaUnavailableError) and error.status_code == 502
        assert dead in str(error) and DEP in str(error) and "not retried" in str(error)
        assert len(h.transport.sent) == 1
        h.start("b"), h.start("c")  # both wait for `alive`, none goes to `dead`
        await settle()
        assert [s.replica_id for s in h.transport.sent[1:]] == [alive]
        assert router.statistics().unreachable_replicas == 1

    h.run(main)


def test_an_unreachable_replica_returns_after_a_probe_answers(h: Harness) -> None:
    router = h.make(replicas=2, max_ongoing=1)

    async def main() -> None:
        task = h.start("a")
        await settle()
        blip = h.transport.where("a")
        h.transport.fail("a", ReplicaUnavailableError(blip, "ActorUnavailableError"))
        await settle()  # the immediate re-probe answers: it was a blip
        assert isinstance(task.exception(), ReplicaUnavailableError)
        assert h.transport.probed[-1] == blip and h.clock.monotonic() == 1000.0
        assert router.statistics().unreachable_replicas == 0
        h.start("b"), h.start("c")
        await settle()
        assert sorted(s.replica_id for s in h.transport.sent[1:]) == ["r0", "r1"]

    h.run(main)


def test_user_errors_pass_through_and_free_the_slot(h: Harness) -> None:
    router = h.make()

    async def main() -> None:
        task = h.start("a")
        await settle()
        h.transport.fail("a", ValueError("user bug"))
        await settle()
        assert isinstance(task.exception(), ValueError)
        stats = router.statistics()
        assert (stats.in_flight, stats.unreachable_replicas) == (0, 0)

    h.run(main)


def test_close_fails_waiters_and_new_requests(h: Harness) -> None:
    router = h.make()

    async def main() -> None:
        h.start("a")
        waiter = h.start("b")
        await settle()
        router.apply_routing_update(None)  # the deployment was deleted
        await settle()
        assert isinstance(waiter.exception(), RouterClosedError)
        with pytest.raises(RouterClosedError, match="deleted"):
            await router.assign("c")
        h.transport.finish("a")  # requests already running finish normally
        await settle()
        assert router.statistics().in_flight == 0

    h.run(main)


def test_apply_routing_update_takes_the_shard_update(h: Harness) -> None:
    router = h.make(replicas=0)
    update = RoutingUpdate(replicas=(ReplicaInfo("r7", "x", "n"),), max_ongoing_requests=1,
                           max_queued_requests=0, status_code=429, retry_after_s=4,
                           retry_after_policy="static")

    async def main() -> None:
        router.apply_routing_update(update)
        h.start("a")
        await settle()
        assert h.transport.where("a") == "r7"
        with pytest.raises(BackpressureError) as caught:
            await router.assign("b")
        assert (caught.value.status_code, caught.value.retry_after_s) == (429, 4)

    h.run(main)


def test_waiters_with_no_replicas_are_served_when_replicas_arrive(h: Harness) -> None:
    router = h.make(replicas=0)

    async def main() -> None:
        h.start("a")
        await asyncio.sleep(1.0)  # scale from zero: the backoff timer idles, nothing fails
        assert h.transport.sent == []
        router.update_replicas([replica(0)])
        await settle()
        assert h.transport.sent == [Sent("r0", "a", 1001.0)]

    h.run(main)
