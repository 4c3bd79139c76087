"""What a node's HAProxy should serve (``Wanted``), what it was given (``Loaded``), and the
phase-1-off late leaving: pure state, times passed in; no HAProxy, no Ray."""

from __future__ import annotations

from controlplane.ingress.haproxy.desired import (EARLY_S, LateLeaving, Loaded, Wanted,
                                                  server_maxconn)
from controlplane.ingress.haproxy.membership import backend_name, server_name
from controlplane.ingress.haproxy.peers import PeerSet, peers_of
from controlplane.wire import ReplicaInfo, RoutingUpdate

WEB = backend_name("web/M")


def update(*replicas: str, max_ongoing: int = 2, max_queued: int = -1) -> RoutingUpdate:
    return RoutingUpdate(
        replicas=tuple(ReplicaInfo(r, f"actor-{r}", "node", http_address=f"10.0.0.1:{i}")
                       for i, r in enumerate(replicas, start=4000)),
        max_ongoing_requests=max_ongoing, max_queued_requests=max_queued)


def test_the_members_are_the_routed_deployments_running_replicas():
    wanted = Wanted()
    wanted.routes = {"/web": "web/M"}
    wanted.set_deployment("web/M", update("r1", "r2"))
    wanted.set_deployment("other/M", update("r9"))  # no route to it: not served
    assert wanted.servers({}, now=0.0) == {
        WEB: {server_name("r1"): "10.0.0.1:4000", server_name("r2"): "10.0.0.1:4001"}}
    wanted.set_deployment("web/M", None)  # deleted: nothing known of it
    assert wanted.servers({WEB: {"s": "10.0.0.1:1"}}, now=0.0) == {WEB: {"s": "10.0.0.1:1"}}


def test_a_server_added_ahead_of_the_long_poll_is_kept_until_it_brings_it_or_for_a_while():
    wanted = Wanted()
    wanted.routes = {"/web": "web/M"}
    wanted.set_deployment("web/M", update("r1"))
    wanted.joined_early(WEB, server_name("r2"), "10.0.0.1:5000", now=100.0)
    assert server_name("r2") in wanted.servers({}, now=100.0 + EARLY_S - 1)[WEB]
    assert server_name("r2") not in wanted.servers({}, now=100.0 + EARLY_S)[WEB]


def test_a_bounded_queue_lets_one_more_request_reach_the_replica_to_be_rejected_there():
    assert server_maxconn(update(max_ongoing=2, max_queued=-1)) == 2  # HAProxy queues
    assert server_maxconn(update(max_ongoing=2, max_queued=0)) == 3
    assert server_maxconn(update(max_ongoing=2, max_queued=5)) == 8
    wanted = Wanted()
    wanted.set_deployment("web/M", update("r1", max_ongoing=4, max_queued=1))
    assert wanted.maxconn() == {WEB: 6}


def test_a_reload_is_due_when_the_routes_or_the_drain_changed():
    wanted, loaded = Wanted(), Loaded()
    assert not loaded.differs(wanted)  # no routes heard yet: nothing to load
    wanted.routes = {"/web": "web/M"}
    assert loaded.differs(wanted)
    loaded.routes = dict(wanted.routes)
    assert not loaded.differs(wanted)
    wanted.draining = True
    assert loaded.differs(wanted)


def test_a_reload_is_due_when_a_deployments_routing_policy_changed():
    import dataclasses

    wanted, loaded = Wanted(), Loaded()
    wanted.routes = loaded.routes = {"/web": "web/M"}
    wanted.set_deployment("web/M", dataclasses.replace(
        update("r1"), request_router=(("name", "prefix"),)))
    assert loaded.differs(wanted)
    loaded.balances = wanted.balances()
    assert not loaded.differs(wanted)
    wanted.set_deployment("web/M", update("r1"))  # back to p2c
    assert loaded.differs(wanted)


def test_a_new_p2c_deployment_heard_after_its_route_costs_no_second_reload():
    wanted, loaded = Wanted(), Loaded()
    wanted.routes = loaded.routes = {"/web": "web/M"}  # reloaded for the route
    wanted.set_deployment("web/M", update("r1"))  # its policy: the default
    wanted.set_deployment("other/N", update("r2"))  # a deployment with no route
    assert wanted.balances() == {} and not loaded.differs(wanted)


