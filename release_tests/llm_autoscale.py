"""LLM autoscaling over a day: fleetplane's LLM policy with scale to zero against Ray Serve
2.60's default autoscaling, on the same trace and the same simulated GB10 engines.

``python -m release_tests.llm_autoscale [--quick] [--seeds 7,1,2,3] [--peak-rps 0.5]``

The day (``llm_autoscale_sim.day_trace``): no request from 0:00 to 6:00, a morning ramp,
a day at ``--peak-rps`` with three 10-minute bursts at twice it, an evening decline. The
fleet, the data plane and what each policy is fed: ``llm_autoscale_sim``'s docstring
(both policies are their real code; engines, load times and the network are simulated,
in virtual time: a day takes about 30 s of CPU per system). Every row has the same bounds
(``min_replicas`` 0, ``max_replicas`` 12, ``initial_replicas`` 1), the same
``max_ongoing_requests`` (``--max-ongoing-requests``: 4, the engine's slots, so the router
holds what the fleet's batch cannot take) and Serve's default delays (``upscale_delay_s``
30, ``downscale_delay_s`` 600, 1 -> 0 after 600):

- ``fleetplane``: ``autoscaling_config.llm`` at its defaults (``ttft_target_s`` 10: the
  SLO the day is judged on, ``target_fill`` 0.75, ``kv_cache_high`` 0.9, ``surge`` 0),
  ``cold_start_hold_s`` ``--cold-hold-s`` (120);
- ``fleetplane_surge`` (``--no-fleetplane-tuned`` skips it): ``surge`` 0.3, headroom for
  the day's bursts (twice the rate for 10 minutes, faster than a replica loads);
- ``serve``: Serve's defaults (``target_ongoing_requests`` 2);
- ``serve_tuned`` (``--no-serve-tuned``): ``target_ongoing_requests`` 3 = 0.75 x 4 slots;
- ``foresight`` (``--no-foresight``): not a policy, a yardstick
  (``llm_autoscale_foresight``): the same Erlang bound as the LLM policy, on the rate the
  arrivals were drawn at, 300 s ahead (the longest load), with no delay. What it misses is
  what the bound itself misses; between it and ``fleetplane`` is what estimating the
  demand and reacting to it cost. Not judged.

``--quick``: the hours 5:00-11:00 (the idle end of the night, the wake from zero, the
ramp and the first burst), a minute or so.

``--seeds``: the first seed's day is the one reported in full (and judged); each further
seed is another day of the same shape (its arrivals and load times drawn anew), of which
each row's replica-seconds, SLO windows and failures are reported (``by_seed``), to show
how much one day's draw moves them. Runs go to ``--jobs`` processes (2).

Reported per row: ``replica_seconds`` (from the ask to the end of the drain, loading
included), ``failed`` (no first token within ``--client-timeout-s`` of the first try),
``held`` (requests that met no running replica) and ``held_wait_s`` (their wait for a
first token: median, max), ``hinted`` (told to come back),
``cold_starts``, ``slo_windows_met`` (the fraction of ``--window-s`` windows with requests
whose TTFT p99 is within ``--ttft-slo-s``), ``first_answer_after_start_s`` (per cold start,
its first answer after its first replica came up: the worst), the cold starts' measured
starts, TTFT p99 per hour. The criteria are the issue's, judged on the ``fleetplane`` row.
Last line: ``{"fleetplane": {...}, "serve": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from release_tests.llm_autoscale_foresight import foresight_settings
from release_tests.llm_autoscale_sim import LOAD_S, STEP_HZ, SLOTS, Settings, day_trace, simulate
from release_tests.results import parse_args, record

SMOKE = {"hours": "6,8", "hour_s": 600.0, "serve_tuned": False, "fleetplane_tuned": False,
         "foresight": False, "jobs": 1}
SURGE = 0.3  # fleetplane_surge's: headroom for the day's bursts (its cost: MEASURED.md)
FULL_HOURS, QUICK_HOURS = "0,24", "5,11"
SERVE_DEFAULTS = {"target_ongoing_requests": 2.0, "upscale_delay_s": 30.0,
                  "downscale_delay_s": 600.0, "look_back_period_s": 30.0}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="7", help="days to run, the first reported in full")
    day_arguments(p)
    p.add_argument("--no-fleetplane-tuned", dest="fleetplane_tuned", action="store_false",
                   help="skip the fleetplane_surge row (surge 0.3)")
    p.add_argument("--no-serve-tuned", dest="serve_tuned", action="store_false")
    p.add_argument("--no-foresight", dest="foresight", action="store_false",
                   help="skip the foresight row (the bound on the known rate, a yardstick)")
    p.add_argument("--foresight-late-share", type=float, default=None,
                   help="the foresight row's bound (default: the LLM policy's LATE_SHARE)")
    p.add_argument("--quick", action="store_true", help=f"hours {QUICK_HOURS} only")
    p.add_argument("--smoke", action="store_true", help="what the test suite runs")
    return p


def day_arguments(p: argparse.ArgumentParser) -> None:
    """The day and the fleet every row shares (``llm_autoscale_frontier``'s too)."""
    p.add_argument("--jobs", type=int, default=2, help="processes running the days")
    p.add_argument("--hours", default=FULL_HOURS, help="first,last hour of the day (0,24)")
    p.add_argument("--hour-s", type=float, default=3600.0, help="seconds in an hour")
    p.add_argument("--peak-rps", type=float, default=0.5, help="day-time arrivals per second")
    p.add_argument("--max-replicas", type=int, default=12)
    p.add_argument("--max-ongoing-requests", type=int, default=SLOTS,
                   help="per replica, both systems: the engine's slots (the router's queue "
                   "holds the rest); 8 lets each engine queue 4 more")
    p.add_argument("--initial-replicas", type=int, default=1)
    p.add_argument("--health-interval-s", type=float, default=40.0,
                   help="VLLMServer's check: how often the engines' stats are read")
    p.add_argument("--client-timeout-s", type=float, default=300.0)
    p.add_argument("--cold-hold-s", type=float, default=120.0,
                   help="fleetplane's cold_start_hold_s (LLM clients wait minutes: the "
                   "OpenAI SDK's default timeout is 600 s)")
    p.add_argument("--ttft-slo-s", type=float, default=10.0, help="TTFT p99 per window")
    p.add_argument("--window-s", type=float, default=600.0,
                   help="SLO windows (TTFT p99 reported per hour too)")


def systems(args: argparse.Namespace) -> dict[str, Settings]:
    bounds = {"min_replicas": 0, "max_replicas": args.max_replicas,
              "initial_replicas": args.initial_replicas}
    common = dict(max_replicas=args.max_replicas, initial_replicas=args.initial_replicas,
                  max_ongoing_requests=args.max_ongoing_requests,
                  health_interval_s=args.health_interval_s,
                  client_timeout_s=args.client_timeout_s, cold_hold_s=args.cold_hold_s)
    ours = {**bounds, **SERVE_DEFAULTS, "downscale_to_zero_delay_s": 600.0,
            "cold_start_hold_s": args.cold_hold_s, "llm": {}}  # the llm policy's defaults
    out = {"fleetplane": Settings("fleetplane", autoscaling=ours, **common),
           "serve": Settings("serve", autoscaling={**bounds, **SERVE_DEFAULTS}, **common)}
    if args.fleetplane_tuned:
        tuned = {**ours, "llm": {"surge": SURGE}}
        out["fleetplane_surge"] = Settings("fleetplane", autoscaling=tuned, **common)
    if args.serve_tuned:
        tuned = {**bounds, **SERVE_DEFAULTS, "target_ongoing_requests": 0.75 * SLOTS}
        out["serve_tuned"] = Settings("serve", autoscaling=tuned, **common)
    if args.foresight:
        first = int(args.hours.split(",")[0])
        day = foresight_settings(first, args.hour_s, args.peak_rps, args.max_replicas,
                                 LOAD_S[1], args.foresight_late_share)
        out["foresight"] = Settings("foresight", autoscaling=day, **common)
    return out


def _up_at(wakes: list[tuple[float, float]], arrived_s: float) -> float:
    """When the first replica of the cold start a request arrived in came up."""
    ups = [up for asked, up in wakes if asked <= arrived_s + 1.0]
    return ups[-1] if ups else arrived_s


def _windows(outcomes: list, window_s: float, duration_s: float) -> list[dict]:
    out = []
    for k in range(int(math.ceil(duration_s / window_s))):
        inside = [o for o in outcomes if k * window_s <= o.arrived_s < (k + 1) * window_s]
        if inside:
            ttfts = sorted(o.ttft_s for o in inside if o.ttft_s is not None)
            out.append({"failed": sum(o.failed for o in inside),
                        "ttft_p99_s": _p99(ttfts) if ttfts else math.inf})
    return out


def summarize(fleet, hour_s: float, slo_s: float, hours: int, window_s: float) -> dict:
    outcomes = fleet.outcomes
    per_hour = []
    for h in range(hours):
        ttfts = sorted(o.ttft_s for o in outcomes if h * hour_s <= o.arrived_s < (h + 1) *
                       hour_s and o.ttft_s is not None)
        fails = sum(1 for o in outcomes if h * hour_s <= o.arrived_s < (h + 1) * hour_s
                    and o.failed)
        per_hour.append({"requests": len(ttfts) + fails, "failed": fails,
                         "ttft_p99_s": _p99(ttfts)})
    windows = _windows(outcomes, window_s, hours * hour_s)
    met = [w for w in windows if not w["failed"] and w["ttft_p99_s"] <= slo_s]
    from_zero = [o.ttft_s for o in outcomes if o.held and o.ttft_s is not None]
    first_after_up: dict[float, float] = {}  # per cold start: its first answer - its end
    for o in outcomes:
        if o.held and o.ttft_s is not None:
            up = _up_at(fleet.wakes, o.arrived_s)
            after = o.arrived_s + o.ttft_s - up
            first_after_up[up] = min(after, first_after_up.get(up, math.inf))
    return {"replica_seconds": round(fleet.replica_seconds),
            "failed": sum(o.failed for o in outcomes), "requests": len(outcomes),
            "held": sum(o.held for o in outcomes),
            # how long the requests that met no replica waited for their first token
            "held_wait_s": _spread([o.ttft_s for o in outcomes
                                    if o.held and o.ttft_s is not None]),
            "hinted": sum(o.hinted > 0 for o in outcomes),
            "cold_starts": fleet.cold_starts,
            "slo_windows_met": round(len(met) / len(windows), 3) if windows else None,
            "first_answer_from_zero_s": round(min(from_zero), 1) if from_zero else None,
            "worst_answer_from_zero_s": round(max(from_zero), 1) if from_zero else None,
            # per cold start, its first answer after its first replica came up (the
            # measured start); the worst of them
            "first_answer_after_start_s": round(max(first_after_up.values()), 2)
            if first_after_up else None,
            "wakes": [[round(a), round(u - a, 1)] for a, u in fleet.wakes],
            "measured_start_s": round(fleet.board.start_s, 1) if fleet.board.start_s else None,
            "ttft_p99_by_hour_s": [None if w["ttft_p99_s"] is None else
                                   round(w["ttft_p99_s"], 2) for w in per_hour],
            # replicas held (loading, serving or draining), every 5 minutes
            "replicas_every_5min": [held for _, _, _, held, _ in fleet.timeline[::5]]}


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 1), "max": round(ordered[-1], 1)}


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]


