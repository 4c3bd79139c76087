"""What ``release_tests.llm_routing`` reports of a point, and the routing decision's cost."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

from release_tests.llm_load import Outcome
from release_tests.llm_workloads import workload


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _latencies(outcomes: list[Outcome]) -> dict:
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft_s * 1000 for o in ok if o.ttft_s is not None]
    return {"ttft_p50_ms": percentile(ttft, 0.5), "ttft_p99_ms": percentile(ttft, 0.99),
            "e2e_p99_ms": percentile([o.e2e_s * 1000 for o in ok], 0.99),
            "sent": len(outcomes), "failed": len(outcomes) - len(ok),
            "errors": sorted({o.error or str(o.status) for o in outcomes if not o.ok})[:5]}


def point_stats(outcomes: list[Outcome], before: dict, after: dict, seconds: float) -> dict:
    ok = [o for o in outcomes if o.ok]
    served = [after[u]["completions"] - before.get(u, {}).get("completions", 0) for u in after]
    queries = sum(after[u]["cache_queries_tokens"] - before.get(u, {}).get(
        "cache_queries_tokens", 0) for u in after)
    hits = sum(after[u]["cache_hits_tokens"] - before.get(u, {}).get("cache_hits_tokens", 0)
               for u in after)
    mean = statistics.fmean(served) if served else 0.0
    return {**_latencies(outcomes), "throughput_rps": len(ok) / seconds,
            "hit_rate": hits / queries if queries else 0.0,
            "max_mean_load": max(served) / mean if mean else 0.0}


def pooled_stats(points: list[tuple[dict, list[Outcome]]]) -> dict:
    """One policy's rounds of a point as one point: latencies over every round's requests
    pooled, throughput and hit rate the rounds' mean, max/mean the worst round's, and each
    round's TTFT p99 (``rounds_ttft_p99_ms``: what one round alone would have shown)."""
    rounds = [stats for stats, _ in points]
    return {**_latencies([o for _, outcomes in points for o in outcomes]),
            "throughput_rps": statistics.fmean(s["throughput_rps"] for s in rounds),
            "hit_rate": statistics.fmean(s["hit_rate"] for s in rounds),
            "max_mean_load": max(s["max_mean_load"] for s in rounds),
            "rounds_ttft_p99_ms": [s["ttft_p99_ms"] for s in rounds]}


def within_budget(stats: dict, budget_ms: float) -> bool:
    """Every request answered, within the end-to-end p99 budget."""
    return stats["failed"] == 0 and stats["e2e_p99_ms"] <= budget_ms


def throughput_at_budget(points: list[dict], budget_ms: float) -> tuple[float, list]:
    """A ramp's throughput where its end-to-end p99 reaches ``budget_ms``, and the two
    loads it lies between ([load] when the last point tried is within it; [] when none
    is): the straight line between the last point within the budget and the first past
    it (the ramp's points in order, the first one past it ending the ramp), read at the
    budget. Read off the steps instead (the best point within it), a ramp whose next point
    missed by 6 ms counted as its last point's throughput: 1.0 against 1.12 and 1.25 of
    capacity is a 12-25% step in the ratio. A point past it with failures adds nothing
    (the last point within it stands)."""
    last = None
    for point in points:
        if within_budget(point, budget_ms):
            last = point
            continue
        if last is None:
            return 0.0, []
        if point["failed"]:
            return last["throughput_rps"], [last["load"]]
        share = (budget_ms - last["e2e_p99_ms"]) / (point["e2e_p99_ms"] - last["e2e_p99_ms"])
        rps = last["throughput_rps"] + share * (point["throughput_rps"] - last["throughput_rps"])
        return rps, [last["load"], point["load"]]
    return (last["throughput_rps"], [last["load"]]) if last else (0.0, [])


class _Instant:
    """A transport whose probes answer at once (the decision is what is timed)."""

    async def probe_queue_len(self, replica, deadline_s):
        return 0


