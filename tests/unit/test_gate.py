"""Controller-side push health: the pure gate rules, then one deployment driven tick by tick.

Pure rules first (exact virtual times, explicit ``now``), then ``DeploymentHealth`` with a
small simulation: replicas push on a schedule, probes resolve instantly, the test reads
the actions. No Ray, no clock, no sleeps.
"""

from __future__ import annotations

import pytest

from controlplane.health.gate import (Apply, Defer, Drop, GateState, ProbeOutcome,
                                             ProbeResult, Skip, StartProbe, UsePush, Wait,
                                             consume_push, decide, resolve_probe, stale_after_s,
                                             start_probe)
from controlplane.health.stats import HealthTotals
from controlplane.health.push_health import (ApplyHealth, DeadlineQueue, DeploymentHealth,
                                             ProbeReplica, ReplaceUnhealthy, ReplicaCrashed)
from controlplane.health.push_registry import HealthPushRegistry, PushEntry
from controlplane.health.stall_guard import STALL_EPISODE_CAP_S
from controlplane.wire import PushedHealth

T0 = 1000.0
P = 10.0  # health_check_period_s
HEALTHY = ProbeOutcome(ProbeResult.HEALTHY)
FAILED = ProbeOutcome(ProbeResult.UNHEALTHY, "timed out")
CRASHED = ProbeOutcome(ProbeResult.ACTOR_CRASHED, "actor died")


def entry(received_at: float, healthy: bool = True, failures: int = 0) -> PushEntry:
    return PushEntry.of(PushedHealth(healthy, received_at, 0 if healthy else failures),
                        received_at)


def applied_push(received_at: float, failures: int = 0) -> GateState:
    state, verdict = consume_push(GateState(), entry(received_at, failures == 0, failures))
    assert isinstance(verdict, UsePush)
    return state


# --- consume_push ------------------------------------------------------------------------------


def test_push_is_acted_on_with_healthy_and_failures():
    # Seed 000 review fix: the handoff returns (healthy, consecutive_failures), not a bool.
    state, verdict = consume_push(GateState(), entry(T0, healthy=False, failures=2))
    assert verdict == UsePush(healthy=False, failures=2, failures_counted=2)
    assert state.failures == 2 and state.push_received_at == T0


def test_a_push_already_acted_on_is_skipped():
    state = applied_push(T0)
    assert isinstance(consume_push(state, entry(T0))[1], Skip)


def test_a_push_that_arrived_before_an_applied_probe_started_cannot_overwrite_it():
    # Seed 000 review fix ("the drop guard is symmetric"): the push is strictly older than
    # the probe, so it must not sit in the stash and overwrite the probe's result.
    state = start_probe(GateState(), T0 + 2)
    state, _ = resolve_probe(state, FAILED, newest_push_received_at=None, now=T0 + 3)
    state, verdict = consume_push(state, entry(T0 + 1))
    assert isinstance(verdict, Skip) and state.failures == 1
    assert isinstance(consume_push(state, entry(T0 + 4))[1], UsePush)


# --- resolve_probe -------------------------------------------------------------------------------


def test_a_probe_started_before_a_newer_push_arrived_is_dropped():
    # Seed 000 review fix: its result predates the push; applying it would flap the count.
    state = start_probe(applied_push(T0), T0 + 15)
    state, verdict = resolve_probe(state, FAILED, newest_push_received_at=T0 + 16, now=T0 + 17)
    assert isinstance(verdict, Drop)
    assert state.failures == 0 and state.probe_started_at is None


def test_a_probe_started_after_the_newest_push_is_applied_and_a_tie_goes_to_the_probe():
    state = start_probe(applied_push(T0), T0 + 15)
    state, verdict = resolve_probe(state, FAILED, newest_push_received_at=T0 + 15, now=T0 + 17)
    assert verdict == Apply(False, 1, 1, False, "timed out")
    assert state.applied_probe_started_at == T0 + 15


