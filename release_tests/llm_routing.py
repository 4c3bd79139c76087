"""LLM-aware routing against power of two choices, on simulated GB10 engines.

``python -m release_tests.llm_routing [--quick] [--smoke] [--replicas 8] [--speedup 8]``
starts an embedded Ray and a fleetplane instance serving ``VLLMServer`` replicas whose
engine is the simulator in token mode (``tests/llm_sim``: a prefix cache of
``--cache-blocks`` 16-token blocks, LRU; prompts read at 73 tokens a step; 4 sequences;
``prefix_cache.Calibration``: vLLM's DGX Spark guide, Nemotron-3-Super-120B-A12B-NVFP4),
its clock ``--speedup`` times GB10's so that a run takes minutes (latencies below are the
sped-up ones; divide rates, multiply times by the speedup for GB10's). Then, for each
ingress (the proxy, two per node as by default; HAProxy) and workload
(``llm_workloads``: ``shared_prefix``, ``random``):

1. capacity: the requests per second power of two choices completes with every slot busy
   and as many requests waiting (a closed loop of replicas x slots x 2 clients);
2. for each policy (p2c, round_robin, prefix, kv_load, prefix_kv), set live by a redeploy
   of ``request_router_config``, and each load (0.5, 0.8, 1.0 x that capacity), Poisson
   arrivals for ``--seconds`` (random prompts: ``--random-seconds``, 40) after a warm-up
   (engines reset, caches empty, before each; shared prefixes: ``--session-warmup-s``,
   30 s, their chat sessions' steady mix): TTFT p50/p99, end-to-end p99, throughput, the
   engines' prefix-cache hit rate (``vllm:prefix_cache_hits`` / ``_queries``), max/mean
   requests per replica. Random prompts at 0.8 (their TTFT p99 is a bar) run in
   ``--random-rounds`` (3) rounds of every policy in turn, each policy's rounds pooled
   (``random_rounds``), and each policy's TTFT p99 against p2c's comes with a 90%
   bootstrap interval (``random_p99_vs_p2c``) and its ratio in each round (a gap every
   round shows is the policy's; with one round, p2c's point runs once more after every
   policy instead, ``p2c_repeat``: what one run's p99 moves by);
3. throughput at equal p99 (shared prefix): p2c's end-to-end p99 at 0.8 is the budget;
   each of p2c, prefix and prefix_kv is driven at rising loads until its p99 passes it;
   its throughput where its p99 reaches the budget, on the line between the last load
   within it and the first past it (a load the grid ran too pooled with the grid's).

Then two proxies against one (prefix, shared prefix, 0.8: the routers of two proxies
place alike, or the hit rate falls), two nodes' HAProxies against one (the same: their
stick tables are one through HAProxy's peers; a 2-node ``fleetplane start-local-cluster``,
each request to either node at random), and the routing decision's cost in-process (parse
and place, 64 replicas, the workload's bodies). ``--quick``: the 0.8 load only. ``--smoke``:
2 replicas, the proxy, the shared workload, p2c and prefix, seconds. Records the summary
with ``release_tests.results.record``; the last line is the JSON the issue asks for:
``{WORKLOAD: {INGRESS: {POLICY: {LOAD: {...}}}}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

from controlplane.routing.prefix_affinity import DEFAULT_BALANCE_FACTOR
from release_tests.llm_fleet import SimFleet
from release_tests.llm_load import closed_loop, open_loop
from release_tests.llm_routing_stats import (REPEAT, criteria, decision_cost, point_stats,
                                             pooled_stats, random_p99_ratios,
                                             throughput_at_budget, within_budget)
from release_tests.llm_workloads import WORKLOADS, workload
from release_tests.results import parse_args, record
from tests.llm_sim.prefix_cache import GB10

POLICIES = ("p2c", "round_robin", "prefix", "kv_load", "prefix_kv")
LOADS = (0.5, 0.8, 1.0)
RAMP = (1.0, 1.12, 1.25, 1.4, 1.6, 2.0)  # 1.12 = 1.4 x 0.8: the bar against p2c at 0.8
RAMP_SEED = 1000  # the ramp's arrivals: apart from the grid's at the same load
QUICK = {"seconds": 10.0, "random_seconds": 30.0, "random_rounds": 1, "warmup_s": 4.0,
         "session_warmup_s": 15.0,
         "capacity_s": 10.0,
         "ramp_loads": "1.12,1.25,1.4"}
SMOKE = {"replicas": 2, "ingresses": "proxy", "workloads": "shared_prefix",
         "policies": "p2c,prefix", "loads": "0.8", "seconds": 4.0, "warmup_s": 2.0,
         "session_warmup_s": 2.0,
         "capacity_s": 4.0, "ramp": False, "agreement": False, "decisions": 200}


def warmup_s(args, name: str) -> float:
    """The warm-up before a point of workload ``name``: the shared prefixes' chat sessions
    take ``--session-warmup-s`` to reach their steady mix of turns (a session lives up to
    8 turns of a reply and 10-30 GB10 seconds of reading: about 50 s at speedup 4; in the
    first 10 s nearly every chat is a first turn, the mean prompt 2,500 tokens where it
    settles near 3,500 from 30 s on); random prompts have no sessions."""
    return args.warmup_s if name == "random" else args.session_warmup_s


def run_point(fleet: SimFleet, name: str, rate: float, args, seed: int) -> tuple[dict, list]:
    """One open-loop point: engines reset, a warm-up, then ``args.seconds`` measured
    (``args.random_seconds`` for the random workload). The routers' prefix index is
    emptied by a policy change, not here: one policy's next point draws other prompts."""
    seconds = args.random_seconds if name == "random" else args.seconds
    fleet.reset_engines()
    load = workload(name, seed, args.speedup)
    asyncio.run(open_loop(fleet.base_urls, load, rate, warmup_s(args, name), seed))
    before = fleet.engine_stats()
    outcomes = asyncio.run(open_loop(fleet.base_urls, load, rate, seconds, seed + 1))
    return point_stats(outcomes, before, fleet.engine_stats(), seconds), outcomes


