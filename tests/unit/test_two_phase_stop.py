"""Haproxy mode: a direct-ingress replica is stopped only after every HAProxy confirmed
it left (phase 1); in proxy mode nothing is asked of HAProxy."""

from __future__ import annotations

import asyncio

from controlplane.config.options import HTTPOptions
from controlplane.ingress.haproxy import membership
from controlplane.settings import ReplicaSettings
from controlplane.specs import with_direct_ingress
from tests.unit.shard_harness import Shard, make_spec, run

HTTP = HTTPOptions(host="127.0.0.1", port=8000, ingress="haproxy", deregistration_window_s=2.0)


class FakeIngress:
    def __init__(self, log: list) -> None:
        self.log = log
        self.gate = asyncio.Event()

    async def deregister(self, deployment: str, replica_id: str, joined=()) -> None:
        self.log.append(("deregister", replica_id))
        await self.gate.wait()


def direct(n: int):
    [spec] = with_direct_ingress([make_spec(n, route_prefix="/app")], HTTP)
    return spec


def test_the_replica_is_stopped_only_after_haproxy_confirmed_it_left():
    async def scenario():
        log: list = []
        ingress = FakeIngress(log)
        shard = Shard(ingress=ingress)
        await shard.deploy(direct(2))
        assert shard.client.handles[shard.client.created[0]].init.direct_ingress.route_prefix \
            == "/app"
        await shard.deploy(direct(1))
        [leaving] = [rid for kind, rid in log if kind == "deregister"]
        assert shard.client.ids("stop") == []  # phase 1 not confirmed yet
        ingress.gate.set()
        await shard.step(2)
        assert shard.client.ids("stop") == [leaving]
    run(scenario)


def test_with_phase_1_off_the_replica_is_stopped_at_once_and_closes_at_once():
    """``deregister_before_stop=False`` (release_tests.drain_events --no-phase-1): no
    HAProxy confirmation is awaited, and the replica holds no deregistration window."""
    async def scenario():
        log: list = []
        shard = Shard(ingress=FakeIngress(log),
                      replica=ReplicaSettings(deregister_before_stop=False))
        await shard.deploy(direct(2))
        init = shard.client.handles[shard.client.created[0]].init
        assert init.direct_ingress.deregistration_window_s == 0.0
        await shard.deploy(direct(1))
        assert log == [] and len(shard.client.ids("stop")) == 1
    run(scenario)


def test_proxy_mode_asks_nothing_of_haproxy():
    async def scenario():
        log: list = []
        shard = Shard(ingress=FakeIngress(log))
        await shard.deploy(make_spec(2, route_prefix="/app"))
        await shard.deploy(make_spec(1, route_prefix="/app"))
        assert log == [] and len(shard.client.ids("stop")) == 1
    run(scenario)


def test_membership_adds_new_servers_and_removes_leaving_ones():
    current = membership.desired_servers({"a/M": [("a#M#0", "127.0.0.1:1"),
                                                  ("a#M#1", "127.0.0.1:2")]})
    desired = membership.desired_servers({"a/M": [("a#M#1", "127.0.0.1:2"),
                                                  ("a#M#2", "127.0.0.1:3")]})
    plan = membership.diff(current, desired)
    backend = membership.backend_name("a/M")
    assert plan.added == [(backend, membership.server_name("a#M#2"), "127.0.0.1:3")]
    assert plan.removed == [(backend, membership.server_name("a#M#0"))]
    assert membership.leave_commands(backend, "s") == [
        f"set server {backend}/s state drain", f"set server {backend}/s state maint"]