def test_actor_crashed_is_authoritative_even_after_a_newer_push():
    state = start_probe(applied_push(T0), T0 + 15)
    _, verdict = resolve_probe(state, CRASHED, newest_push_received_at=T0 + 16, now=T0 + 17)
    assert isinstance(verdict, Apply) and verdict.crashed


def test_failures_follow_the_observation_acted_on():
    # Seed 000 review fix: the failures counter had gone silent for push-detected failures
    # while still counting probe results that were discarded.
    state = applied_push(T0, failures=2)  # the replica counted 2: the controller adopts it
    assert state.failures == 2
    probing = start_probe(state, T0 + 20)
    state, verdict = resolve_probe(probing, FAILED, None, T0 + 21)
    assert (verdict.failures, verdict.failures_counted) == (3, 1)
    _, dropped = resolve_probe(probing, FAILED, T0 + 20.5, T0 + 21)
    assert isinstance(dropped, Drop)  # a discarded result counts nothing
    with pytest.raises(ValueError):
        resolve_probe(GateState(), FAILED, None, T0)


# --- decide --------------------------------------------------------------------------------------


def test_a_fresh_push_stands_in_for_a_probe_until_1_5_periods_after_arrival():
    state = applied_push(T0)
    assert decide(state, entry(T0), 0.0, T0 + 14.9, P) == Wait(T0 + 15)
    assert decide(state, entry(T0), 0.0, T0 + 15, P) == StartProbe()
    assert stale_after_s(P) == 15.0


def test_unknown_period_uses_the_stock_one():
    # Seed 000 review fix: without target info nothing may read every push as stale.
    assert stale_after_s(None) == 15.0
    assert decide(applied_push(T0), entry(T0), 0.0, T0 + 1, None) == Wait(T0 + 15)


def test_no_second_probe_while_one_is_in_flight_and_one_probe_per_period():
    state = start_probe(GateState(), T0)
    assert decide(state, None, 0.0, T0 + 100, P) == Wait(None)
    state, _ = resolve_probe(state, HEALTHY, None, T0 + 1)
    assert decide(state, None, 0.0, T0 + 5, P) == Wait(T0 + 11)
    assert decide(state, None, 0.0, T0 + 11, P) == StartProbe()


def test_a_stall_hold_defers_and_revisits_at_least_every_half_period():
    state = applied_push(T0)
    assert decide(state, entry(T0), T0 + 100, T0 + 20, P) == Defer(T0 + 25)
    assert decide(state, entry(T0), T0 + 22, T0 + 20, P) == Defer(T0 + 22)


def test_a_hold_ends_at_its_own_deadline_not_a_freshness_window_later():
    # Seed 000 review fix: deferral used to borrow the push-consume stamp, so the gate held
    # for a further 1.5 periods past the cap (570 s against a documented 120 s at 300 s).
    period = 300.0
    state = applied_push(T0)
    stale = T0 + 450.0
    hold = stale + STALL_EPISODE_CAP_S
    assert isinstance(decide(state, entry(T0), hold, hold - 1, period), Defer)
    assert decide(state, entry(T0), hold, hold, period) == StartProbe()


def test_a_replica_without_a_registry_entry_is_never_held():
    # Seed 000 review fix: probes are its only health signal.
    assert decide(GateState(), None, T0 + 100, T0, P) == StartProbe()


# --- DeadlineQueue -----------------------------------------------------------------------------


def test_deadline_queue_keeps_one_deadline_per_key():
    queue = DeadlineQueue()
    queue.schedule("a", 5.0)
    queue.schedule("a", 3.0)
    queue.schedule("b", 4.0)
    queue.schedule("c", 1.0)
    queue.cancel("c")
    assert queue.pop_due(3.5) == ["a"]
    assert queue.pop_due(10.0) == ["b"]
    assert queue.pop_due(100.0) == []  # "a" was popped; its superseded deadline is skipped


