"""Seed 001's cases against real simulator processes over HTTP on 127.0.0.1.

Every case asserts, from the simulator's own counters, that no completion reached it while
its slots were full (and, for the checker, while any request was present at all). The
checker's interval passes on a fake clock and the simulators step only when told, so each
case knows exactly how many engine steps happened between two reads.
"""

from __future__ import annotations

import pytest

from controlplane.clock import FakeClock
from replicas.llm_health import BackendChecker, CheckSettings, HealthReport, check_proxy
from replicas.llm_http import UrllibFetcher
from replicas.llm_verdict import Verdict
from tests.llm.conftest import (INTERVAL_S, STEPS_PER_INTERVAL, STEPS_PER_S, Interval, Sim,
                                sim_request)

SETTINGS = CheckSettings(interval_s=INTERVAL_S, answer_timeout_s=2.0)


def checker(sim: Sim) -> BackendChecker:
    return BackendChecker(sim.url, UrllibFetcher(), FakeClock(start_s=0.0), SETTINGS)


def check(sim: Sim) -> tuple[HealthReport, Interval]:
    """The standalone check; each interval asks the simulator for STEPS_PER_INTERVAL steps."""
    clock = FakeClock(start_s=0.0)
    interval = Interval(sim.url, clock)
    report = BackendChecker(sim.url, UrllibFetcher(), clock, SETTINGS).run_until_verdict(
        interval)
    return report, interval


def assert_no_test_request_while_busy(sim) -> None:
    stats = sim.stats()
    assert stats["completions_while_full"] == 0 and stats["completions_while_busy"] == 0


def test_idle_server_answers_one_tiny_request(fresh_sim):
    report, interval = check(fresh_sim)
    assert (report.verdict, report.healthy, report.sent_test_request, report.reads) == (
        Verdict.IDLE, True, True, 1)
    assert interval.stepped == []  # one read: no interval waited
    assert fresh_sim.stats()["completions"] == 1
    assert_no_test_request_while_busy(fresh_sim)


def test_busy_server_with_every_slot_taken_is_healthy_without_a_test_request(fresh_sim):
    fresh_sim.load(3)  # 2 slots: both running, one waiting
    report, interval = check(fresh_sim)
    assert (report.verdict, report.healthy, report.sent_test_request) == (
        Verdict.BUSY, True, False)
    assert (report.running, report.waiting) == (2, 1)
    assert interval.stepped == [STEPS_PER_INTERVAL] and report.steps_per_s == STEPS_PER_S
    assert fresh_sim.stats()["completions"] == 0


def test_long_prefill_is_busy_while_no_token_comes_out(fresh_sim):
    # Longer than all the reads of a check (six at most) take.
    fresh_sim.load(2, prefill_steps=10 * STEPS_PER_INTERVAL)
    report, interval = check(fresh_sim)
    assert (report.verdict, report.healthy, report.generation_tokens_per_s) == (
        Verdict.BUSY, True, 0.0)
    assert interval.stepped == [STEPS_PER_INTERVAL] and report.steps_per_s == STEPS_PER_S
    assert fresh_sim.stats()["completions"] == 0


@pytest.mark.parametrize("fault", ["stuck", "wedged"])
def test_stuck_server_is_stuck_after_two_intervals_without_a_test_request(fresh_sim, fault):
    fresh_sim.load(3)
    fresh_sim.fault(fault)
    report, interval = check(fresh_sim)
    assert (report.verdict, report.healthy, report.reads, report.sent_test_request) == (
        Verdict.STUCK, False, 3, False)
    # Asked to step in each of the two intervals, it took none: stuck across both.
    assert interval.stepped == [0, 0] and interval.clock.monotonic() == 2 * INTERVAL_S
    assert fresh_sim.stats()["completions"] == 0


def test_restart_between_reads_asks_the_new_process_instead_of_comparing(fresh_sim):
    backend = checker(fresh_sim)
    fresh_sim.load(2)
    backend.check_once()
    fresh_sim.fault("restart")
    report = backend.report([backend.check_once()])
    assert (report.verdict, report.restarted, report.sent_test_request) == (
        Verdict.IDLE, True, True)
    assert_no_test_request_while_busy(fresh_sim)


def test_restart_without_a_start_time_is_seen_by_counters_going_down(make_sim):
    sim = make_sim("--no-start-time", "--slots", "2")
    backend = checker(sim)
    sim.load(2)
    assert sim.step(10) == 10
    backend.check_once()
    sim.fault("restart")
    # The new process takes one step (loading admits) in which its two requests finish:
    # fewer steps (1 < 11) and tokens (2 < 22) than the old process had, and it is idle.
    new = sim.load(2, max_tokens=1)
    assert (new["steps"], new["generation_tokens"], new["running"]) == (1, 2, 0)
    report = backend.report([backend.check_once()])
    assert (report.verdict, report.restarted) == (Verdict.IDLE, True)
    assert_no_test_request_while_busy(sim)


def test_server_without_metrics_is_judged_by_models_and_a_tiny_answer(fresh_sim):
    fresh_sim.fault("no-metrics")
    report, _ = check(fresh_sim)
    assert (report.verdict, report.healthy, report.sent_test_request) == (
        Verdict.NO_METRICS, True, True)
    assert fresh_sim.stats()["models_reads"] == 1


def test_dead_backend(make_sim):
    sim = make_sim("--slots", "2")
    sim.fault("dead")
    sim.wait_exit()
    report, _ = check(sim)
    assert (report.verdict, report.healthy, report.sent_test_request) == (
        Verdict.DEAD, False, False)


def test_proxy_is_checked_through_models_only_and_backends_directly(make_sim, make_sims):
    busy, idle = make_sims(("--slots", "2"), ("--slots", "2"))
    proxy = make_sim("--backend", busy.url, "--backend", idle.url, module="tests.llm_sim.proxy")
    busy.load(2)
    report = check_proxy(proxy.url, UrllibFetcher(), SETTINGS)
    assert (report.kind, report.verdict, report.healthy, report.sent_test_request) == (
        "proxy", Verdict.NO_METRICS, True, False)
    assert [check(b)[0].verdict for b in (busy, idle)] == [Verdict.BUSY, Verdict.IDLE]
    # Only /v1/models ever went through the proxy (the fixture's readiness wait included).
    assert set(sim_request(proxy.url + "/proxy/stats")["paths"]) == {"/v1/models"}
    assert busy.stats()["completions"] == 0