def criteria(results: dict, slo_s: float, window_s: float) -> list[dict]:
    ours, serve = results["fleetplane"], results["serve"]
    ratio = ours["replica_seconds"] / max(1, serve["replica_seconds"])
    bars = [("no failed request on the day", ours["failed"], "0", ours["failed"] == 0),
            (f"TTFT p99 <= {slo_s:g}s in >= 95% of {window_s:g} s windows",
             ours["slo_windows_met"], ">= 0.95", (ours["slo_windows_met"] or 0) >= 0.95),
            ("replica-seconds vs Serve's default policy", round(ratio, 3), "<= 0.8",
             ratio <= 0.8)]
    late = ours["first_answer_after_start_s"]
    if late is not None:
        bars.append(("from zero, the first answer within the measured start + 2 s (every "
                     "request answered: failed above)", f"start + {late} s", "<= start + 2 s",
                     late <= 2))
    return [{"criterion": c, "measured": m, "goal": g, "met": bool(ok)}
            for c, m, g, ok in bars]


def _one_day(job: tuple) -> tuple[str, int, dict, list[dict]]:
    """One row's day for one seed: its summary, and its outcomes when ``keep`` (the
    reported day's, for Parquet)."""
    name, settings, seed, args, keep = job
    first, last = (int(x) for x in args.hours.split(","))
    trace = day_trace(seed, (first, last), args.hour_s, args.peak_rps)
    began = time.monotonic()
    fleet = simulate(settings, trace, seed, (last - first) * args.hour_s)
    result = summarize(fleet, args.hour_s, args.ttft_slo_s, last - first, args.window_s)
    rows = [{"system": name, "seed": seed, "arrived_s": o.arrived_s, "ttft_s": o.ttft_s,
             "failed": o.failed, "held": o.held, "hinted": o.hinted}
            for o in fleet.outcomes] if keep else []
    print(f"{name}, seed {seed}: {result['replica_seconds']} replica-seconds, "
          f"{result['slo_windows_met']} of windows, {result['failed']} failed "
          f"({time.monotonic() - began:.0f} s wall)", flush=True)
    return name, seed, result, rows


