"""All pushes delayed (controller ingest lag), with and without a genuine outage.

The stall guard only judges deployments with >= 64 tracked replicas, more real actors
than this machine holds, so these cases run 128 simulated replicas in one host process
against a real shard actor (``release_tests.sim_fleet``: a ``ControllerShard`` with the
simulated-fleet replica client; same ingest methods, reconcile loop, push health, stall
guard and probes). Lag is the test-only ingest pause of that shard: every arriving report
waits before it reaches the shard's state, as on a controller whose event loop is behind.
The stall episode cap is 4 s here (``stall_episode_cap_s``) instead of 120 s.
"""

from __future__ import annotations

import pytest
import ray

from controlplane.health.stall_guard import GuardState
from release_tests.sim_fleet import SimConfig, SimFleet

pytestmark = pytest.mark.integration

N = 128


@pytest.fixture(scope="module")
def sim(fleet):
    sim = SimFleet(SimConfig(replicas=N, period_s=1.0, timeout_s=0.5, report_interval_s=1.0,
                             per_host=N, stall_cap_s=4.0, namespace="fleetplane_sim_test"))
    try:
        sim.deploy()
        sim.wait(lambda s: s["running"] == N and s["health"].pushes_total >= 2 * N,
                 timeout_s=60, what=f"{N} simulated replicas pushing")
        yield sim
    finally:
        ray.get(sim.shard.set_ingest_paused.remote(False))
        sim.shutdown()


def pause(sim: SimFleet, paused: bool) -> None:
    ray.get(sim.shard.set_ingest_paused.remote(paused))


def test_lag_without_outage_defers_probes_and_replaces_nothing(sim):
    before = sim.summary()
    pause(sim, True)
    try:
        held = sim.wait(lambda s: s["stall"].state is GuardState.ENGAGED
                        and s["stall"].held >= N // 2, timeout_s=30, what="stall verdict")
    finally:
        pause(sim, False)
    after = sim.wait(lambda s: s["stall"].state is GuardState.IDLE, timeout_s=30,
                     what="episode over once pushes arrive again")
    assert after["health"].stall_episodes_total == before["health"].stall_episodes_total + 1
    probes = after["health"].pull_probes_total - before["health"].pull_probes_total
    assert probes < N  # without the guard, every stale replica is probed every period
    assert held["health"].pull_probes_total - before["health"].pull_probes_total == probes
    assert after["created"] == before["created"] == N  # no healthy replica replaced
    assert after["running"] == N


def test_lag_with_genuine_outage_falls_through_to_probes_after_the_cap(sim):
    before = sim.summary()
    ids = sim.replica_ids()
    down, healthy = ids[:80], ids[80:]
    assert sim.set_down(down) == len(down)
    pause(sim, True)
    try:
        sim.wait(lambda s: s["health"].stall_episodes_total
                 > before["health"].stall_episodes_total, timeout_s=30, what="stall verdict")
        sim.wait(lambda s: s["running"] == N and not set(down) & set(sim.replica_ids()),
                 timeout_s=60, what="the down replicas replaced")
    finally:
        pause(sim, False)
    after = sim.summary()
    assert set(healthy) <= set(sim.replica_ids())  # no healthy replica replaced
    assert after["created"] == before["created"] + len(down)
    assert after["health"].health_check_failures_total >= (
        before["health"].health_check_failures_total + 3 * len(down))