def capacity(fleet: SimFleet, name: str, args) -> float:
    fleet.set_policy("p2c")
    fleet.reset_engines()
    load = workload(name, 0, args.speedup)
    clients = args.replicas * GB10.slots * 2  # every slot busy and as many waiting
    asyncio.run(closed_loop(fleet.base_url, load, clients, warmup_s(args, name)))
    outcomes = asyncio.run(closed_loop(fleet.base_url, load, clients, args.capacity_s))
    return sum(o.ok for o in outcomes) / args.capacity_s


def grid(fleet: SimFleet, ingress: str, args, results: dict, rows: list, capacities: dict,
         runs: dict):
    """Every point of the grid; ``runs`` keeps the shared prefix's (its stats and requests,
    by policy and load) for the ramp to pool with."""
    for name in args.workloads:
        cap = capacities[(name, ingress)] = capacity(fleet, name, args)
        print(f"[{ingress}] {name}: p2c capacity {cap:.2f} req/s", flush=True)
        in_rounds = name == "random" and args.random_rounds > 1 and 0.8 in args.loads
        for policy in args.policies:
            fleet.set_policy(policy)
            for load in args.loads:
                if in_rounds and load == 0.8:
                    continue  # below, every policy in turn
                stats, outcomes = run_point(fleet, name, cap * load, args, seed=int(load * 100))
                _keep(results, rows, (name, ingress, policy, load), stats, outcomes)
                if name == "shared_prefix":
                    runs[(policy, load)] = (stats, outcomes)
        if in_rounds:
            random_rounds(fleet, ingress, cap, args, results, rows)
        elif name == "random":
            repeat_p2c(fleet, ingress, cap, args, rows)


def _keep(results: dict, rows: list, where: tuple, stats: dict, outcomes: list) -> None:
    name, ingress, policy, load = where
    results.setdefault(name, {}).setdefault(ingress, {}).setdefault(policy, {})[
        str(load)] = stats
    rows += [{"workload": name, "ingress": ingress, "policy": policy, "load": load,
              "round": None, **vars(o)} for o in outcomes]  # every row names the columns
    print(f"[{ingress}] {name} {policy} x{load}: {_line(stats)}", flush=True)


