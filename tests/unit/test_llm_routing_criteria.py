"""release_tests.llm_routing's bars computed from a run's numbers (pure)."""

from __future__ import annotations

import random as stdlib_random

from release_tests.llm_routing_stats import REPEAT, criteria, random_p99_ratios


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
    one_proxy = {"1": point(500, 1.53), "2": point(500, 1.2)}  # the agreement's own run
    bars = {b["criterion"]: b for b in criteria({"shared_prefix": shared}, ramps, one_proxy,
                                                {})}
    assert bars["max/mean requests per replica, every run"]["measured"] == "1.53"


def rows(ingress: str, policy: str, ttfts: list[float], load: float = 0.8) -> list[dict]:
    return [{"workload": "random", "ingress": ingress, "policy": policy, "load": load,
             "ok": True, "ttft_s": t} for t in ttfts]


def test_the_random_bar_shows_what_one_points_p99_can_tell():
    draw = stdlib_random.Random(1)
    base = [draw.expovariate(1.0) for _ in range(800)]
    same = [draw.expovariate(1.0) for _ in range(800)]  # the same distribution, drawn anew
    twice = [2 * t for t in base]
    ratios = random_p99_ratios(rows("proxy", "p2c", base) + rows("proxy", "kv_load", same)
                               + rows("proxy", "prefix", twice)
                               + rows("proxy", REPEAT, [1.1 * t for t in base])
                               + rows("proxy", "prefix", [99.0], load=0.5)  # not 0.8: out
                               + [{**r, "ok": False} for r in rows("proxy", "prefix", [99.0])])
    low, high = ratios["proxy"]["kv_load"]["interval_90"]
    assert low < 1.0 < high and high - low > 0.1  # 8 requests over the p99: wide
    assert ratios["proxy"]["prefix"]["ratio"] == 2.0
    assert ratios["proxy"]["prefix"]["interval_90"][0] > 1.5  # a real doubling stands out
    assert "p2c" not in ratios["proxy"]

    random_results = {"proxy": {
        "p2c": {"0.8": point(1000)}, "kv_load": {"0.8": point(1000 * ratios["proxy"][
            "kv_load"]["ratio"])}}}
    bars = criteria({"random": random_results}, {}, {}, {}, random_ratios=ratios)
    aware = next(b for b in bars if "LLM-aware" in b["criterion"])
    assert f"(90% interval {low - 1:+.0%} to {high - 1:+.0%}); p2c run again: +10%" in \
        aware["measured"]
    assert not any(REPEAT in b["criterion"] for b in bars)  # p2c's second run is not judged


def test_shared_prefix_points_warm_up_until_their_sessions_settle():
    from types import SimpleNamespace

    from release_tests.llm_routing import warmup_s
    from release_tests.report_llm import _warmups

    args = SimpleNamespace(warmup_s=5.0, session_warmup_s=30.0)
    assert (warmup_s(args, "shared_prefix"), warmup_s(args, "random")) == (30.0, 5.0)
    assert "30.0 s for shared prefixes" in _warmups(vars(args))
    assert _warmups({"warmup_s": 5.0}) == "5.0 s warm-up"  # a run recorded before


