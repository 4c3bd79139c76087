"""haproxy mode: the controller's ``ProxyFleet`` tells every node's HAProxy the fleet's
peers as nodes' HAProxies join, restart and leave (fake listener actors; no Ray)."""

from __future__ import annotations

import asyncio

from controlplane.config.options import HTTPOptions
from controlplane.ingress.proxy_fleet import ProxyFleet
from controlplane.settings import Settings
from controlplane.supervision import Supervisor


class _Method:
    def __init__(self, fn) -> None:
        self._fn = fn

    def remote(self, *args):
        async def call():
            return self._fn(*args)
        return call()


class FakeHAProxyIngress:
    def __init__(self, name: str, address: str, answers: bool = True) -> None:
        self.told: list[dict] = []

        def peer():
            if not answers:
                raise RuntimeError("not answering")
            return [name, address]
        self.peer = _Method(peer)
        self.set_peers = _Method(self.told.append)


def fleet_of(listeners: dict[str, FakeHAProxyIngress]) -> ProxyFleet:
    fleet = ProxyFleet(Settings(), Supervisor())
    fleet._http = HTTPOptions(ingress="haproxy")
    fleet._proxies = {node: [listener] for node, listener in listeners.items()}
    return fleet


def test_every_haproxy_hears_of_every_node_that_joins_and_no_more_of_one_that_left():
    a, b = FakeHAProxyIngress("node_a", "10.0.0.1:7000"), FakeHAProxyIngress("node_b",
                                                                             "10.0.0.2:7000")
    fleet = fleet_of({"a": a, "b": b})
    asyncio.run(fleet._share_peers(["a", "b"]))
    both = {"node_a": "10.0.0.1:7000", "node_b": "10.0.0.2:7000"}
    assert a.told == [both] and b.told == [both]
    fleet._proxies.pop("b")
    fleet._peers.pop("b")  # as ``forget`` does, with its actors' kill
    asyncio.run(fleet._share_peers([]))
    assert a.told[-1] == {"node_a": "10.0.0.1:7000"}


def test_a_restarted_haproxy_with_a_new_address_is_told_to_all():
    a, b = FakeHAProxyIngress("node_a", "10.0.0.1:7000"), FakeHAProxyIngress("node_b",
                                                                             "10.0.0.2:7000")
    fleet = fleet_of({"a": a, "b": b})
    asyncio.run(fleet._share_peers(["a", "b"]))
    moved = FakeHAProxyIngress("node_b", "10.0.0.2:7100")  # its HAProxy started anew
    fleet._proxies["b"] = [moved]
    asyncio.run(fleet._share_peers(["b"]))
    assert a.told[-1] == moved.told[-1] == {"node_a": "10.0.0.1:7000", "node_b": "10.0.0.2:7100"}


def test_a_node_that_does_not_answer_is_left_out_and_the_others_are_told():
    a, mute = FakeHAProxyIngress("node_a", "10.0.0.1:7000"), FakeHAProxyIngress(
        "node_m", "10.0.0.9:7000", answers=False)
    fleet = fleet_of({"a": a, "m": mute})
    asyncio.run(fleet._share_peers(["a", "m"]))
    assert a.told == [{"node_a": "10.0.0.1:7000"}]


def test_proxy_mode_has_no_peers():
    a = FakeHAProxyIngress("node_a", "10.0.0.1:7000")
    fleet = fleet_of({"a": a})
    fleet._http = HTTPOptions(ingress="proxy")
    asyncio.run(fleet._share_peers(["a"]))
    assert a.told == []
