"""Admission points: ``RetryAdvisor`` (a rejection's Retry-After from the point's own
rates, the same for a router and a direct-ingress replica) and ``SlotAdmission`` (a
direct-ingress replica's gate over its slots). Virtual time, a fixed jitter; no Ray."""

from __future__ import annotations

import random

import pytest

from controlplane.clock import FakeClock
from controlplane.errors import BackpressureError
from controlplane.routing.admission import RetryAdvisor, SlotAdmission
from controlplane.routing.routing_config import RoutingConfig
from controlplane.wire import ClusterDemand


class NoJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return 1.0


def config(policy: str = "router_queue_drain_rate", max_queued: int = 2,
           retry_after_s: float | None = 3.0) -> RoutingConfig:
    return RoutingConfig(deployment="app/Model", max_ongoing_requests=2,
                         max_queued_requests=max_queued, status_code=429,
                         retry_after_s=retry_after_s, retry_after_policy=policy)


def drain_at(advisor: RetryAdvisor, rate_per_s: int, start: float, seconds: int = 4) -> None:
    """``rate_per_s`` admissions in each of ``seconds`` 1 s intervals."""
    for i in range(seconds):
        for k in range(rate_per_s):
            advisor.drain.record_assignment(start + i + k / rate_per_s)


def test_a_cold_advisor_tells_the_static_value_rounded_up_then_none():
    advisor = RetryAdvisor()
    rejected = advisor.reject(config(retry_after_s=2.5), 5, 1.0, 0, NoJitter(), 100.0)
    assert (rejected.status_code, rejected.retry_after_s) == (429, 3)
    assert rejected.headers() == {"Retry-After": "3"}
    assert "deployment app/Model is overloaded: 5 requests already queued" in str(rejected)
    assert advisor.reject(config(retry_after_s=None), 5, 1.0, 0, NoJitter(), 100.0) \
        .retry_after_s is None
    assert advisor.last_s is None


def test_a_warm_advisor_computes_from_its_own_drain_rate():
    advisor = RetryAdvisor()
    drain_at(advisor, 4, start=100.0)
    # 8 queued at 4/s, saturation 1 + 0.25 * occupancy 0: 2 s
    assert advisor.reject(config(), 8, 0.0, 0, NoJitter(), 104.0).retry_after_s == 2
    assert advisor.last_s == 2


def test_a_published_total_is_used_while_fresh_and_its_age_restarts_only_when_new():
    advisor = RetryAdvisor()
    drain_at(advisor, 4, start=100.0)
    total = ClusterDemand(queued=40, drain_per_s=4.0, arrivals_per_s=0.0, routers=2)
    advisor.heard_total(total, 104.0)
    policy = config("cluster_informed")
    # everyone's 40 queued at everyone's 4/s: 10 s
    assert advisor.reject(policy, 1, 0.0, 0, NoJitter(), 104.0).retry_after_s == 10
    advisor.heard_total(total, 108.0)  # the same total again: still heard at 104
    drain_at(advisor, 4, start=104.0, seconds=6)
    assert advisor.reject(policy, 1, 0.0, 0, NoJitter(), 110.0).retry_after_s == 1


def test_the_demand_reported_is_the_queue_and_both_rates():
    advisor = RetryAdvisor()
    drain_at(advisor, 3, start=100.0)
    for i in range(4 * 5):
        advisor.arrivals.record_assignment(100.0 + i / 5)
    demand = advisor.demand(7, 104.0)
    assert (demand.queued, demand.drain_per_s, demand.arrivals_per_s) == \
        (7, pytest.approx(3.0), pytest.approx(5.0))


class Slots:
    def __init__(self) -> None:
        self.load = 0


def gate(max_queued: int = 1, policy: str = "static") -> tuple[SlotAdmission, Slots, FakeClock]:
    slots, clock = Slots(), FakeClock(100.0)
    return (SlotAdmission(config(policy, max_queued), lambda: slots.load, clock, NoJitter()),
            slots, clock)


def test_slots_then_the_queue_take_requests_and_the_next_is_rejected_with_the_status():
    admission, slots, _ = gate(max_queued=1)
    for load in (0, 1, 2):  # two slots, one queued place
        slots.load = load
        admission.admit()
    slots.load = 3
    assert admission.full()
    with pytest.raises(BackpressureError) as rejected:
        admission.admit()
    assert (rejected.value.status_code, rejected.value.retry_after_s) == (429, 3)
    assert "1 requests already queued (max_queued_requests=1)" in str(rejected.value)


def test_an_unlimited_queue_never_rejects():
    admission, slots, _ = gate(max_queued=-1)
    slots.load = 10_000
    admission.admit()
    assert not admission.full()


def test_a_replica_computes_its_retry_after_from_what_it_admitted():
    """The same policy as a router's: the replica's own admissions are its drain rate."""
    admission, slots, clock = gate(max_queued=0, policy="router_queue_drain_rate")
    for _ in range(4):  # 2 admissions a second for 4 s: warm at 2/s
        for _ in range(2):
            slots.load = 0
            admission.admit()
            clock.advance(0.5)
    slots.load = 2 + 0  # both slots busy, nothing queued
    with pytest.raises(BackpressureError) as rejected:
        admission.admit()
    # 0 queued ahead: the computed value's floor, 1 s (a cold one would say the static 3)
    assert rejected.value.retry_after_s == 1
    assert admission.retry.last_s == 1
