"""The restart policy, and seed 001's day replayed under a fake clock.

The day: a GB10 server making about 8 steps a second, a batch job that fills every slot
with bursts of 2-4 long requests for minutes at a time, long prompts read for two minutes
without an output token, and JIT compiles that stall the engine for 30-70 s. The old
watchdog restarted this server eight times; the check plus the policy must restart it zero
times, without a test request to a full server. A stuck engine must be restarted after
exactly two intervals, once, whatever its restart then makes clients see.

The day itself (``Day``, its constants) lives in ``release_tests/llm_day.py``, whose command
prints the figures MEASURED.md publishes; the test asserts those exact figures.
"""

from __future__ import annotations

import pytest

from release_tests.llm_day import INTERVAL_S, SEED, SLOTS, Day, figures, seed_day
from replicas.llm_restart import Decision, RestartPolicy
from replicas.llm_verdict import Verdict


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


# ---- the day (release_tests/llm_day.py replays it and publishes these figures) -----------------
# What ``python -m release_tests.llm_day`` prints for seed 22 at the production interval, and
# MEASURED.md publishes: a change that moves one of them must update both.
PUBLISHED_DAY = {"interval_s": 40.0, "checks": 2160, "full_slot_checks": 754, "busy": 875,
                 "idle": 1203, "read_again": 82, "stuck": 0, "dead": 0, "no_metrics": 0,
                 "test_requests_while_busy": 0, "test_requests_while_full": 0, "restarts": 0,
                 "token_based_stucks": 37, "stuck_engine_restart_after_s": 80.0}


def test_a_healthy_server_under_the_seed_day_is_never_restarted():
    day = seed_day(SEED, hours=24, interval_s=INTERVAL_S)  # the command's own day
    assert Decision.RESTART.value not in {r["decision"] for r in day.log}
    assert day.restarts == 0 and day.policy.restarts == 0
    assert day.fetcher.completions_while_full == 0    # no test request took a slot...
    assert day.fetcher.completions_while_busy == 0    # ...or waited behind one
    # The day was the hard one: slots full at 754 checks (a real request would have queued),
    # engine stalls, and long prompts a token-counting check would have called stuck.
    published = figures(day, hours=24)
    assert {k: published[k] for k in PUBLISHED_DAY} == PUBLISHED_DAY
    assert published["stalls"] > 0 and sum(published["per_hour"]["checks"]) == 2160


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
