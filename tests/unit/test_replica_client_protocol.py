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
