"""Push health on real replicas: the fault matrix of issue 4.

One deployment of six ``Breakable`` replicas (health period 1 s, timeout 0.5 s, so a
verdict takes a few seconds) on a fleetplane instance of its own (``own_fleet``), so what
it breaks reaches no other module; each test breaks one more replica a different way and
waits for the verdict. Expected: a hung, slow or raising check and a killed process get
their replica replaced; a flapping check does not; no other replica is ever replaced.
Controller lag (all pushes delayed) needs >= 64 replicas for the stall guard and is in
test_push_health_lag.py.
"""

from __future__ import annotations

import os
import signal

import pytest
import ray

from tests.integration import conftest
from tests.integration.conftest import app, dep_status, deploy, own_fleet, settled, wait_for

pytestmark = pytest.mark.integration

APP, DEP, N = "phealth", "Breakable", 6
NAMESPACE = "fleetplane_breakable"
IMPORT = "tests.integration.health_apps:Breakable"


def breakable_app(**extra) -> dict:
    return app(APP, IMPORT, deployments=[{
        "name": DEP, "num_replicas": N, "health_check_period_s": 1.0,
        "health_check_timeout_s": 0.5, **extra}])


class Fleet:
    """The deployment, plus which replicas the tests broke (the rest must survive)."""

    def __init__(self, client) -> None:
        self.client = client
        deploy(client, breakable_app())
        status = wait_for(client, settled(APP, N, DEP), what=f"{N} replicas")
        self.original = {r["replica_id"]: r for r in self.replicas(status)}
        self.broken: set[str] = set()

    def replicas(self, status: dict | None = None) -> list[dict]:
        return dep_status(status or self.client.status(), APP, DEP)["replicas"]

    def ids(self, status: dict) -> set[str]:
        return {r["replica_id"] for r in self.replicas(status)}

    def victim(self) -> dict:
        replica = next(r for rid, r in self.original.items() if rid not in self.broken)
        self.broken.add(replica["replica_id"])
        return replica

    def wait_replaced(self, victim: dict, what: str) -> dict:
        rid = victim["replica_id"]
        status = wait_for(self.client, lambda s: settled(APP, N, DEP)(s)
                          and rid not in self.ids(s), what=f"{what}: {rid} replaced")
        self.assert_untouched(status)
        return status

    def assert_untouched(self, status: dict) -> None:
        """Every replica no test broke is still the same replica."""
        untouched = set(self.original) - self.broken
        assert untouched <= self.ids(status), untouched - self.ids(status)


@pytest.fixture(scope="module")
def breakable(fleet) -> Fleet:  # fleet: the session's Ray is up
    with own_fleet(NAMESPACE) as client:
        yield Fleet(client)


def call(replica: dict, *args, method: str = "__call__"):
    return conftest.call(replica, *args, method=method, namespace=NAMESPACE)


def health(status: dict) -> dict:
    return status["controller"]["health"]


def test_fresh_pushes_keep_pull_probes_near_zero(breakable):
    before = health(breakable.client.status())
    status = wait_for(breakable.client,
                      lambda s: health(s)["pushes_total"] >= before["pushes_total"] + 5 * N,
                      what="five pushes per replica")
    after = health(status)
    pushes = after["pushes_total"] - before["pushes_total"]
    probes = after["pull_probes_total"] - before["pull_probes_total"]
    assert probes <= max(2, pushes // 20), (probes, pushes)  # pull would be one per push
    intervals = after["self_check_interval_s"]  # wall-time figures: shape, not speed
    assert set(intervals) == {"p50", "p99", "max"}
    assert 0 < intervals["p50"] <= intervals["p99"] <= intervals["max"]
    push_health = dep_status(status, APP, DEP)["push_health"]
    assert push_health["tracked"] == N and push_health["stall_state"] == "IDLE"
    assert all(r["healthy"] for r in breakable.replicas(status))


def test_probes_answer_from_cache(breakable):
    replica = next(r for rid, r in breakable.original.items() if rid not in breakable.broken)
    actor = ray.get_actor(replica["actor_name"], namespace=NAMESPACE)
    before = call(replica, method="health_checks")
    ray.get([actor.check_health.remote() for _ in range(50)], timeout=30)
    # 50 concurrent probes; only the periodic self-check (every 0.5 s) ran meanwhile.
    assert call(replica, method="health_checks") - before < 10


def test_hung_check_is_replaced_and_healthy_replicas_untouched(breakable):
    victim = breakable.victim()
    call(victim, "hang", method="set_health")
    breakable.wait_replaced(victim, "hung check")


def test_slow_check_over_the_timeout_is_replaced(breakable):
    victim = breakable.victim()
    call(victim, "slow", 2.0, method="set_health")
    breakable.wait_replaced(victim, "slow check")


def test_raising_check_is_replaced_and_failures_are_counted(breakable):
    failures_before = health(breakable.client.status())["health_check_failures_total"]
    victim = breakable.victim()
    call(victim, "raise", method="set_health")
    status = breakable.wait_replaced(victim, "raising check")
    assert health(status)["health_check_failures_total"] >= failures_before + 3


def test_killed_replica_process_is_replaced(breakable):
    victim = breakable.victim()
    os.kill(call(victim)["pid"], signal.SIGKILL)
    breakable.wait_replaced(victim, "killed process")


def test_flapping_check_is_not_replaced(breakable):
    victim = breakable.victim()
    call(victim, "flap", method="set_health")
    start = call(victim, method="health_checks")
    # Six seconds of checks at half the period: twelve, failing every other one.
    wait_for(breakable.client, lambda s: call(victim, method="health_checks") >= start + 12,
             what="twelve flapping checks")
    status = breakable.client.status()
    assert victim["replica_id"] in breakable.ids(status)
    breakable.broken.discard(victim["replica_id"])  # it must survive like the untouched
    breakable.assert_untouched(status)
    call(victim, "ok", method="set_health")


def test_heartbeats_fill_the_gap_when_reports_are_slower_than_the_period(breakable):
    before = health(breakable.client.status())["heartbeats_total"]
    beat = app("pheartbeat", IMPORT, deployments=[{
        "name": DEP, "num_replicas": 1, "health_check_period_s": 0.5,
        "health_check_timeout_s": 0.5}])  # metric reports every 1 s > 0.5 s period
    deploy(breakable.client, breakable_app(), beat)
    status = wait_for(breakable.client,
                      lambda s: settled("pheartbeat", 1, DEP)(s)
                      and health(s)["heartbeats_total"] >= before + 5, what="heartbeats")
    assert all(r["healthy"] for r in dep_status(status, "pheartbeat", DEP)["replicas"])
    breakable.assert_untouched(status)