def random_rounds(fleet: SimFleet, ingress: str, cap: float, args, results: dict,
                  rows: list) -> None:
    """Random prompts at 0.8, the bar's point: ``--random-rounds`` rounds, each running
    every policy on the round's arrivals (drawn anew each round), the policies in a
    rotated order each round (a drift over the run falls on each alike); each policy's
    point is its rounds pooled (``pooled_stats``): one round's p99 is the few slowest
    requests of a minute, and two runs of p2c differed by up to 20%. A policy change
    empties the routers' prefix index (``Router.update_config``): before 4981e74 it did
    not, and prefix_kv, run after prefix on the same round's prompts, read each one as
    sent before (to its ring replica, load aside): +14% and +17% over p2c in two rounds
    where prefix, placing alike, was -13% and -6%."""
    points: dict[str, list] = {policy: [] for policy in args.policies}
    for k in range(args.random_rounds):
        turn = args.policies[k % len(args.policies):] + args.policies[:k % len(args.policies)]
        for policy in turn:
            fleet.set_policy(policy)
            stats, outcomes = run_point(fleet, "random", cap * 0.8, args, seed=80 + 1000 * k)
            points[policy].append((stats, outcomes))
            print(f"[{ingress}] random {policy} x0.8 round {k + 1}: {_line(stats)}",
                  flush=True)
    for policy, done in points.items():
        _keep(results, rows, ("random", ingress, policy, 0.8), pooled_stats(done), [])
        rows += [{"workload": "random", "ingress": ingress, "policy": policy, "load": 0.8,
                  "round": k + 1, **vars(o)} for k, (_, outcomes) in enumerate(done)
                 for o in outcomes]


def repeat_p2c(fleet: SimFleet, ingress: str, cap: float, args, rows: list) -> None:
    """Random prompts: p2c at 0.8 once more, after every policy (``p2c_repeat``, the same
    arrivals): what one point's p99 moves by between two runs of one policy, and any
    drift over the grid, beside the policies' differences (the random bars show it)."""
    if "p2c" not in args.policies or 0.8 not in args.loads:
        return
    fleet.set_policy("p2c")
    stats, outcomes = run_point(fleet, "random", cap * 0.8, args, seed=80)
    rows += [{"workload": "random", "ingress": ingress, "policy": REPEAT, "load": 0.8,
              "round": None, **vars(o)} for o in outcomes]
    print(f"[{ingress}] random p2c again x0.8: {_line(stats)}", flush=True)


def ramp(fleet: SimFleet, ingress: str, args, results: dict, capacities: dict,
         runs: dict) -> dict:
    """Throughput within p2c's p99 at 0.8, per policy (shared prefix): loads rising until
    the end-to-end p99 passes the budget, read where it reaches it
    (``throughput_at_budget``). A load the grid ran too (1.0) is run once more on fresh
    arrivals (seed + ``RAMP_SEED``, the same for every policy) and pooled with the grid's
    (``pooled_stats``): one 20 s point's p99 moved by 20% between two runs (p2c at 1.0 at
    10d04a5: 3,203 ms in the grid, 2,584 in the ramp, against a budget of 2,578)."""
    reference = results.get("shared_prefix", {}).get(ingress, {}).get("p2c", {}).get("0.8")
    if reference is None or not args.ramp:  # (a run without shared prefix or p2c has none)
        return {}
    budget_ms, cap, out = reference["e2e_p99_ms"], capacities[("shared_prefix", ingress)], {}
    ran = results["shared_prefix"][ingress]
    for policy in [p for p in ("p2c", "prefix", "prefix_kv") if "0.8" in ran.get(p, {})]:
        fleet.set_policy(policy)
        points = [{**ran[policy]["0.8"], "load": 0.8}]
        for load in args.ramp_loads:
            stats, outcomes = run_point(fleet, "shared_prefix", cap * load, args,
                                        seed=int(load * 100) + RAMP_SEED)
            if (policy, load) in runs:
                stats = {**pooled_stats([runs[(policy, load)], (stats, outcomes)]), "runs": 2}
            points.append({**stats, "load": load})
            print(f"[{ingress}] ramp {policy} x{load}: {_line(stats)}", flush=True)
            if not within_budget(stats, budget_ms):
                break
        rps, between = throughput_at_budget(points, budget_ms)
        out[policy] = {"budget_e2e_p99_ms": budget_ms, "points": points,
                       "throughput_rps": rps, "between_loads": between}
    return out