def test_with_phase_1_off_haproxy_hears_a_window_late():
    late = LateLeaving(window_s=2.0)
    assert late.not_yet(WEB, "s1", now=10.0)
    assert late.not_yet(WEB, "s1", now=11.9)
    assert not late.not_yet(WEB, "s1", now=12.0)
    assert late.not_yet(WEB, "s1", now=12.0)  # leaving again: a new window


def test_a_deployment_that_scales_to_zero_gets_the_cold_door_and_a_reload_when_that_changes():
    import dataclasses

    wanted, loaded = Wanted(), Loaded()
    wanted.routes = loaded.routes = {"/web": "web/M"}
    wanted.set_deployment("web/M", dataclasses.replace(update(), cold_hold_s=30.0))
    wanted.set_deployment("other/N", dataclasses.replace(update(), cold_hold_s=30.0))  # no route
    assert wanted.cold() == {WEB} and loaded.differs(wanted)
    loaded.cold = wanted.cold()
    assert not loaded.differs(wanted)
    wanted.set_deployment("web/M", update("r1"))  # min_replicas raised above 0
    assert wanted.cold() == set() and loaded.differs(wanted)


def test_the_peers_are_rendered_with_a_stick_table_and_a_change_of_them_reloads():
    import dataclasses

    peers = PeerSet("node_a")
    peers.listen_on("127.0.0.1", config="peers fleetplane\n    peer node_a 10.0.0.1:7000\n")
    wanted, loaded = Wanted(peers), Loaded()
    wanted.routes = loaded.routes = {"/web": "web/M"}
    wanted.set_deployment("web/M", update("r1"))
    peers.set({"node_b": "10.0.0.2:7000"})
    assert wanted.rendered_peers(wanted.balances()) is None  # p2c: no table, no peers
    assert not loaded.differs(wanted)
    wanted.set_deployment("web/M", dataclasses.replace(
        update("r1"), request_router=(("name", "prefix"),)))
    loaded.balances = wanted.balances()
    assert loaded.differs(wanted)  # a table now: its peers are to be rendered
    loaded.peers = wanted.rendered_peers(loaded.balances)
    assert dict(loaded.peers.addresses) == {"node_a": "10.0.0.1:7000",
                                            "node_b": "10.0.0.2:7000"}
    assert not loaded.differs(wanted)
    peers.set({"node_a": "10.9.9.9:1", "node_b": "10.0.0.2:7000", "node_c": "10.0.0.3:7000"})
    assert loaded.differs(wanted)  # a node joined (its own entry is its own to keep)
    assert dict(wanted.rendered_peers(loaded.balances).addresses)["node_a"] == "10.0.0.1:7000"


def test_an_adopted_haproxy_keeps_its_peer_address_and_its_peers():
    config = ("global\n    localpeer node_a\nbackend x\n    balance leastconn\n"
              "peers fleetplane\n    peer node_a 10.0.0.1:7000\n    peer node_b 10.0.0.2:7001\n")
    assert peers_of(config) == {"node_a": "10.0.0.1:7000", "node_b": "10.0.0.2:7001"}
    adopted = PeerSet("node_a")
    assert adopted.listen_on("10.0.0.1", config) == "10.0.0.1:7000"
    assert dict(adopted.current().addresses) == peers_of(config)
    fresh = PeerSet("node_a")
    host, port = fresh.listen_on("127.0.0.1").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert dict(fresh.current().addresses) == {"node_a": fresh.address}


def test_an_adopted_haproxy_keeps_every_server_until_the_routes_are_heard():
    """A restarted manager's first sync may come before the routes' long-poll: unknown is
    not empty (it once removed every server: 503s until they were added back)."""
    loaded = {WEB: {server_name("r1"): "10.0.0.1:4000"}}
    wanted = Wanted()
    assert wanted.servers(loaded, now=0.0) == loaded
    wanted.routes = {"/web": "web/M"}  # heard; the replica set not yet: kept too
    assert wanted.servers(loaded, now=0.0) == loaded
    wanted.set_deployment("web/M", update("r2"))
    assert wanted.servers(loaded, now=0.0) == {WEB: {server_name("r2"): "10.0.0.1:4000"}}
