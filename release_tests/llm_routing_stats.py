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


def point_stats(outcomes: list[Outcome], before: dict, after: dict, seconds: float) -> dict:
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft_s * 1000 for o in ok if o.ttft_s is not None]
    served = [after[u]["completions"] - before.get(u, {}).get("completions", 0) for u in after]
    queries = sum(after[u]["cache_queries_tokens"] - before.get(u, {}).get(
        "cache_queries_tokens", 0) for u in after)
    hits = sum(after[u]["cache_hits_tokens"] - before.get(u, {}).get("cache_hits_tokens", 0)
               for u in after)
    mean = statistics.fmean(served) if served else 0.0
    return {"ttft_p50_ms": percentile(ttft, 0.5), "ttft_p99_ms": percentile(ttft, 0.99),
            "e2e_p99_ms": percentile([o.e2e_s * 1000 for o in ok], 0.99),
            "throughput_rps": len(ok) / seconds, "hit_rate": hits / queries if queries else 0.0,
            "max_mean_load": max(served) / mean if mean else 0.0,
            "sent": len(outcomes), "failed": len(outcomes) - len(ok),
            "errors": sorted({o.error or str(o.status) for o in outcomes if not o.ok})[:5]}


def within_budget(stats: dict, budget_ms: float) -> bool:
    """Every request answered, within the end-to-end p99 budget."""
    return stats["failed"] == 0 and stats["e2e_p99_ms"] <= budget_ms


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