# --- DeploymentHealth: one deployment, tick by tick -----------------------------------------------


class Sim:
    """Replicas that push every half period (spread over it); probes resolve at once."""

    def __init__(self, n: int, silent: int = 0, probe_outcome: ProbeOutcome = HEALTHY) -> None:
        self.totals = HealthTotals()
        self.health = DeploymentHealth(P, self.totals)
        self.now = T0
        self.replicas = [f"app#dep#{i}" for i in range(n)]
        self.silent = [f"app#dep#silent{i}" for i in range(silent)]
        self.pushing = set(self.replicas)
        self.next_push = {r: T0 + (i % 10) * 0.5 for i, r in enumerate(self.replicas)}
        self.probes: list[tuple[float, str]] = []
        self.applied: list[tuple[float, ApplyHealth]] = []
        self.outcome = probe_outcome
        for r in self.replicas + self.silent:
            self.health.watch(r, T0)

    def push(self, replica_id: str, at: float, healthy: bool = True, failures: int = 0) -> None:
        self.health.record_push(replica_id, PushedHealth(healthy, at, failures), at)

    def step(self, dt: float = 0.5) -> list:
        self.now += dt
        for r in self.pushing:
            while self.next_push[r] <= self.now:
                self.push(r, self.next_push[r])
                self.next_push[r] += P / 2
        actions = self.health.tick(self.now)
        for action in list(actions):
            if isinstance(action, ProbeReplica):
                self.probes.append((self.now, action.replica_id))
                actions += self.health.probe_resolved(action.replica_id, self.outcome, self.now)
        self.applied += [(self.now, a) for a in actions if isinstance(a, ApplyHealth)]
        return actions

    def run_until(self, t: float) -> None:
        while self.now < t - 1e-9:
            self.step()

    def probes_between(self, start: float, end: float) -> list[str]:
        return [r for t, r in self.probes if start <= t < end]


def test_fresh_pushes_stand_in_for_probes_and_probes_take_over_when_they_stop():
    sim = Sim(3)
    sim.run_until(T0 + 60)
    assert sim.probes == []
    assert {a.source for _, a in sim.applied} == {"push"}
    sim.pushing.clear()
    last = {r: sim.health.registry.get(r).received_at for r in sim.replicas}
    sim.run_until(T0 + 100)
    for r in sim.replicas:
        assert min(t for t, p in sim.probes if p == r) == last[r] + 1.5 * P
    assert sim.totals.pull_probes_total == len(sim.probes)


def test_staleness_is_anchored_to_arrival_not_to_the_tick_that_consumed_it():
    # Seed 000 review fix: a slow reconcile (here: no tick for 5 s after the arrival) must
    # not stretch the 1.5 x period window on the ticks the controller is behind.
    health = DeploymentHealth(P)
    health.watch("r", T0)
    health.record_push("r", PushedHealth(True, 1.0, 0), received_at=T0)
    health.tick(T0 + 5)  # consumed late
    assert health.tick(T0 + 14.9) == []
    assert health.tick(T0 + 15.0) == [ProbeReplica("r")]


def test_unhealthy_pushes_are_acted_on_and_counted():
    sim = Sim(1)
    sim.step()
    sim.push(sim.replicas[0], T0 + 0.7, healthy=False, failures=1)
    (applied,) = [a for a in sim.step() if isinstance(a, ApplyHealth)]
    assert (applied.healthy, applied.failures, applied.failures_counted) == (False, 1, 1)
    assert sim.health.failures(sim.replicas[0]) == 1