def test_the_session_mix_settles_within_the_shared_warm_up():
    """Why 30 s: in the first 10 s nearly every chat is a first turn (the mean prompt
    lighter by a quarter); from 30 s on, 10 s windows are within 10% of each other."""
    import heapq

    from release_tests.llm_workloads import workload

    now = [0.0]
    load = workload("shared_prefix", 80, 4.0, clock=lambda: now[0])
    rng, pending, windows = stdlib_random.Random(1), [], {}
    while now[0] < 90:
        now[0] += rng.expovariate(35.0)
        while pending and pending[0][0] <= now[0]:
            load.answered(heapq.heappop(pending)[2], True)
        request = load.next()
        windows.setdefault(int(now[0] // 10), []).append(request.prompt_tokens)
        heapq.heappush(pending, (now[0] + 0.8, id(request), request))
    mean = {w: sum(v) / len(v) for w, v in windows.items() if w < 9}
    settled = [mean[w] for w in range(3, 9)]
    assert mean[0] < 0.8 * min(settled)
    assert max(settled) < 1.1 * min(settled)


def outcome(ttft_s: float, ok: bool = True):
    from release_tests.llm_load import Outcome

    return Outcome(sent_at=0.0, ttft_s=ttft_s, e2e_s=2 * ttft_s, ok=ok,
                   status=200 if ok else 502, prompt_tokens=100)


def test_a_policys_rounds_pool_their_requests():
    from release_tests.llm_routing_stats import pooled_stats

    one = [outcome(t / 100) for t in range(1, 101)]  # 10 ms .. 1 s
    two = [outcome(t / 100 + 1) for t in range(1, 101)] + [outcome(9.0, ok=False)]
    stats = pooled_stats([
        ({"ttft_p99_ms": 1000.0, "throughput_rps": 10.0, "hit_rate": 0.2,
          "max_mean_load": 1.3}, one),
        ({"ttft_p99_ms": 2000.0, "throughput_rps": 12.0, "hit_rate": 0.4,
          "max_mean_load": 1.1}, two)])
    assert stats["ttft_p99_ms"] == 1990.0  # the pool's: round two's slowest
    assert stats["ttft_p50_ms"] == 1010.0  # not either round's
    assert (stats["sent"], stats["failed"]) == (201, 1)
    assert stats["throughput_rps"] == 11.0 and abs(stats["hit_rate"] - 0.3) < 1e-9
    assert stats["max_mean_load"] == 1.3  # the worst round: the load bar is per run
    assert stats["rounds_ttft_p99_ms"] == [1000.0, 2000.0]


def test_random_rounds_run_every_policy_in_turn_on_each_rounds_arrivals(monkeypatch, capsys):
    from types import SimpleNamespace

    from release_tests import llm_routing

    ran = []

    class Fleet:
        def set_policy(self, policy):
            self.policy = policy

    def run_point(fleet, name, rate, args, seed):
        ran.append((fleet.policy, seed, name, rate))
        ttft = {"p2c": 1.0, "prefix": 1.25, "kv_load": 0.75}[fleet.policy] * (1 + seed // 1000)
        return ({"ttft_p99_ms": ttft * 1000, "ttft_p50_ms": 0.0, "e2e_p99_ms": 0.0,
                 "throughput_rps": 1.0, "hit_rate": 0.0, "max_mean_load": 1.0,
                 "failed": 0}, [outcome(ttft)])

    monkeypatch.setattr(llm_routing, "run_point", run_point)
    args = SimpleNamespace(policies=["p2c", "prefix", "kv_load"], random_rounds=3)
    results, rows = {}, []
    llm_routing.random_rounds(Fleet(), "proxy", 10.0, args, results, rows)
    assert [p for p, *_ in ran] == ["p2c", "prefix", "kv_load", "prefix", "kv_load", "p2c",
                                    "kv_load", "p2c", "prefix"]
    assert [s for _, s, *_ in ran] == [80] * 3 + [1080] * 3 + [2080] * 3  # a round's arrivals
    assert {(name, rate) for *_, name, rate in ran} == {("random", 8.0)}
    prefix = results["random"]["proxy"]["prefix"]["0.8"]
    assert prefix["rounds_ttft_p99_ms"] == [1250.0, 2500.0, 3750.0]
    assert [r["round"] for r in rows if r["policy"] == "prefix"] == [1, 2, 3]
    ratios = random_p99_ratios(rows)
    assert ratios["proxy"]["prefix"]["ratio"] == 1.25  # over the pooled p2c's


def test_the_random_bar_shows_the_ratio_in_each_round():
    base = {**point(1000), "rounds_ttft_p99_ms": [900.0, 1000.0, 1100.0]}
    prefix = {**point(1040), "rounds_ttft_p99_ms": [990.0, 950.0, 1210.0]}
    bars = criteria({"random": {"proxy": {"p2c": {"0.8": base},
                                          "prefix": {"0.8": prefix}}}}, {}, {}, {})
    aware = next(b for b in bars if "LLM-aware" in b["criterion"])
    assert aware["measured"] == "+4%; by round: +10%, -5%, +10%"
    assert aware["met"]


def ramp_point(load: float, e2e_p99: float, rps: float, failed: int = 0) -> dict:
    return {"load": load, "e2e_p99_ms": e2e_p99, "throughput_rps": rps, "failed": failed}


def test_throughput_at_the_budget_lies_on_the_line_between_the_points_around_it():
    from release_tests.llm_routing_stats import throughput_at_budget

    points = [ramp_point(0.8, 1000, 18.0), ramp_point(1.0, 1500, 22.0),
              ramp_point(1.12, 3500, 26.0)]
    assert throughput_at_budget(points, 2500) == (24.0, [1.0, 1.12])  # halfway in p99
    assert throughput_at_budget(points[:2], 2500) == (22.0, [1.0])  # the last tried within
    assert throughput_at_budget(points, 900) == (0.0, [])  # none within
    # a point past it that failed requests: the last one within stands, no line to it
    failing = points[:2] + [ramp_point(1.12, 2000, 26.0, failed=3)]
    assert throughput_at_budget(failing, 2500) == (22.0, [1.0])
    # just past the budget: barely over the last point's, not a step to it
    rps, _ = throughput_at_budget([ramp_point(0.8, 2578, 18.0), ramp_point(1.0, 2584, 22.55)],
                                  2578)
    assert rps == 18.0


def test_the_ramp_pools_a_load_the_grid_ran_and_reads_at_the_budget(monkeypatch, capsys):
    from types import SimpleNamespace

    from release_tests import llm_routing

    class Fleet:
        def set_policy(self, policy):
            self.policy = policy

    seeds = []

    def run_point(fleet, name, rate, args, seed):
        seeds.append(seed)
        e2e = {1.0: 1.8, 1.12: 3.0}[round(rate / 10, 2)]
        return ({"ttft_p99_ms": 0.0, "ttft_p50_ms": 0.0, "e2e_p99_ms": e2e * 1000,
                 "throughput_rps": rate, "hit_rate": 0.0, "max_mean_load": 1.0,
                 "failed": 0}, [outcome(e2e / 2)])

    monkeypatch.setattr(llm_routing, "run_point", run_point)
    base = {"ttft_p99_ms": 0.0, "ttft_p50_ms": 0.0, "e2e_p99_ms": 2000.0,
            "throughput_rps": 8.0, "hit_rate": 0.0, "max_mean_load": 1.0, "failed": 0}
    results = {"shared_prefix": {"proxy": {"p2c": {"0.8": base}}}}
    grid_run = ({**base, "e2e_p99_ms": 2200.0, "throughput_rps": 10.0}, [outcome(1.1)] * 99)
    args = SimpleNamespace(ramp=True, ramp_loads=[1.0, 1.12])
    out = llm_routing.ramp(Fleet(), "proxy", args, results, {("shared_prefix", "proxy"): 10.0},
                           {("p2c", 1.0): grid_run})["p2c"]
    assert seeds == [100 + llm_routing.RAMP_SEED]  # pooled with the grid's: past the budget
    assert out["points"][1]["e2e_p99_ms"] == 2200.0 and out["points"][1]["runs"] == 2
    assert out["between_loads"] == [0.8, 1.0]
    assert out["throughput_rps"] == 8.0  # p2c's own budget: its 0.8 point, where p99 rises