def agreement(args, results: dict, capacities: dict) -> dict:
    """prefix, shared prefix, 0.8: one proxy per node against the grid's two (the same
    arrivals: the seed is the load's)."""
    two = results.get("shared_prefix", {}).get("proxy", {}).get("prefix", {}).get("0.8")
    if two is None:
        return {}
    with SimFleet(args, "proxy", proxies_per_node=1) as fleet:
        fleet.set_policy("prefix")
        rate = capacities[("shared_prefix", "proxy")] * 0.8
        one, _ = run_point(fleet, "shared_prefix", rate, args, seed=80)
    print(f"[proxy x1] prefix x0.8: {_line(one)}", flush=True)
    return {"1": one, "2": two}


def haproxy_agreement(args, results: dict, capacities: dict) -> dict:
    """prefix, shared prefix, 0.8: two nodes' HAProxies (peers, ``fleetplane
    start-local-cluster --nodes 2``: 127.0.0.2 and .3), each request sent to either at
    random, against the grid's one HAProxy (the same arrivals). Ends the embedded Ray."""
    one = results.get("shared_prefix", {}).get("haproxy", {}).get("prefix", {}).get("0.8")
    if one is None:
        return {}
    import ray

    from controlplane.settings import Settings
    from release_tests import local_cluster

    ray.shutdown()
    os.environ["FLEETPLANE_STATE_DIR"] = tempfile.mkdtemp(prefix="llm_routing_")  # its own
    local_cluster.start(nodes=2, redis=False)
    try:
        ray.init(address=local_cluster.ADDRESS, namespace=Settings().namespace,
                 log_to_driver=False)
        with SimFleet(args, "haproxy", nodes=("127.0.0.2", "127.0.0.3")) as fleet:
            fleet.set_policy("prefix")
            rate = capacities[("shared_prefix", "haproxy")] * 0.8
            two, _ = run_point(fleet, "shared_prefix", rate, args, seed=80)
    finally:
        ray.shutdown()
        local_cluster.stop()
    print(f"[haproxy x2 nodes] prefix x0.8: {_line(two)}", flush=True)
    return {"1": one, "2": two}


