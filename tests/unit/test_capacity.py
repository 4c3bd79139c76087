"""What the cluster could ever place: a deploy that asks too much is told so."""

from __future__ import annotations

import math

from controlplane.capacity import demand, node_resources, placeable, shortfall

NODES = [{"CPU": 2.0, "memory": 8e9}, {"CPU": 4.0, "GB10": 1.0}]


def test_demand_maps_ray_actor_options_to_resource_names():
    assert demand({"num_cpus": 1, "num_gpus": 0, "resources": {"GB10": 1}}) == {
        "CPU": 1.0, "GB10": 1.0}
    assert demand({"num_cpus": 0}) == {}


def test_a_replica_must_fit_on_one_node():
    assert placeable({"CPU": 1.0}, NODES) == 6
    assert placeable({"CPU": 3.0}, NODES) == 1  # 2 + 4 CPUs, but not 3 on one node twice
    assert placeable({"CPU": 1.0, "GB10": 1.0}, NODES) == 1
    assert placeable({}, NODES) == math.inf


def test_enough_room_says_nothing():
    assert shortfall(6, {"num_cpus": 1}, NODES) == ""
    assert shortfall(10_000, {"num_cpus": 0}, NODES) == ""


def test_too_many_replicas_say_how_many_fit():
    text = shortfall(1000, {"num_cpus": 1}, NODES)
    assert text == ("at most 6 of 1000 replicas can be placed: each needs {CPU: 1} on one "
                    "node and the 2 alive node(s) hold 6")


def test_a_resource_no_node_has_is_named():
    text = shortfall(2, {"num_cpus": 1, "resources": {"H100": 1}}, NODES)
    assert text.startswith("none of 2 replicas can be placed")
    assert "no node has H100" in text


def test_only_alive_nodes_count():
    nodes = node_resources([{"Alive": True, "Resources": {"CPU": 2.0}},
                            {"Alive": False, "Resources": {"CPU": 64.0}}])
    assert nodes == [{"CPU": 2.0}]
