"""Every replica client the shard may be given implements ``ReplicaClient`` as declared:
the real one, the unit tests' fake and the release tests' simulated fleet. A method
missing or called differently would fail only at run time, deep in a shard task."""

from __future__ import annotations

import inspect

import pytest

from controlplane.replica_client import RayReplicaClient, ReplicaClient
from release_tests.sim_fleet import SimReplicaClient
from tests.unit.fakes import FakeReplicaClient

METHODS = sorted(name for name, member in vars(ReplicaClient).items()
                 if callable(member) and not name.startswith("_"))


def _shape(function) -> tuple[bool, list[str]]:
    params = [p.name for p in inspect.signature(function).parameters.values()]
    return inspect.iscoroutinefunction(function), params[1:]  # without self


def test_the_protocol_declares_the_shards_calls() -> None:
    assert {"create", "initialize", "check_health", "wait_until_stopped", "reconfigure",
            "update_rank", "update_health_timings", "stop", "kill", "find",
            "describe", "start_phase"} == set(METHODS)


@pytest.mark.parametrize("client", [RayReplicaClient, FakeReplicaClient, SimReplicaClient])
@pytest.mark.parametrize("method", METHODS)
def test_a_client_implements_the_method_as_declared(client: type, method: str) -> None:
    assert _shape(getattr(client, method)) == _shape(getattr(ReplicaClient, method))


class _RecordingActorClass:
    """Stands in for ``ray.remote(ReplicaActor)``: records the options of each create."""

    def __init__(self) -> None:
        self.options_seen: list[dict] = []

    def options(self, **options):
        self.options_seen.append(options)
        return self

    def remote(self, init):
        return init


def _create_with(ray_actor_options: dict) -> dict:
    from controlplane.wire import ReplicaInit
    from tests.unit.shard_harness import make_spec

    client = RayReplicaClient.__new__(RayReplicaClient)
    client._namespace, client._actor_cls = "ns", _RecordingActorClass()
    client._head = lambda: "HEAD"
    init = ReplicaInit("app#model#r1", "app", "model", b"", None, 0, 5, "shard_0", "ns", 1.0)
    client.create(init, make_spec(ray_actor_options=ray_actor_options))
    return client._actor_cls.options_seen[0]


def test_replicas_are_spread_across_nodes_unless_the_user_places_them() -> None:
    # Ray's SPREAD is best effort (a raylet's round robin), so the multi-node tests do not
    # assert where replicas land; this pins that fleetplane asks for it.
    assert _create_with({"num_cpus": 0})["scheduling_strategy"] == "SPREAD"
    assert _create_with({"num_cpus": 0, "scheduling_strategy": "DEFAULT"})[
        "scheduling_strategy"] == "DEFAULT"


def test_replicas_keep_off_the_head_while_another_node_can_take_them() -> None:
    options = _create_with({"num_cpus": 0, "label_selector": None, "fallback_strategy": None})
    assert options["label_selector"] == {"ray.io/node-id": "!HEAD"}
    assert options["fallback_strategy"] == [{"label_selector": {}}]  # the head, if it alone can
    assert options["scheduling_strategy"] == "SPREAD"
    placed = _create_with({"num_cpus": 0, "label_selector": {"zone": "a"}})
    assert placed["label_selector"] == {"zone": "a"} and "fallback_strategy" not in placed
    assert "scheduling_strategy" not in placed  # the user's placement, as given


def test_without_a_known_head_replicas_are_only_spread() -> None:
    from controlplane.replica_client import placement

    assert placement({"num_cpus": 1}, None) == {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