def _line(s: dict) -> str:
    return (f"TTFT p50 {s['ttft_p50_ms']:.0f} ms p99 {s['ttft_p99_ms']:.0f} ms, e2e p99 "
            f"{s['e2e_p99_ms']:.0f} ms, {s['throughput_rps']:.2f} req/s, hit "
            f"{s['hit_rate']:.2f}, max/mean {s['max_mean_load']:.2f}, failed {s['failed']}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--speedup", type=float, default=4.0,
                   help="the simulated engines' clock against GB10's")
    p.add_argument("--cache-blocks", type=int, default=4096,
                   help="each engine's prefix cache, 16-token blocks (4096: 64K tokens)")
    p.add_argument("--ingresses", default="proxy,haproxy")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--loads", default=",".join(map(str, LOADS)))
    p.add_argument("--seconds", type=float, default=20.0, help="measured per point")
    p.add_argument("--random-seconds", type=float, default=40.0,
                   help="measured per point (per round at 0.8) of the random workload")
    p.add_argument("--random-rounds", type=int, default=3,
                   help="random prompts at 0.8 (the bar: TTFT p99 within 5%% of p2c's): "
                   "every policy run this many times, in turn, pooled (one 60 s run's p99 "
                   "moved by up to 20%% between two runs of p2c); 1: once, and p2c again "
                   "after every policy")
    p.add_argument("--warmup-s", type=float, default=5.0,
                   help="before each point of random prompts (engines reset)")
    p.add_argument("--session-warmup-s", type=float, default=30.0,
                   help="before each point of shared prefixes: their chat sessions' steady "
                   "mix of turns (see warmup_s)")
    p.add_argument("--capacity-s", type=float, default=15.0)
    p.add_argument("--decisions", type=int, default=5000)
    p.add_argument("--balance-factor", type=float, default=None,
                   help="request_router_kwargs.balance_factor (default: the product's, "
                   f"{DEFAULT_BALANCE_FACTOR:g})")
    p.add_argument("--port", type=int, default=8050)
    p.add_argument("--ramp-loads", default=",".join(map(str, RAMP)),
                   help="loads tried for throughput at equal p99, in order")
    p.add_argument("--no-ramp", dest="ramp", action="store_false")
    p.add_argument("--no-agreement", dest="agreement", action="store_false")
    p.add_argument("--quick", action="store_true",
                   help="the 0.8 load only, 10 s points, three ramp loads")
    p.add_argument("--smoke", action="store_true", help="what the test suite runs")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parse_args(parser, SMOKE, argv)
    if args.quick and not args.smoke:  # QUICK's defaults; a flag given still wins
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    if args.random_rounds < 1:
        parser.error("--random-rounds must be at least 1 (1: each point once)")
    for name in ("ingresses", "workloads", "policies"):
        setattr(args, name, getattr(args, name).split(","))
    args.loads = [0.8] if args.quick else [float(x) for x in args.loads.split(",")]
    args.ramp_loads = [float(x) for x in args.ramp_loads.split(",")]
    # the decision's cost first, in this process alone: measured last, it shared the CPU
    # with the Ray it had just stopped (4.8 ms p99 in an exploratory run, 0.1 ms alone)
    decisions = {policy: decision_cost(policy, args.decisions) for policy in args.policies}
    from controlplane.instance import start_local_ray
    start_local_ray()
    results, rows, capacities, ramps = {}, [], {}, {}
    for ingress in args.ingresses:
        with SimFleet(args, ingress) as fleet:
            runs: dict = {}
            grid(fleet, ingress, args, results, rows, capacities, runs)
            ramps[ingress] = ramp(fleet, ingress, args, results, capacities, runs)
    agree = agreement(args, results, capacities) if args.agreement else {}
    agree_haproxy = haproxy_agreement(args, results, capacities) if args.agreement else {}
    _add_decisions(results, decisions)
    ratios = random_p99_ratios(rows)
    summary = {"results": results, "capacity_rps": {f"{w}/{i}": c for (w, i), c
                                                     in capacities.items()},
               "throughput_at_equal_p99": ramps, "two_proxies": agree,
               "two_haproxies": agree_haproxy,
               "decision_ms_64_replicas": decisions, "random_p99_vs_p2c": ratios,
               "setup": fleet_setup(args),
               "criteria": criteria(results, ramps, agree, decisions, agree_haproxy, ratios)}
    path = record("llm_routing", summary, rows, smoke=args.smoke, argv=argv)
    for bar in summary["criteria"]:
        print(f"{'met' if bar['met'] else 'NOT MET'}: {bar['criterion']}: {bar['measured']} "
              f"(goal {bar['goal']})")
    print(f"results: {path}")
    print(json.dumps(results))
    return 0


def _add_decisions(results: dict, decisions: dict) -> None:
    """Every point carries its policy's decision p99 (the proxy's; HAProxy's own choice
    is not measured here: None)."""
    for ingresses in results.values():
        for ingress, policies in ingresses.items():
            for policy, loads in policies.items():
                for stats in loads.values():
                    stats["decision_p99_ms"] = (decisions[policy]["p99_ms"]
                                                if ingress == "proxy" else None)


def fleet_setup(args) -> dict:
    return {"replicas": args.replicas, "speedup": args.speedup,
            "cache_blocks": args.cache_blocks, "slots": GB10.slots,
            "max_ongoing_requests": SimFleet.max_ongoing_requests(),
            "steps_per_s": round(args.speedup / GB10.step_s, 1),
            "prefill_tokens_per_step": GB10.prefill_tokens_per_step,
            "seconds": args.seconds, "random_seconds": args.random_seconds,
            "random_rounds": args.random_rounds,
            "warmup_s": args.warmup_s, "session_warmup_s": args.session_warmup_s,
            "loads": args.loads,
            "balance_factor": args.balance_factor or DEFAULT_BALANCE_FACTOR,
            "calibration": "vLLM DGX Spark guide (June 2026): Nemotron-3-Super-120B-A12B-NVFP4 "
                           "on one GB10, --max-num-seqs 4"}


if __name__ == "__main__":
    sys.exit(main())
