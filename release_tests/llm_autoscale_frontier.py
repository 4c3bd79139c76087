"""The LLM policy's cost against its SLO beside Serve's, along each one's own knob and
across the day's peak rate: at an equal SLO, which policy holds fewer replicas, and on
which days does issue 30's bar (replica-seconds <= 0.8x Serve's default, TTFT p99 within
10 s in >= 95% of windows) hold?

``python -m release_tests.llm_autoscale_frontier [--seeds 7,1,2,3] [--peaks 0.4,0.6]``

One point is one ``autoscaling_config`` on every seed's day (``llm_autoscale``'s trace,
simulator and data plane; its settings apart from the knob):

- at ``--peak-rps`` (0.5, the published day), each policy along its own knob: fleetplane's
  ``llm.ttft_target_s`` (what it sizes for; the day is still judged at ``--ttft-slo-s``)
  and ``llm.surge``, Serve's ``target_ongoing_requests``; the defaults among them;
- at ``--peak-rps``, both defaults on another data plane (``--data-plane``: 8 requests a
  replica, so each engine queues 4 beyond its 4 slots where the default has the router
  hold them): what the router's one queue is worth to each policy;
- at each ``--peaks`` rate, both defaults: the same day shape, busier or quieter, so the
  day's load meets the two policies' steps at other places.

Per point: replica-seconds as a multiple of Serve's default policy's on the same day and
peak (the mean over seeds, and each seed's), the share of 600 s windows whose TTFT p99 is
within the SLO (the mean, and the worst seed), failed requests. A point left of and above
another is cheaper at a better SLO. Not judged: it says where the published day sits.
``--quick``: seed 7 and the further peak 0.4 only (about 4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from controlplane.deployment.llm_scaling import LLMScaling
from release_tests import llm_autoscale
from release_tests.results import parse_args, record

SMOKE = {"hours": "6,8", "hour_s": 600.0, "seeds": "7", "peaks": "", "jobs": 1, "data_plane": "",
         "fleetplane_knob": "10", "serve_knob": "2", "surge": ""}
QUICK = {"seeds": "7", "peaks": "0.4"}
SERVE_DEFAULT = llm_autoscale.SERVE_DEFAULTS["target_ongoing_requests"]  # Serve 2.60's
FLEETPLANE_DEFAULT = LLMScaling().ttft_target_s


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="7,1,2,3", help="days drawn per point")
    p.add_argument("--peaks", default="0.4,0.6",
                   help="further peak rates (requests/s), both defaults at each")
    p.add_argument("--fleetplane-knob", default="5,10,14,20",
                   help="fleetplane's llm.ttft_target_s values at --peak-rps")
    p.add_argument("--surge", default="0.3", help="fleetplane's llm.surge values (with the "
                   "default ttft_target_s) at --peak-rps; empty for none")
    p.add_argument("--serve-knob", default="1.5,2,2.5,3",
                   help="Serve's target_ongoing_requests values at --peak-rps")
    p.add_argument("--data-plane", default="8", help="further max_ongoing_requests values "
                   "(both defaults at --peak-rps): 8 lets each engine queue 4 beyond its slots")
    p.add_argument("--quick", action="store_true", help="seed 7, peak 0.4")
    p.add_argument("--smoke", action="store_true", help="what the test suite runs")
    llm_autoscale.day_arguments(p)
    return p


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def points(args: argparse.Namespace) -> list[dict]:
    """Every point to run: (system, knob, value, peak) and its Settings."""
    out = []

    def add(system: str, knob: str, value: float, peak: float, llm: dict | None = None,
            target: float | None = None, ongoing: int | None = None) -> None:
        day = argparse.Namespace(**{**vars(args), "peak_rps": peak, "serve_tuned": False,
                                    "fleetplane_tuned": False, "foresight": False,
                                    "max_ongoing_requests": ongoing or args.max_ongoing_requests})
        base = llm_autoscale.systems(day)[system]
        scaling = dict(base.autoscaling)
        if llm is not None:
            scaling["llm"] = llm
        if target is not None:
            scaling["target_ongoing_requests"] = target
        default = (knob, value) in {("target_ongoing_requests", SERVE_DEFAULT),
                                    ("ttft_target_s", FLEETPLANE_DEFAULT)}
        out.append({"system": system, "knob": knob, "value": value, "peak_rps": peak,
                    "default": default, "day": day,
                    "settings": dataclasses.replace(base, autoscaling=scaling)})

    peak = args.peak_rps
    for value in _floats(args.fleetplane_knob):
        add("fleetplane", "ttft_target_s", value, peak, llm={"ttft_target_s": value})
    for value in _floats(args.surge):
        add("fleetplane", "surge", value, peak, llm={"surge": value})
    for value in _floats(args.serve_knob):
        add("serve", "target_ongoing_requests", value, peak, target=value)
    for ongoing in _floats(args.data_plane):
        if int(ongoing) != args.max_ongoing_requests:
            add("fleetplane", "max_ongoing_requests", ongoing, peak, llm={}, ongoing=int(ongoing))
            add("serve", "max_ongoing_requests", ongoing, peak, target=SERVE_DEFAULT,
                ongoing=int(ongoing))
    for other in _floats(args.peaks):
        if other != peak:
            add("fleetplane", "ttft_target_s", FLEETPLANE_DEFAULT, other, llm={})
            add("serve", "target_ongoing_requests", SERVE_DEFAULT, other, target=SERVE_DEFAULT)
    if not any(p["system"] == "serve" and p["default"] and p["peak_rps"] == peak
               for p in out):  # the yardstick runs even when Serve's knob omits it
        add("serve", "target_ongoing_requests", SERVE_DEFAULT, peak, target=SERVE_DEFAULT)
    return out


def _run(job: tuple) -> tuple[int, int, dict]:
    index, point, seed = job
    label = f"{point['system']} {point['knob']} {point['value']:g} at {point['peak_rps']:g}/s"
    _, _, result, _ = llm_autoscale._one_day((label, point["settings"], seed, point["day"],
                                              False))
    return index, seed, result


def summarize(plan: list[dict], seeds: list[int], done: list[tuple[int, int, dict]]) -> list[dict]:
    """One row per point: its cost against Serve's default on the same days, its SLO."""
    by = {(i, seed): r for i, seed, r in done}
    yardstick = {p["peak_rps"]: i for i, p in enumerate(plan)
                 if p["system"] == "serve" and p["default"]}
    rows = []
    for i, p in enumerate(plan):
        serve = yardstick[p["peak_rps"]]
        ratios = {str(s): round(by[i, s]["replica_seconds"] /
                                max(1, by[serve, s]["replica_seconds"]), 3) for s in seeds}
        slo = [by[i, s]["slo_windows_met"] for s in seeds]
        rows.append({"system": p["system"], "knob": p["knob"], "value": p["value"],
                     "peak_rps": p["peak_rps"], "default": p["default"],
                     "vs_serve": round(sum(ratios.values()) / len(seeds), 3),
                     "vs_serve_by_seed": ratios,
                     "slo_windows_met": round(sum(slo) / len(seeds), 3),
                     "slo_worst": min(slo),
                     "failed": sum(by[i, s]["failed"] for s in seeds)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parse_args(parser, SMOKE, argv)
    if args.quick and not args.smoke:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    plan = points(args)
    jobs = [(i, p, seed) for i, p in enumerate(plan) for seed in seeds]
    print(f"{len(plan)} points x {len(seeds)} days = {len(jobs)} simulated days, "
          f"{args.jobs} at a time", flush=True)
    began = time.monotonic()
    done = llm_autoscale.map_days(_run, jobs, args.jobs)
    rows = summarize(plan, seeds, done)
    summary = {"points": rows, "seeds": seeds, "peak_rps": args.peak_rps,
               "hours": [int(x) for x in args.hours.split(",")], "hour_s": args.hour_s,
               "ttft_slo_s": args.ttft_slo_s, "window_s": args.window_s,
               "wall_s": round(time.monotonic() - began)}
    raw = [{"point": i, "seed": seed, **{k: v for k, v in plan[i].items()
                                         if k in ("system", "knob", "value", "peak_rps")},
            "replica_seconds": r["replica_seconds"], "slo_windows_met": r["slo_windows_met"],
            "failed": r["failed"]} for i, seed, r in done]
    path = record("llm_autoscale_frontier", summary, raw, smoke=args.smoke, argv=argv)
    for row in rows:
        print(f"{row['system']:10s} {row['knob']} {row['value']:g} at {row['peak_rps']:g}/s"
              f"{' (default)' if row['default'] else ''}: {row['vs_serve']}x Serve's "
              f"default, {row['slo_windows_met']} of windows (worst day "
              f"{row['slo_worst']}), {row['failed']} failed")
    print(f"results: {path}")
    print(json.dumps({"points": len(rows), "seeds": seeds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