def map_days(run, jobs: list, processes: int) -> list:
    """``run`` on every job, ``processes`` at a time (forked: each day is pure CPU)."""
    if processes <= 1:
        return [run(job) for job in jobs]
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return pool.map(run, jobs, chunksize=1)


def run_days(args: argparse.Namespace, seeds: list[int]) -> tuple[dict, dict, list[dict]]:
    """Every row on every seed: (the first seed's results, by_seed, its rows)."""
    jobs = [(name, settings, seed, args, seed == seeds[0])
            for seed in seeds for name, settings in systems(args).items()]
    done = map_days(_one_day, jobs, args.jobs)
    results, by_seed, rows = {}, {}, []
    for name, seed, result, kept in done:
        if seed == seeds[0]:
            results[name] = result
        serve = next(r for n, s, r, _ in done if n == "serve" and s == seed)
        by_seed.setdefault(name, {})[str(seed)] = {
            "replica_seconds": result["replica_seconds"],
            "vs_serve": round(result["replica_seconds"] / max(1, serve["replica_seconds"]), 3),
            "slo_windows_met": result["slo_windows_met"], "failed": result["failed"]}
        rows += kept
    return results, by_seed, rows


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parse_args(parser, SMOKE, argv)
    if args.quick and not args.smoke and args.hours == FULL_HOURS:
        args.hours = QUICK_HOURS
    first, last = (int(x) for x in args.hours.split(","))
    seeds = [int(x) for x in args.seeds.split(",")]
    trace = day_trace(seeds[0], (first, last), args.hour_s, args.peak_rps)
    print(f"{len(trace)} requests over hours {first}-{last} ({(last - first) * args.hour_s:g} "
          f"s simulated, seed {seeds[0]}; seeds {seeds}), engines at {STEP_HZ:g} steps/s "
          f"with {SLOTS} slots")
    results, by_seed, rows = run_days(args, seeds)
    bars = criteria(results, args.ttft_slo_s, args.window_s)
    summary = {"results": results, "criteria": bars, "hours": [first, last],
               "hour_s": args.hour_s, "peak_rps": args.peak_rps, "seed": seeds[0],
               "by_seed": by_seed, "max_ongoing_requests": args.max_ongoing_requests,
               "slots": SLOTS,
               "settings": {k: v.autoscaling for k, v in systems(args).items()}}
    path = record("llm_autoscale", summary, rows, smoke=args.smoke, argv=argv)
    for bar in bars:
        print(f"{'met' if bar['met'] else 'NOT MET'}: {bar['criterion']}: {bar['measured']} "
              f"(goal {bar['goal']})")
    for name, days in by_seed.items():
        print(f"{name}: " + "; ".join(f"seed {seed} {d['vs_serve']}x Serve's replica-seconds, "
                                      f"{d['slo_windows_met']} of windows, {d['failed']} failed"
                                      for seed, d in days.items()))
    print(f"results: {path}")
    print(json.dumps({k: results[k] for k in ("fleetplane", "serve")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
