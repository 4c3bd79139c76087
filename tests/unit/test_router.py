"""Router against a fake transport, in virtual time (no Ray).

``FakeTransport`` parks every send on a future the test resolves (``finish``/``fail``) and
answers probes with the replica's load: our pending sends on it plus ``others[replica]``
(the load other routers put there), or an outcome the test sets (an exception, or HOLD: no
answer). Each test runs on ``VirtualTimeLoop``: time moves only when every task waits on a
timer, so "no timed wait happened" is asserted as "the clock did not move".
"""

from __future__ import annotations

import asyncio
import pickle
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import pytest

from controlplane.clock import FakeClock
from controlplane.router import Router
from controlplane.router_types import (
    BackpressureError,
    ReplicaInfo,
    ReplicaUnavailableError,
    RouterClosedError,
    RoutingConfig,
)
from tests.unit.virtual_time import run_virtual

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

    async def probe_queue_len(self, replica: ReplicaInfo, deadline_s: float) -> int:
        rid = replica.replica_id
        self.probed.append(rid)
        outcome = self.probe_outcome.get(rid)
        if outcome == HOLD:
            await asyncio.sleep(3600)
        if isinstance(outcome, BaseException):
            raise outcome
        return len(self.on(rid)) + self.others.get(rid, 0)

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
             **backpressure: Any) -> Router:
        config = RoutingConfig(DEP, max_ongoing, max_queued, **backpressure)
        self.router = Router(config, self.transport, self.clock, random.Random(seed))
        self.router.update_replicas(replica(i) for i in range(replicas))
        return self.router

    def run(self, main: Callable[[], Awaitable[Any]]) -> Any:
        return run_virtual(self.clock, main)

    def start(self, request: Any) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self.router.assign(request))


def replica(i: int) -> ReplicaInfo:
    return ReplicaInfo(f"r{i}", f"fleetplane_replica::r{i}", "node-a")


async def settle(rounds: int = 6) -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


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
        for _ in range(3):  # a few loop iterations, never a timer
            await asyncio.sleep(0)
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


def test_apply_routing_update_takes_the_shard_payload(h: Harness) -> None:
    router = h.make(replicas=0)
    payload = {"replicas": [{"replica_id": "r7", "actor_name": "x", "node_id": "n"}],
               "max_ongoing_requests": 1, "max_queued_requests": 0,
               "backpressure_config": {"status_code": 429, "retry_after_s": 4,
                                       "retry_after_policy": "static"}}

    async def main() -> None:
        router.apply_routing_update(payload)
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


def test_unknown_policy_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="retry_after_policy"):
        RoutingConfig(DEP, 1, retry_after_policy="auto")
