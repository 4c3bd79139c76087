"""The check's shell over an in-process simulated engine: what it requests, and when."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from controlplane.clock import FakeClock
from replicas.llm_health import (BackendChecker, CheckSettings, check_all, check_proxy,
                                 server_root)
from replicas.llm_verdict import Verdict
from tests.llm_sim.engine import SimEngine
from tests.llm_sim.fake_http import SimFetcher

INTERVAL_S = 5.0


class Bench:
    def __init__(self, slots: int = 2) -> None:
        self.clock = FakeClock(start_s=0.0)
        self.engine = SimEngine("m", slots, wall=self.clock.monotonic)
        self.fetcher = SimFetcher(self.engine)
        self.settings = CheckSettings(interval_s=INTERVAL_S, max_reads=6)
        self.checker = BackendChecker("http://e:8000/v1/", self.fetcher, self.clock,
                                      self.settings)

    def sleep(self, seconds: float) -> None:
        """The standalone check's wait: time passes, the engine steps 8 times a second."""
        for _ in range(int(seconds * 8)):
            self.clock.advance(0.125)  # exact in binary: virtual times compare equal
            self.engine.step()

    def fill(self, n: int, prefill_steps: int = 0) -> None:
        for _ in range(n):
            self.engine.submit(100_000, prefill_steps, internal=True)
        self.engine.step()


def test_server_root_drops_the_api_suffix():
    assert server_root("http://h:1/v1/") == server_root("http://h:1") == "http://h:1"


def test_idle_one_read_and_one_tiny_answer():
    b = Bench()
    report = b.checker.run_until_verdict(b.sleep)
    assert (report.verdict, report.healthy, report.sent_test_request, report.reads) == (
        Verdict.IDLE, True, True, 1)
    assert b.fetcher.requests == [("GET", "/metrics"), ("POST", "/v1/completions")]


def test_busy_full_server_gets_no_test_request():
    b = Bench()
    b.fill(3)
    report = b.checker.run_until_verdict(b.sleep)
    assert (report.verdict, report.healthy, report.sent_test_request, report.reads) == (
        Verdict.BUSY, True, False, 2)
    assert (report.running, report.waiting) == (2, 1)
    assert report.steps_per_s == 8.0
    assert b.fetcher.paths("POST") == [] and b.fetcher.completions_while_full == 0


def test_long_prefill_is_busy_though_no_token_comes_out():
    b = Bench()
    b.fill(2, prefill_steps=1000)
    report = b.checker.run_until_verdict(b.sleep)
    assert report.verdict is Verdict.BUSY and report.generation_tokens_per_s == 0.0


@pytest.mark.parametrize("fault", ["stuck", "wedged"])
def test_stuck_after_two_intervals_without_a_test_request(fault):
    b = Bench()
    b.fill(3)
    b.engine.set_fault(fault)
    report = b.checker.run_until_verdict(b.sleep)
    assert (report.verdict, report.healthy, report.reads) == (Verdict.STUCK, False, 3)
    assert b.clock.monotonic() == 2 * INTERVAL_S
    assert b.fetcher.paths() == ["/metrics"] * 3


def test_restart_between_reads_is_reported_and_answered_instead_of_compared():
    b = Bench()
    b.fill(2)
    b.checker.check_once()
    b.sleep(INTERVAL_S)
    b.engine.restart()  # in-flight requests fail; the new process is idle
    step = b.checker.check_once()
    report = b.checker.report([step])
    assert (report.verdict, report.restarted, report.sent_test_request) == (
        Verdict.IDLE, True, True)


def test_no_metrics_decided_by_models_and_a_tiny_answer():
    b = Bench()
    b.engine.set_fault("no-metrics")
    report = b.checker.run_until_verdict(b.sleep)
    assert (report.verdict, report.healthy, report.sent_test_request) == (
        Verdict.NO_METRICS, True, True)
    assert b.fetcher.requests == [("GET", "/metrics"), ("GET", "/v1/models"),
                                  ("POST", "/v1/completions")]


def test_dead_backend_gets_no_test_request():
    b = Bench()
    b.fetcher.down = True
    report = b.checker.run_until_verdict(b.sleep)
    assert (report.verdict, report.healthy, report.sent_test_request) == (
        Verdict.DEAD, False, False)
    assert "Connection refused" in report.detail


def test_out_of_reads_while_requests_come_and_go_is_busy_not_stuck():
    b = Bench()
    b.settings = CheckSettings(interval_s=INTERVAL_S, max_reads=2)
    b.checker = BackendChecker("http://e:8000", b.fetcher, b.clock, b.settings)
    b.fill(2)
    b.engine.set_fault("stuck")
    report = b.checker.run_until_verdict(b.sleep)
    assert (report.verdict, report.healthy, report.reads) == (Verdict.BUSY, True, 2)
    assert "not shown stuck" in report.detail


def test_a_proxy_is_checked_through_models_only():
    b = Bench()
    b.fill(2)
    report = check_proxy("http://proxy:9000/v1", b.fetcher)
    assert (report.kind, report.verdict, report.healthy, report.reads) == (
        "proxy", Verdict.NO_METRICS, True, 0)
    assert b.fetcher.requests == [("GET", "/v1/models")]
    b.fetcher.down = True
    assert check_proxy("http://proxy:9000", b.fetcher).verdict is Verdict.DEAD


class ByHost:
    """One fetcher per host, so check_all's URLs reach different engines."""

    def __init__(self, fetchers: dict[str, SimFetcher]) -> None:
        self.fetchers = fetchers

    def get(self, url, timeout_s):
        return self.fetchers[urlparse(url).hostname].get(url, timeout_s)

    def post_json(self, url, body, timeout_s):
        return self.fetchers[urlparse(url).hostname].post_json(url, body, timeout_s)


def test_check_all_reports_in_the_order_given():
    idle, dead = Bench(), Bench()
    dead.fetcher.down = True
    fetcher = ByHost({"a": idle.fetcher, "b": dead.fetcher, "p": idle.fetcher})
    reports = check_all(["http://a:1", "http://b:1"], ["http://p:2"], fetcher, idle.clock,
                        idle.settings, idle.sleep)
    assert [(r.url, r.kind, r.verdict) for r in reports] == [
        ("http://a:1", "backend", Verdict.IDLE), ("http://b:1", "backend", Verdict.DEAD),
        ("http://p:2", "proxy", Verdict.NO_METRICS)]
    assert reports[0].to_dict()["verdict"] == "idle"


def test_a_restarted_engine_with_work_is_answered_in_a_free_slot_and_reported_busy():
    b = Bench(slots=2)
    b.checker = BackendChecker("http://e:8000/v1/", b.fetcher, b.clock,
                               CheckSettings(interval_s=INTERVAL_S, slots=2))
    b.fill(2)
    b.checker.check_once()
    b.sleep(INTERVAL_S)
    b.engine.restart()  # in-flight requests fail; one new request lands in the new process
    b.fill(1)
    step = b.checker.check_once()
    report = b.checker.report([step])
    assert (report.verdict, report.restarted, report.sent_test_request) == (
        Verdict.BUSY, True, True)
    assert b.fetcher.requests[-1] == ("POST", "/v1/completions")
