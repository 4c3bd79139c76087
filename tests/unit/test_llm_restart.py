"""The restart policy, and seed 001's day replayed under a fake clock.

The day: a GB10 server making about 8 steps a second, a batch job that fills every slot
with bursts of 2-4 long requests for minutes at a time, long prompts read for two minutes
without an output token, and JIT compiles that stall the engine for 30-70 s. The old
watchdog restarted this server eight times; the check plus the policy must restart it zero
times, without a test request to a full server. A stuck engine must be restarted after
exactly two intervals, once, whatever its restart then makes clients see.
"""

from __future__ import annotations

import random

import pytest

from controlplane.clock import FakeClock
from replicas.llm_health import BackendChecker, CheckSettings
from replicas.llm_restart import Decision, RestartPolicy
from replicas.llm_verdict import Action, Verdict
from tests.llm_sim.engine import SimEngine
from tests.llm_sim.fake_http import SimFetcher

INTERVAL_S = 40.0
STEP_HZ = 8              # seed 001: about 8 tokens a second for one request
SLOTS = 2                # bursts of 2-4 requests fill every slot
LONG_PREFILL_STEPS = 960  # two minutes reading a long prompt: steps, no output token


# ---- the policy alone ------------------------------------------------------------------------
@pytest.mark.parametrize("verdict", [None, Verdict.IDLE, Verdict.BUSY, Verdict.NO_METRICS])
def test_keeps_a_server_that_is_not_shown_stuck(verdict):
    policy, decision = RestartPolicy().decide(verdict, now=5.0)
    assert decision is Decision.KEEP and policy == RestartPolicy()


@pytest.mark.parametrize("verdict", [Verdict.STUCK, Verdict.DEAD])
def test_restarts_once_on_stuck_or_dead_then_waits_for_the_new_process(verdict):
    policy, decision = RestartPolicy().decide(verdict, now=5.0, reason="why")
    assert decision is Decision.RESTART
    assert (policy.restart_issued_at_s, policy.restarts, policy.reason) == (
        5.0, 1, f"{verdict.value}: why")
    for later in (Verdict.DEAD, Verdict.STUCK, Verdict.BUSY):
        policy, decision = policy.decide(later, now=6.0)
        assert decision is Decision.WAITING
    fresh = RestartPolicy()  # the replacement replica's own
    assert fresh.decide(Verdict.BUSY, now=7.0)[1] is Decision.KEEP
    assert fresh.decide(Verdict.STUCK, now=8.0)[1] is Decision.RESTART


# ---- the day -------------------------------------------------------------------------------
class Day:
    """One engine, its check and the policy under a fake clock; the test plays the owner."""

    def __init__(self, seed: int = 1) -> None:
        self.clock = FakeClock(start_s=0.0)
        self.rng = random.Random(seed)
        self.engine = SimEngine("gb10-model", SLOTS, wall=self.clock.monotonic)
        self.fetcher = SimFetcher(self.engine)
        self.checker = BackendChecker("http://gb10:8000", self.fetcher, self.clock,
                                      CheckSettings(interval_s=INTERVAL_S))
        self.policy = RestartPolicy()
        self.stalled = (0.0, 0.0)  # [from, until): the engine takes no step
        self.next_burst_at = float("inf")
        self.reads = []          # (snapshot, slots were full) per check
        self.verdicts = []

    def advance(self, seconds: float) -> None:
        """Step the engine at STEP_HZ; idle stretches are skipped in one jump."""
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end:
            now = self.clock.monotonic()
            if now >= self.next_burst_at:
                self._burst()
            if not self.engine.busy:
                self.clock.advance(max(0.0, min(end, self.next_burst_at) - now))
                continue
            self.clock.advance(min(1 / STEP_HZ, end - now))
            if not self.stalled[0] <= self.clock.monotonic() < self.stalled[1]:
                self.engine.step()

    def _burst(self) -> None:
        prefill = self.rng.choice([0, 40, LONG_PREFILL_STEPS])
        for _ in range(self.rng.randint(2, 4)):
            self.engine.submit(self.rng.randint(800, 2400), prefill, internal=True)
        if self.rng.random() < 0.5:  # a JIT compile stalls the engine for 30-70 s
            start = self.clock.monotonic() + self.rng.uniform(5, 120)
            self.stalled = (start, start + self.rng.uniform(30, 70))
        self.next_burst_at = self.clock.monotonic() + self.rng.uniform(5 * 60, 30 * 60)

    def check(self) -> Decision:
        full = self.engine.full
        step = self.checker.check_once()
        self.reads.append((step.snapshot, full))
        j = step.judgement
        verdict = j.verdict if j.action is Action.REPORT else None
        self.verdicts.append(verdict)
        self.policy, decision = self.policy.decide(verdict, self.clock.monotonic(), j.reason)
        return decision

    def run(self, seconds: float) -> list[Decision]:
        decisions = []
        for _ in range(int(seconds / INTERVAL_S)):
            decisions.append(self.check())
            self.advance(INTERVAL_S)
        return decisions