def test_push_arriving_while_a_probe_is_in_flight_wins_in_the_same_tick():
    # The seed's "probe-result precedence when a probe resolves in the same tick (push
    # stashed, consumed next tick)".
    health = DeploymentHealth(P)
    health.watch("r", T0)
    assert health.tick(T0 + P) == [ProbeReplica("r")]
    health.record_push("r", PushedHealth(True, 1.0, 0), received_at=T0 + P + 1)
    assert health.probe_resolved("r", FAILED, T0 + P + 1) == []  # dropped, not applied
    assert health.failures("r") == 0
    assert health.tick(T0 + P + 1.1) == [ApplyHealth("r", True, 0, 0, "push")]
    assert health.tick(T0 + P + 15) == []  # fresh: no probe until 1.5 periods after arrival


def test_push_that_arrived_before_the_probe_started_does_not_overwrite_its_result():
    health = DeploymentHealth(P)
    health.watch("r", T0)
    assert health.tick(T0 + P) == [ProbeReplica("r")]
    # Stamped on arrival (T0 + 9) but handed to the registry after the probe started.
    health.record_push("r", PushedHealth(True, 1.0, 0), received_at=T0 + 9)
    (applied,) = health.probe_resolved("r", FAILED, T0 + P + 1)
    assert (applied.source, applied.failures) == ("probe", 1)
    assert health.tick(T0 + P + 1.1) == []  # the older push is skipped
    assert health.failures("r") == 1


def test_actor_crashed_probe_is_reported_even_after_a_newer_push():
    health = DeploymentHealth(P)
    health.watch("r", T0)
    health.tick(T0 + P)
    health.record_push("r", PushedHealth(True, 1.0, 0), received_at=T0 + P + 1)
    assert health.probe_resolved("r", CRASHED, T0 + P + 2) == [ReplicaCrashed("r", "actor died")]


def test_forgotten_replicas_are_ignored():
    health = DeploymentHealth(P)
    health.watch("r", T0)
    health.tick(T0 + P)
    health.forget("r")
    assert health.probe_resolved("r", FAILED, T0 + P + 1) == []
    health.record_push("r", PushedHealth(True, 1.0, 0), T0 + P + 2)
    assert health.tick(T0 + 100) == [] and health.failures("r") == 0
    assert health.tick(T0 + 1000) == []  # no visit is left scheduled for it


def test_steady_state_tick_touches_only_arrivals_and_due_visits():
    class CountingRegistry(HealthPushRegistry):
        reads = 0

        def get(self, replica_id):
            CountingRegistry.reads += 1
            return super().get(replica_id)

    totals = HealthTotals()
    health = DeploymentHealth(P, totals, registry=CountingRegistry(totals))
    for i in range(1000):
        health.watch(f"r{i}", T0)
        health.record_push(f"r{i}", PushedHealth(True, 1.0, 0), T0)
    health.tick(T0)
    CountingRegistry.reads = 0
    for k in range(1, 20):  # 9.5 s of ticks: nothing arrives, nothing is due
        assert health.tick(T0 + k * 0.5) == []
    assert CountingRegistry.reads == 0
    health.record_push("r7", PushedHealth(True, 2.0, 0), T0 + 10)
    health.tick(T0 + 10)
    # The steady arrival was acted on at ingest and moved r7's visit to its stale time;
    # the tick reads only the 999 other replicas, whose first visits fall due.
    assert CountingRegistry.reads == 999
    health.record_push("r8", PushedHealth(False, 3.0, 1), T0 + 11)
    CountingRegistry.reads = 0
    assert [type(a) for a in health.tick(T0 + 11)] == [ApplyHealth]  # a flip: the tick
    assert CountingRegistry.reads == 1


# --- DeploymentHealth under a stall ---------------------------------------------------------------


def stalled(n: int = 100, silent: int = 0) -> tuple[Sim, float]:
    """Pushes stop for all n replicas at T0 + 30; returns the sim and the engage time."""
    sim = Sim(n, silent=silent)
    sim.run_until(T0 + 30)
    sim.pushing.clear()
    while sim.health.guard.state.value != "ENGAGED":
        sim.step()
        assert sim.now < T0 + 60
    return sim, sim.now


