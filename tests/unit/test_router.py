"""Router placement, backpressure and waiting, against FakeTransport in virtual time
(no Ray). Replica-set changes and failures are in test_router_failures.py."""

from __future__ import annotations

import asyncio
import pickle
import random

import pytest

from controlplane.errors import BackpressureError, ReplicaUnavailableError, RouterClosedError
from controlplane.routing.routing_config import RoutingConfig
from tests.unit.router_fakes import DEP, HOLD, Harness, Sent, settle


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- placement -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_p2c_sends_to_the_less_loaded_of_two(h: Harness, seed: int) -> None:
    router = h.make(replicas=2, max_ongoing=5, seed=seed)
    h.transport.others = {"r0": 3}

    async def main() -> None:
        h.start("warm-up")
        await settle()  # the first placement probed both replicas
        assert sorted(h.transport.probed) == ["r0", "r1"]
        h.start("a"), h.start("b")
        await settle()
        assert (h.transport.where("a"), h.transport.where("b")) == ("r1", "r1")
        assert router.statistics().in_flight == 3

    h.run(main)


def test_never_sends_past_max_ongoing_counting_other_routers_load(h: Harness) -> None:
    router = h.make(replicas=3, max_ongoing=2)
    h.transport.others = {"r2": 1}  # another router holds one of r2's two slots

    async def main() -> None:
        h.start("warm-up")
        await settle()
        h.transport.finish("warm-up")
        await settle()
        tasks = [h.start(i) for i in range(20)]
        rng = random.Random(3)
        for _ in range(20):
            await settle()
            loads = {r: len(h.transport.on(r)) + h.transport.others.get(r, 0)
                     for r in ("r0", "r1", "r2")}
            assert max(loads.values()) <= 2, loads
            running = [req for r in ("r0", "r1", "r2") for req in h.transport.on(r)]
            assert len(running) == min(5, 20 - sum(t.done() for t in tasks))  # all slots used
            h.transport.finish(rng.choice(running))
        await settle()
        assert sum(t.done() for t in tasks) == 20
        assert router.statistics().queued == 0

    h.run(main)


def test_probe_that_does_not_answer_does_not_stall_placement(h: Harness) -> None:
    router = h.make(replicas=1, max_ongoing=2)
    h.transport.probe_outcome = {"r0": HOLD}

    async def main() -> None:
        h.start("a")
        await settle()
        assert h.transport.sent == [Sent("r0", "a", 1000.0)]  # sent without waiting
        await asyncio.sleep(0.1)  # the probe's deadline
        await settle()
        assert router.statistics().probe_failures_total == 1
        h.start("b")
        await settle()
        assert h.transport.where("b") == "r0"

    h.run(main)


# -- backpressure ----------------------------------------------------------------------------


def test_full_queue_rejects_with_status_and_rounded_up_retry_after(h: Harness) -> None:
    router = h.make(max_queued=2, status_code=429, retry_after_s=2.5)

    async def main() -> None:
        for request in ("a", "b", "c"):
            h.start(request)
        await settle()
        assert router.statistics().queued == 2
        with pytest.raises(BackpressureError) as caught:
            await router.assign("d")
        error = caught.value
        assert (error.status_code, error.retry_after_s) == (429, 3)
        assert error.headers() == {"Retry-After": "3"}
        assert "app/model" in str(error) and "max_queued_requests=2" in str(error)
        stats = router.statistics()
        assert (stats.rejected_total, stats.last_retry_after_s, stats.queued) == (1, 3, 2)

    h.run(main)


def test_default_rejection_is_503_without_retry_after(h: Harness) -> None:
    router = h.make(max_queued=0)

    async def main() -> None:
        h.start("a")
        await settle()
        with pytest.raises(BackpressureError) as caught:
            await router.assign("b")
        assert (caught.value.status_code, caught.value.retry_after_s) == (503, None)
        assert caught.value.headers() == {}

    h.run(main)


def test_rejection_is_synchronous_and_calls_no_transport(h: Harness) -> None:
    router = h.make(max_queued=1, retry_after_s=1)

    async def main() -> None:
        h.start("a"), h.start("b")
        await settle()
        sent, probed = list(h.transport.sent), list(h.transport.probed)
        for _ in range(100):
            assign = router.assign("shed")
            # The first step of the coroutine already raises: it never suspends, so it
            # waited on no RPC, lock or timer.
            with pytest.raises(BackpressureError):
                assign.send(None)
        assert (h.transport.sent, h.transport.probed) == (sent, probed)
        assert router.statistics().rejected_total == 100

    h.run(main)


