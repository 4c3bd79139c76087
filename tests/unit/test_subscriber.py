"""RoutingSubscriber against a fake actor directory, in virtual time (no Ray).

The subscriber finds the controller and the shards through the ``get_actor`` it is given;
``FakeDirectory`` stands in for Ray's named actors, and the fake actors answer long-polls
the way the real ones do (a change at once, else nothing until the poll times out).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Callable

import pytest

from controlplane.clock import FakeClock
from controlplane.routing.reachability import SubscriberStatistics
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.settings import Settings, shard_actor_name
from controlplane.wire import ROUTES_KEY, ReplicaInfo, RoutesUpdate, RoutingUpdate
from tests.unit.virtual_time import run_virtual

SETTINGS = Settings()
LOGGER = "controlplane.routing.subscriber"
POLL_TIMEOUT_S = 30.0
ROUTES = RoutesUpdate(num_shards=1, generation=1, routes={"/": "app/model"})
UPDATE = RoutingUpdate(replicas=(ReplicaInfo("r-0", "actor-r-0", "node-a"),),
                       max_ongoing_requests=5)


class TopOfRange(random.Random):
    """No jitter: each draw at the top of its range (factor 1), so waits are nominal."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Method:
    """``actor.method.remote(...)`` as Ray spells it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.remote = fn


class FakeController:
    def __init__(self, failing: bool = False) -> None:
        self.failing = failing  # the actor exists but its calls fail (restarting)
        self.listen_routes = Method(self._listen_routes)

    async def _listen_routes(self, known: dict, timeout_s: float = POLL_TIMEOUT_S) -> dict:
        if self.failing:
            raise RuntimeError("actor restarting")
        if known.get(ROUTES_KEY, 0) < 1:
            return {ROUTES_KEY: (1, ROUTES)}
        await asyncio.sleep(timeout_s)
        return {}


class FakeShard:
    def __init__(self) -> None:
        self.listen_routing = Method(self._listen_routing)

    async def _listen_routing(self, known: dict, watch_all: bool = False,
                              timeout_s: float = POLL_TIMEOUT_S) -> dict:
        if known.get("app/model", 0) < 1:
            return {"app/model": (1, UPDATE)}
        await asyncio.sleep(timeout_s)
        return {}


class FakeDirectory:
    """Named actors by name; a lookup of a missing one raises as ``ray.get_actor`` does."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.t0 = clock.monotonic()
        self.actors: dict[str, Any] = {}
        self.lookups: dict[str, list[float]] = {}

    def get_actor(self, name: str, namespace: str | None = None) -> Any:
        assert namespace == SETTINGS.namespace
        self.lookups.setdefault(name, []).append(round(self.clock.monotonic() - self.t0, 6))
        if name not in self.actors:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return self.actors[name]


class Harness:
    def __init__(self, rng: random.Random | None = None) -> None:
        self.clock = FakeClock()
        self.directory = FakeDirectory(self.clock)
        self.updates: list[tuple[str, RoutingUpdate | None, float]] = []
        self.routes: list[RoutesUpdate] = []
        self.subscriber = RoutingSubscriber(
            SETTINGS, self._on_deployment, self.routes.append,
            get_actor=self.directory.get_actor, clock=self.clock, threaded_lookups=False,
            rng=rng if rng is not None else TopOfRange())

    def _on_deployment(self, key: str, update: RoutingUpdate | None) -> None:
        self.updates.append((key, update, self.clock.monotonic() - self.directory.t0))

    def run(self, main: Callable[[], Any]) -> Any:
        async def wrapped() -> Any:
            self.subscriber.start()
            try:
                return await main()
            finally:
                self.subscriber.stop()
        return run_virtual(self.clock, wrapped)

    def lookups(self, name: str) -> list[float]:
        return self.directory.lookups.get(name, [])


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_an_absent_controller_is_retried_with_doubling_waits_up_to_ten_seconds(h, caplog):
    h.directory.actors[shard_actor_name(0)] = FakeShard()

    async def main() -> None:
        await asyncio.sleep(40.0)
        h.directory.actors[SETTINGS.controller_name] = FakeController()
        await asyncio.sleep(10.0)

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        h.run(main)
    # Waits 0.5, 1, 2, 4, 8, 10, 10, 10: the lookup at 45.5 s finds it.
    assert h.lookups(SETTINGS.controller_name)[:9] == [
        0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 25.5, 35.5, 45.5]
    assert h.routes == [ROUTES] and h.updates == [("app/model", UPDATE, 45.5)]
    assert h.subscriber.statistics() == SubscriberStatistics(failures_total=8, unreachable=())
    [warning] = messages(caplog, logging.WARNING)
    assert warning.startswith("routing: controller unreachable")
    assert messages(caplog, logging.INFO) == [
        "routing: controller reachable again after 8 failed calls"]