def token_based_stucks(reads) -> int:
    """Where the first version of the check (output tokens as progress) would say stuck."""
    count = 0
    for (a, _), (b, _), (c, _) in zip(reads, reads[1:], reads[2:]):
        if all(s is not None and s.requests_present for s in (a, b, c)) and (
                a.generation_tokens == b.generation_tokens == c.generation_tokens):
            count += 1
    return count


def test_a_healthy_server_under_the_seed_day_is_never_restarted():
    day = Day(seed=22)
    day.next_burst_at = 60.0
    decisions = day.run(24 * 3600)
    assert Decision.RESTART not in decisions and day.policy.restarts == 0
    assert day.fetcher.completions_while_full == 0    # no test request took a slot...
    assert day.fetcher.completions_while_busy == 0    # ...or waited behind one
    # The day was the hard one: slots full at many checks (a real request would have queued),
    # engine stalls, and long prompts a token-counting check would have called stuck.
    assert sum(full for _, full in day.reads) > 100
    assert token_based_stucks(day.reads) > 0
    assert day.verdicts.count(Verdict.BUSY) > 100 and Verdict.IDLE in day.verdicts


def test_a_stuck_engine_is_restarted_after_exactly_two_intervals():
    day = Day()
    for _ in range(SLOTS + 1):
        day.engine.submit(100_000, internal=True)
    day.run(2 * INTERVAL_S)  # reads at 0 s (a baseline) and 40 s (busy); the clock is at 80 s
    assert day.check() is Decision.KEEP and day.verdicts[-1] is Verdict.BUSY
    day.engine.set_fault("stuck")  # right after that read
    stuck_at = day.clock.monotonic()
    day.advance(INTERVAL_S)
    assert day.check() is Decision.KEEP  # one interval without a step: not yet
    day.advance(INTERVAL_S)
    assert day.check() is Decision.RESTART
    assert day.policy.restart_issued_at_s == stuck_at + 2 * INTERVAL_S == 160.0
    assert day.fetcher.completions_while_full == 0


def test_what_a_restart_causes_is_not_evidence_for_the_next_one():
    day = Day()
    for _ in range(SLOTS):
        day.engine.submit(100_000, internal=True)
    day.run(INTERVAL_S)
    day.engine.set_fault("stuck")
    decisions = day.run(3 * INTERVAL_S)
    assert decisions.count(Decision.RESTART) == 1
    # The owner restarts it: in-flight requests fail with 500s, and the weights take
    # minutes to load, during which every check finds nothing answering.
    failed = list(day.engine.running)
    day.engine.restart()
    assert all(r.error == "cannot schedule new futures after shutdown" for r in failed)
    day.fetcher.down = True
    during = day.run(5 * 60)
    assert Verdict.DEAD in day.verdicts and set(during) == {Decision.WAITING}
    day.fetcher.down = False
    assert day.policy.restarts == 1
    day.policy = RestartPolicy()  # /v1/models answers: the replacement judges afresh
    day.next_burst_at = day.clock.monotonic() + 30
    after = day.run(4 * 3600)
    assert Decision.RESTART not in after and day.policy.restarts == 0
