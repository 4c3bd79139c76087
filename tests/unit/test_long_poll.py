"""LongPollHost: what a listener gets, when it wakes, and restarts of the host."""

from __future__ import annotations

import asyncio

from controlplane.clock import FakeClock
from controlplane.long_poll import LongPollHost
from tests.unit.virtual_time import run_virtual, wait_all_tasks_blocked


def run(coro):
    """On the virtual-time loop: listen timeouts take no wall time."""
    return run_virtual(FakeClock(), lambda: coro)


def test_listener_gets_what_it_does_not_know_at_once():
    async def scenario():
        host = LongPollHost()
        host.publish("a", {"replicas": [1]})
        host.publish("b", {"replicas": [2]})
        everything = await host.listen({}, watch_all=True, timeout_s=0.01)
        assert {k: v[1] for k, v in everything.items()} == {"a": {"replicas": [1]},
                                                            "b": {"replicas": [2]}}
        only_a = await host.listen({"a": 0}, timeout_s=0.01)
        assert set(only_a) == {"a"}
        known = {k: v[0] for k, v in everything.items()}
        assert await host.listen(known, watch_all=True, timeout_s=0.01) == {}
    run(scenario())


def test_same_payload_wakes_nobody_and_a_change_wakes_waiters():
    async def scenario():
        host = LongPollHost()
        host.publish("a", 1)
        known = {"a": host.snapshot({}, watch_all=True)["a"][0]}
        waiter = asyncio.create_task(host.listen(known, watch_all=True, timeout_s=5))
        await wait_all_tasks_blocked()
        assert host.publish("a", 1) is False
        await wait_all_tasks_blocked()
        assert not waiter.done()
        assert host.publish("a", 2) is True
        changes = await waiter
        assert changes["a"][1] == 2 and changes["a"][0] > known["a"]
    run(scenario())


def test_removal_is_delivered_as_none():
    async def scenario():
        host = LongPollHost()
        host.publish("a", 1)
        known = {"a": host.snapshot({}, watch_all=True)["a"][0]}
        host.remove("a")
        assert (await host.listen(known, timeout_s=0.01))["a"][1] is None
    run(scenario())


def test_a_restarted_host_never_reuses_a_version_the_listener_knows():
    async def scenario():
        old = LongPollHost()
        for i in range(3):
            old.publish("a", i)
        known = {"a": old.snapshot({}, watch_all=True)["a"][0]}
        new = LongPollHost()  # e.g. the shard actor was replaced
        new.publish("a", "new replicas")
        assert (await new.listen(known, timeout_s=0.01))["a"][1] == "new replicas"
    run(scenario())


def test_listen_times_out_with_no_changes():
    async def scenario():
        host = LongPollHost()
        return await host.listen({}, watch_all=True, timeout_s=0.01)
    assert run(scenario()) == {}


def test_listeners_holding_a_recent_version_get_deltas_the_rest_the_whole_payload():
    from controlplane.long_poll import MAX_DELTAS
    from controlplane.wire import Deltas

    host = LongPollHost()
    apply = lambda payload, delta: payload + [delta]  # noqa: E731
    host.publish("k", [])
    v0 = host.snapshot({}, watch_all=True)["k"][0]
    host.publish_delta("k", 1, apply)
    v1 = host.snapshot({}, watch_all=True)["k"][0]
    host.publish_delta("k", 2, apply)
    assert host.snapshot({"k": v1})["k"][1] == Deltas(v1, (2,))
    assert host.snapshot({"k": v0})["k"][1] == Deltas(v0, (1, 2))
    assert host.snapshot({"k": 0})["k"][1] == [1, 2]  # new listener: whole, built once
    for i in range(MAX_DELTAS):
        host.publish_delta("k", 3 + i, apply)
    assert host.snapshot({"k": v0})["k"][1] == list(range(1, MAX_DELTAS + 3))  # too far
    host.publish("k", ["reset"])  # a whole payload: the deltas before it lead nowhere
    assert host.snapshot({"k": v1})["k"][1] == ["reset"]
    assert host.publish("k", ["reset"]) is False