def test_errors_pickle_with_all_fields() -> None:
    for error in (BackpressureError(429, 7, "full"), ReplicaUnavailableError("r1", "died", DEP),
                  RouterClosedError(DEP, "deleted")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and vars(copy) == vars(error)
        assert str(copy) == str(error)
    assert pickle.loads(pickle.dumps(BackpressureError(503, None, "x"))).retry_after_s is None


# -- waiting ---------------------------------------------------------------------------------


def test_queued_request_takes_a_freed_slot_with_no_timed_wait(h: Harness) -> None:
    router = h.make(max_ongoing=1)

    async def main() -> None:
        h.start("a"), h.start("b")
        await settle()
        assert [s.request for s in h.transport.sent] == ["a"]
        h.clock.advance(0.5)  # "a" ran for 0.5 s
        h.transport.finish("a")
        await settle()  # the hand-off needs no timer: the clock has not moved
        assert h.transport.sent[-1] == Sent("r0", "b", 1000.5)
        assert router.statistics().backoff_streak == 0

    h.run(main)


def test_fifo_and_no_overtaking_after_a_completion(h: Harness) -> None:
    h.make(max_ongoing=1)

    async def main() -> None:
        h.start(0)
        await settle()
        for request in range(1, 6):
            h.start(request)
            await settle()
        h.transport.finish(0)
        h.start("late")  # arrives in the same instant the slot frees: queues behind 1..5
        for request in range(1, 6):
            await settle()
            assert h.transport.sent[-1].request == request
            h.transport.finish(request)
        await settle()
        assert h.transport.sent[-1].request == "late"

    h.run(main)


def test_cancelled_waiters_do_not_leak_slots_or_places(h: Harness) -> None:
    router = h.make(max_ongoing=1, max_queued=1)

    async def main() -> None:
        h.start("a")
        queued = h.start("b")
        await settle()
        queued.cancel()
        await settle()
        assert router.statistics().queued == 0
        handed = h.start("c")  # takes the queue place "b" left
        await settle()
        h.transport.finish("a")  # "c" is handed r0's slot ...
        handed.cancel()  # ... and its caller gives up before it wakes
        await settle()
        h.start("d")
        await settle()
        assert h.transport.where("d") == "r0"
        assert [s.request for s in h.transport.sent] == ["a", "d"]
        assert router.statistics().in_flight == 1

    h.run(main)


def test_backoff_reprobe_finds_a_slot_another_router_freed(h: Harness) -> None:
    router = h.make(max_ongoing=1)
    h.transport.others = {"r0": 1}  # another router holds r0's only slot

    async def main() -> None:
        h.start("warm-up")  # placed before the first probe answered; then r0 reads full
        await settle()
        h.transport.finish("warm-up")
        h.start("x")
        await settle()
        assert router.statistics().queued == 1
        h.transport.others = {}  # the other router's request ends: we are not told
        await asyncio.sleep(0.03)
        assert h.transport.sent[-1].request == "x"
        assert h.transport.sent[-1].at == pytest.approx(1000.025)  # first backoff: 25 ms

    h.run(main)


def test_starved_router_queues_one_request_at_the_replica_after_three_backoffs(
        h: Harness) -> None:
    router = h.make(max_ongoing=1)
    h.transport.others = {"r0": 1}  # another router keeps r0 busy

    async def main() -> None:
        h.start("warm-up")
        await settle()
        h.transport.finish("warm-up")
        h.start("x"), h.start("y")
        await asyncio.sleep(1.0)
        # Backoffs at +25, +75 and +175 ms (25 doubling to the 100 ms cap); the third
        # sends the head request to wait in the replica's own FIFO queue.
        assert [s.request for s in h.transport.sent] == ["warm-up", "x"]
        assert h.transport.sent[-1].at == pytest.approx(1000.175)
        stats = router.statistics()
        assert (stats.tickets_total, stats.queued) == (1, 1)  # one ticket per replica

    h.run(main)


def test_unknown_policy_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="retry_after_policy"):
        RoutingConfig(DEP, 1, retry_after_policy="auto")