def test_a_shard_that_goes_missing_is_warned_once_and_welcomed_back_once(h, caplog):
    h.directory.actors[SETTINGS.controller_name] = FakeController()

    async def main() -> SubscriberStatistics:
        await asyncio.sleep(20.0)
        during = h.subscriber.statistics()
        h.directory.actors[shard_actor_name(0)] = FakeShard()
        await asyncio.sleep(10.0)
        return during

    with caplog.at_level(logging.INFO, logger=LOGGER):
        during = h.run(main)
    assert during == SubscriberStatistics(failures_total=6, unreachable=("shard 0",))
    assert h.lookups(shard_actor_name(0))[:7] == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 25.5]
    assert h.updates == [("app/model", UPDATE, 25.5)]  # the last routes were kept meanwhile
    assert h.routes == [ROUTES]
    [warning] = messages(caplog, logging.WARNING)
    assert warning.startswith("routing: shard 0 unreachable")
    assert messages(caplog, logging.INFO) == [
        "routing: shard 0 reachable again after 6 failed calls"]


def test_calls_that_keep_failing_are_counted_not_logged_each_time(h, caplog):
    h.directory.actors[SETTINGS.controller_name] = FakeController(failing=True)

    async def main() -> None:
        await asyncio.sleep(100.0)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        h.run(main)
    stats = h.subscriber.statistics()
    assert stats.unreachable == ("controller",)
    assert stats.failures_total == len(h.lookups(SETTINGS.controller_name)) == 14
    assert len(messages(caplog, logging.WARNING)) == 1
    assert messages(caplog, logging.INFO) == []


def test_jitter_spreads_the_waits_below_the_nominal_ones():
    h = Harness(rng=random.Random(3))

    async def main() -> None:
        await asyncio.sleep(60.0)

    h.run(main)
    times = h.lookups(SETTINGS.controller_name)
    gaps = [b - a for a, b in zip(times, times[1:])]
    nominal = [min(0.5 * 2 ** i, 10.0) for i in range(len(gaps))]
    assert all(0.8 * n - 1e-9 <= g <= n + 1e-9 for g, n in zip(gaps, nominal))
    assert gaps != nominal[:len(gaps)]


class HostShard:
    """A shard answering from a real ``LongPollHost``, deltas included."""

    def __init__(self) -> None:
        from controlplane.long_poll import LongPollHost
        self.host = LongPollHost()
        self.listen_routing = Method(self._listen_routing)
        self.answers: list[dict] = []

    async def _listen_routing(self, known: dict, watch_all: bool = False,
                              timeout_s: float = POLL_TIMEOUT_S) -> dict:
        answer = await self.host.listen(known, watch_all, timeout_s)
        self.answers.append(answer)
        return answer


def test_routers_rebuild_the_whole_update_from_deltas(h):
    from controlplane.wire import Deltas, RoutingDelta, apply_routing_delta

    shard = HostShard()
    h.directory.actors[SETTINGS.controller_name] = FakeController()
    h.directory.actors[shard_actor_name(0)] = shard
    new = ReplicaInfo("r-1", "actor-r-1", "node-b")

    async def main() -> None:
        shard.host.publish("app/model", UPDATE)
        await asyncio.sleep(1.0)
        shard.host.publish_delta("app/model", RoutingDelta(added=(new,)), apply_routing_delta)
        await asyncio.sleep(1.0)
        shard.host.publish_delta("app/model", RoutingDelta(removed=("r-0",)),
                                 apply_routing_delta)
        await asyncio.sleep(1.0)

    h.run(main)
    assert [u.replicas for _, u, _ in h.updates] == [
        UPDATE.replicas, (UPDATE.replicas[0], new), (new,)]
    sent = [payload for answer in shard.answers for _, payload in answer.values()]
    assert [type(p) for p in sent] == [RoutingUpdate, Deltas, Deltas]  # O(changes) sent