def decision_cost(policy_name: str, decisions: int, replicas: int = 64) -> dict:
    """The proxy's routing work for one request, in-process: its key from the body (a
    prompt policy parses the JSON and hashes the blocks) and the placement through
    ``Router.slot``, at ``replicas`` replicas, over the shared workload's bodies."""
    from controlplane.clock import SystemClock
    from controlplane.routing.policies import RoutingPolicy
    from controlplane.routing.router import Router
    from controlplane.routing.routing_config import RoutingConfig
    from controlplane.wire import ReplicaInfo

    policy = RoutingPolicy(policy_name)
    router = Router(RoutingConfig("llm/Model", 8, policy=policy), _Instant(), SystemClock(),
                    random.Random(0))
    router.update_replicas(ReplicaInfo(f"r{i}", f"a{i}", "n") for i in range(replicas))
    load = workload("shared_prefix", 1)
    bodies = []
    for _ in range(min(decisions, 500)):
        request = load.next()
        bodies.append(json.dumps(request.body).encode())
        load.answered(request, True)

    async def run() -> list[float]:
        took = []
        for i in range(decisions):
            body = bodies[i % len(bodies)]
            start = time.perf_counter()
            async with router.slot("", policy.of_http([], body)):
                took.append(time.perf_counter() - start)
            await asyncio.sleep(0)  # probes answer between decisions, untimed
        return took

    took = asyncio.run(run())
    return {"p50_ms": percentile(took, 0.5) * 1000, "p99_ms": percentile(took, 0.99) * 1000,
            "replicas": replicas, "decisions": decisions,
            "mean_body_kib": statistics.fmean(len(b) for b in bodies) / 1024}


RESAMPLES = 2000  # bootstrap resamples of a point's requests
REPEAT = "p2c_repeat"  # random prompts: p2c's point run again after every policy


def random_p99_ratios(rows: list[dict], load: float = 0.8) -> dict:
    """Random prompts at ``load``: each policy's TTFT p99 over p2c's, with a 90% bootstrap
    interval (each point's requests resampled on their own: two points' requests are not
    paired), so that a reader sees what one point's p99 can tell:
    ``{INGRESS: {POLICY: {"ratio", "interval_90"}}}``."""
    ttfts: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row["workload"] == "random" and row["load"] == load and row.get("ok") \
                and row.get("ttft_s") is not None:
            ttfts.setdefault((row["ingress"], row["policy"]), []).append(row["ttft_s"])
    out: dict = {}
    for (ingress, policy), values in sorted(ttfts.items()):
        base = ttfts.get((ingress, "p2c"))
        if policy != "p2c" and base:
            low, high = _ratio_interval(base, values)
            out.setdefault(ingress, {})[policy] = {
                "ratio": percentile(values, 0.99) / percentile(base, 0.99),
                "interval_90": [low, high]}
    return out


def _ratio_interval(base: list[float], other: list[float]) -> tuple[float, float]:
    import numpy as np

    rng = np.random.default_rng(0)

    def p99s(values: list[float]) -> "np.ndarray":
        data = np.asarray(values)
        picks = np.sort(data[rng.integers(0, len(data), size=(RESAMPLES, len(data)))], axis=1)
        return picks[:, min(len(data) - 1, int(0.99 * len(data)))]  # as ``percentile``

    low, high = np.quantile(p99s(other) / p99s(base), [0.05, 0.95])
    return float(low), float(high)


PREFIX_POLICIES = ("prefix", "prefix_kv")
AWARE = frozenset({"prefix", "kv_load", "prefix_kv"})  # the LLM-aware policies