def test_stall_verdict_defers_probes_staggered_and_capped():
    sim, engaged_at = stalled()
    before = len(sim.probes)
    assert before < 60  # some went out before the verdict; the rest are held
    sim.run_until(engaged_at + 0.75 * STALL_EPISODE_CAP_S)
    assert sim.probes_between(engaged_at + 0.5, sim.now) == []
    sim.run_until(engaged_at + STALL_EPISODE_CAP_S + 1)
    late = sim.probes_between(engaged_at + 0.5, sim.now)
    assert set(late) == set(sim.replicas)  # every replica probed by the cap, none later
    times = [t for t, _ in sim.probes if t > engaged_at + 0.5]
    assert len(set(times)) > 10  # the gates did not all open on one tick
    assert sim.totals.stall_episodes_total == 1


def test_probe_results_during_an_episode_are_applied():
    # Seed 000 review fix: the drop guard read a deferral as a superseding observation and
    # destroyed every probe result that resolved during an episode.
    sim, engaged_at = stalled()
    sim.outcome = FAILED
    sim.run_until(engaged_at + STALL_EPISODE_CAP_S - 1)
    probed_in_episode = [(t, a) for t, a in sim.applied if a.source == "probe" and t > engaged_at]
    assert probed_in_episode and all(not a.healthy for _, a in probed_in_episode)


def test_replica_without_pushes_is_probed_during_an_episode():
    sim, engaged_at = stalled(silent=1)
    sim.run_until(engaged_at + 2 * P)
    assert sim.silent[0] in sim.probes_between(engaged_at + 0.5, sim.now)


def test_episode_ending_early_wakes_held_replicas_at_once():
    sim, engaged_at = stalled()
    dead = sim.replicas[:10]
    sim.run_until(engaged_at + 5)
    for r in sim.replicas[10:]:  # ingest recovers for all but 10 replicas
        sim.pushing.add(r)
        sim.next_push[r] = sim.now
    while sim.health.guard.state.value == "ENGAGED":
        ending = sim.step()
        assert sim.now < engaged_at + 0.75 * STALL_EPISODE_CAP_S
    woken = {a.replica_id for a in ending if isinstance(a, ProbeReplica)}
    assert woken >= set(dead) - set(sim.probes_between(engaged_at - 20, engaged_at + 1))
    assert sim.totals.stall_episodes_total == 1


# --- the replacement rule and the deployment's condition ------------------------------------


def push_failures(health: DeploymentHealth, failures: int, at: float) -> list:
    health.record_push("r", PushedHealth(False, at, failures), received_at=at)
    return health.tick(at)


def test_failures_below_the_threshold_are_shown_and_counted_not_replaced():
    totals = HealthTotals()
    health = DeploymentHealth(P, totals, unhealthy_threshold=3)
    health.watch("r", T0)
    (shown,) = push_failures(health, 2, T0 + 1)
    assert isinstance(shown, ApplyHealth)
    assert shown.text == "self health check failed (2 consecutive, push)"
    assert totals.health_check_failures_total == 2 and not health.unhealthy


def test_the_threshold_replaces_the_replica_and_marks_the_deployment_unhealthy():
    health = DeploymentHealth(P, unhealthy_threshold=3)
    health.watch("r", T0)
    assert push_failures(health, 3, T0 + 1) == [
        ReplaceUnhealthy("r", "self health check failed (3 consecutive, push)")]
    assert health.unhealthy
    health.note_capacity(running=1, target=2)
    assert health.unhealthy
    health.note_capacity(running=2, target=2)
    assert not health.unhealthy


def test_a_probe_that_finds_the_actor_gone_marks_the_deployment_unhealthy():
    health = DeploymentHealth(P)
    health.watch("r", T0)
    health.tick(T0 + P)
    health.probe_resolved("r", CRASHED, T0 + P + 1)
    assert health.unhealthy
