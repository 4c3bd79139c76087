"""release_tests.llm_routing's bars computed from a run's numbers (pure)."""

from __future__ import annotations

from release_tests.llm_routing_stats import criteria


def point(p99: float, max_mean: float = 1.1) -> dict:
    return {"ttft_p50_ms": p99 / 2, "ttft_p99_ms": p99, "max_mean_load": max_mean,
            "hit_rate": 0.0}


def test_the_random_bar_judges_every_policy_and_the_llm_aware_ones_alone():
    random = {"haproxy": {"p2c": {"0.8": point(1000)}, "round_robin": {"0.8": point(1600)},
                          "prefix": {"0.8": point(1040)}, "kv_load": {"0.8": point(1030)}}}
    bars = {b["criterion"]: b for b in criteria({"random": random}, {}, {}, {})}
    every = bars["random, haproxy, 0.8: the worst policy's TTFT p99 against p2c (round_robin)"]
    aware = bars["random, haproxy, 0.8: the worst LLM-aware policy's TTFT p99 against p2c "
                 "(prefix)"]
    assert (every["measured"], every["met"]) == ("+60%", False)
    assert (aware["measured"], aware["met"]) == ("+4%", True)


def test_the_load_bar_counts_the_ramps_points_too():
    shared = {"proxy": {"p2c": {"0.8": point(1000)}, "prefix": {"0.8": point(500, 1.2)}}}
    ramps = {"proxy": {"prefix": {"budget_e2e_p99_ms": 1000, "throughput_rps": 1.0,
                                  "points": [point(500, 1.2), point(900, 1.51)]}}}
    bars = {b["criterion"]: b for b in criteria({"shared_prefix": shared}, ramps, {}, {})}
    assert bars["max/mean requests per replica, every run"]["measured"] == "1.51"