def criteria(results: dict, ramps: dict, agree: dict, decisions: dict,
             agree_haproxy: dict | None = None, random_ratios: dict | None = None) -> list[dict]:
    """The issue's bars, each with what was measured and whether it was met."""
    out = []
    shared = results.get("shared_prefix", {})
    for ingress, policies in shared.items():
        base = policies.get("p2c", {}).get("0.8")
        best = _best(policies, "ttft_p50_ms")
        if base and best:
            cut = 1 - best[1] / base["ttft_p50_ms"]
            out.append(_bar(f"shared prefix, {ingress}, 0.8: TTFT p50 cut against p2c "
                            f"({best[0]})", ">= 50%", f"{cut:.0%}", cut >= 0.5))
        ramp = ramps.get(ingress) or {}
        if ramp.get("p2c") and any(p in ramp for p in PREFIX_POLICIES):
            name = max((p for p in PREFIX_POLICIES if p in ramp),
                       key=lambda p: ramp[p]["throughput_rps"])
            base_rps = ramp["p2c"]["throughput_rps"]
            ratio = ramp[name]["throughput_rps"] / base_rps if base_rps else float("inf")
            out.append(_bar(f"shared prefix, {ingress}: throughput within p2c's p99 at 0.8 "
                            f"({name} against p2c)", ">= 1.4x", f"{ratio:.2f}x", ratio >= 1.4))
    for ingress, policies in results.get("random", {}).items():
        out += _random_bars(ingress, policies, (random_ratios or {}).get(ingress, {}))
    loads = [s["max_mean_load"] for w in results.values() for i in w.values()
             for p in i.values() for s in p.values()]
    loads += [pair[n]["max_mean_load"] for pair in (agree, agree_haproxy or {})
              for n in ("1", "2") if n in pair]  # one proxy per node is a run of its own
    loads += [point["max_mean_load"] for by_policy in ramps.values()
              for ramp in by_policy.values() for point in ramp["points"]]
    if loads:
        out.append(_bar("max/mean requests per replica, every run", "<= 1.5",
                        f"{max(loads):.2f}", max(loads) <= 1.5))
    if decisions:
        worst = max(d["p99_ms"] for d in decisions.values())
        out.append(_bar("routing decision p99 at 64 replicas (parse + place), worst policy",
                        "<= 1 ms", f"{worst:.3f} ms", worst <= 1.0))
    for routers, pair in (("two proxies", agree), ("two nodes' HAProxies", agree_haproxy or {})):
        if "1" in pair and "2" in pair:
            drop = pair["1"]["hit_rate"] - pair["2"]["hit_rate"]
            out.append(_bar(f"cache-hit rate, {routers} against one (prefix, shared, 0.8)",
                            "within 5 points", f"{pair['1']['hit_rate']:.1%} -> "
                            f"{pair['2']['hit_rate']:.1%}", abs(drop) <= 0.05))
    return out


def _random_bars(ingress: str, policies: dict, ratios: dict) -> list[dict]:
    """The worst policy's TTFT p99 against p2c's at 0.8: every policy (round robin, the
    baseline, too), and the LLM-aware ones alone; judged on the point estimate (a run in
    rounds: the pooled p99s), with its bootstrap interval where ``ratios`` has it and the
    ratio in each round."""
    base = policies.get("p2c", {}).get("0.8")
    if not base:
        return []
    out = []
    for which, names in (("policy", set(policies) - {"p2c"}), ("LLM-aware policy", AWARE)):
        p99s = [(p, policies[p]["0.8"]["ttft_p99_ms"]) for p in sorted(names)
                if "0.8" in policies.get(p, {})]
        if p99s:
            name, worst = max(p99s, key=lambda x: x[1])
            worse = worst / base["ttft_p99_ms"] - 1
            measured = f"{worse:+.0%}"
            if name in ratios:
                low, high = ratios[name]["interval_90"]
                measured += f" (90% interval {low - 1:+.0%} to {high - 1:+.0%})"
            if REPEAT in ratios:
                measured += f"; p2c run again: {ratios[REPEAT]['ratio'] - 1:+.0%}"
            measured += _by_round(policies[name]["0.8"], base)
            out.append(_bar(f"random, {ingress}, 0.8: the worst {which}'s TTFT p99 against "
                            f"p2c ({name})", "<= +5%", measured, worse <= 0.05))
    return out


def _by_round(point: dict, base: dict) -> str:
    """A run in rounds: the policy's p99 over p2c's in each round (the same arrivals): a
    gap that every round shows is the policy's, one that flips sign is noise."""
    mine, theirs = point.get("rounds_ttft_p99_ms") or [], base.get("rounds_ttft_p99_ms") or []
    if len(mine) < 2 or len(mine) != len(theirs):
        return ""
    return "; by round: " + ", ".join(f"{m / t - 1:+.0%}" for m, t in zip(mine, theirs))


def _best(policies: dict, key: str) -> tuple[str, float] | None:
    found = [(p, policies[p]["0.8"][key]) for p in PREFIX_POLICIES
             if "0.8" in policies.get(p, {})]
    return min(found, key=lambda x: x[1]) if found else None


def _bar(what: str, goal: str, measured: str, met: bool) -> dict:
    return {"criterion": what, "goal": goal, "measured": measured, "met": met}
