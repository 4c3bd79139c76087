"""Is the Retry-After a router sends good advice? Issue 14's evaluation harness.

    python -m release_tests.retry_after_eval [--shapes ...] [--policies ...] [--duration-s 60]
        [--runs 3] [--routers 1] [--mode once|until|both] [--jobs 1] [--smoke]

Every (load shape, policy, client mode) is simulated ``--runs`` times with seeds
``--seed``, ``--seed + 1``, ... (the same seeds for every policy, so policies meet the same
arrivals) by ``release_tests.retry_after_sim``: fleetplane's real ``Router`` objects over
simulated replicas, in virtual time (a simulated minute costs milliseconds of wall time).
Policies: every name in ``controlplane.routing.retry_after.POLICIES`` at run time;
``static`` once per ``--static-s`` value (5 s and 1 s), a computed policy with the first
of them as its fallback. Ray Serve itself is not simulated.

Prints the machine, a table of medians per client mode, whether each of the issue's goals
is met, records the medians, the goals and the Retry-After values given (a histogram per
mode, shape and policy) with ``release_tests.results.record`` (one row per run as
Parquet beside it), and prints as its last line one JSON object
``{shape: {policy: {"<mode>_<metric>": median}}}``. ``--smoke``: one shape (const2x), one
run of a 10 s window after a 10 s warm-up, every policy; exits 1 if a run measured nothing.

Goals (issue 14), checked per client mode on the computed policies:

1. ``poisson1x``: >= 95% of retries admitted, idle capacity <= 5%.
2. ``const2x``: retries admitted at least double the best static row's.
3. every shape: no worse than ``static`` 5 s by more than 5 on any measure: points for
   the percentages, percent of the static value for the others (goodput, attempts per
   admitted request, p50/p99 latency).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any, Iterable

from controlplane.routing.retry_after import POLICIES
from release_tests.machine import describe, describe_line
from release_tests.results import parse_args, record
from release_tests.retry_after_shapes import SHAPES
from release_tests.retry_after_sim import PolicyRow, SimConfig, metrics, simulate

MODES = ("once", "until")
# (metric, header, format); the table's columns and the JSON's metrics
COLUMNS = (
    ("first_try_rejected_pct", "first try rejected %", "{:.1f}"),
    ("retries_admitted_pct", "retries admitted %", "{:.1f}"),
    ("finally_rejected_pct", "finally rejected %", "{:.1f}"),
    ("attempts_per_admitted", "attempts / admitted", "{:.2f}"),
    ("idle_capacity_pct", "idle capacity %", "{:.1f}"),
    ("goodput_per_s", "goodput /s", "{:.2f}"),
    ("latency_p50_s", "p50 s", "{:.2f}"),
    ("latency_p99_s", "p99 s", "{:.2f}"),
    ("retry_after_p10_s", "RA p10", "{:g}"),
    ("retry_after_p50_s", "RA p50", "{:g}"),
    ("retry_after_p90_s", "RA p90", "{:g}"),
)
# Goal 3's measures: +1 where higher is worse, -1 where lower is worse.
POINT_MEASURES = {"first_try_rejected_pct": 1, "retries_admitted_pct": -1,
                  "finally_rejected_pct": 1, "idle_capacity_pct": 1}
RELATIVE_MEASURES = {"goodput_per_s": -1, "attempts_per_admitted": 1, "latency_p50_s": 1,
                     "latency_p99_s": 1}
TOLERANCE = 5.0
BASELINE = "static_5s"
# --smoke: the same path on one short shape; explicit flags still win.
SMOKE = {"shapes": ["const2x"], "runs": 1, "warmup_s": 10.0, "duration_s": 10.0}


def policy_rows(names: Iterable[str], static_values_s: list[float]) -> list[PolicyRow]:
    """``static`` once per value; every other policy with the first value as fallback."""
    rows = []
    for name in names:
        if name == "static":
            rows += [PolicyRow(f"static_{v:g}s", "static", v) for v in static_values_s]
        else:
            rows.append(PolicyRow(name, name, static_values_s[0]))
    return rows


def _one(task: tuple[str, PolicyRow, SimConfig, int, int]) -> dict[str, Any]:
    shape, row, config, run, seed = task
    started = time.perf_counter()
    result = simulate(SHAPES[shape], row, config, seed)
    given = Counter(v for o in result.outcomes for v in o.retry_afters)
    return {"mode": config.mode, "shape": shape, "policy": row.label, "run": run,
            "seed": seed, "wall_s": time.perf_counter() - started, **metrics(result, config),
            # {"<seconds>" or "none": rejections}: the Retry-After values this run gave
            "retry_after_given": json.dumps({("none" if v is None else str(v)): n
                                             for v, n in sorted(given.items(), key=str)})}


def run_all(shapes: list[str], rows: list[PolicyRow], configs: list[SimConfig], runs: int,
            seed: int, jobs: int) -> list[dict[str, Any]]:
    """One record per simulated run, in a stable order whatever ``jobs``."""
    tasks = [(shape, row, config, run, seed + run) for config in configs for shape in shapes
             for row in rows for run in range(runs)]
    if jobs <= 1:
        return [_one(task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_one, tasks))


def medians(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict]]]:
    """``{mode: {shape: {policy: {metric: median over runs}}}}``; None without samples."""
    grouped: dict[tuple, list[dict]] = {}
    for r in records:
        grouped.setdefault((r["mode"], r["shape"], r["policy"]), []).append(r)
    out: dict = {}
    for (mode, shape, policy), runs in grouped.items():
        values = {}
        for metric, _, _ in COLUMNS:
            samples = [r[metric] for r in runs if r[metric] is not None]
            values[metric] = statistics.median(samples) if samples else None
        out.setdefault(mode, {}).setdefault(shape, {})[policy] = values
    return out


def table(by_shape: dict[str, dict[str, dict]]) -> str:
    lines = ["| shape | policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|" + "---|" * (len(COLUMNS) + 2)]
    for shape, by_policy in by_shape.items():
        for policy, values in by_policy.items():
            cells = ["-" if values[m] is None else fmt.format(values[m]) for m, _, fmt in COLUMNS]
            lines.append(f"| {shape} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _worse_by(metric: str, value: float | None, base: float | None) -> float | None:
    """How much worse ``value`` is than ``base``: points, or percent of ``base``."""
    if value is None or base is None:
        return None
    if metric in POINT_MEASURES:
        return POINT_MEASURES[metric] * (value - base)
    if base == 0:
        return None
    return RELATIVE_MEASURES[metric] * (value - base) / abs(base) * 100.0


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def goal_lines(by_shape: dict[str, dict[str, dict]], rows: list[PolicyRow]) -> list[str]:
    """One line per (goal, computed policy) of one client mode: MET, MISSED, or why not
    measured."""
    computed = [r.label for r in rows if r.policy != "static"]
    statics = [r.label for r in rows if r.policy == "static"]
    if not computed:
        return ["goals: not measured (no computed policy run)"]
    return (_goal_poisson(by_shape, computed) + _goal_double(by_shape, computed, statics)
            + _goal_no_worse(by_shape, computed))


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def _goal_poisson(by_shape: dict, computed: list[str]) -> list[str]:
    goal = "goal 1, poisson1x: retries admitted >= 95% and idle capacity <= 5%"
    if "poisson1x" not in by_shape:
        return [f"{goal}: not measured (shape not run)"]
    lines = []
    for label in computed:
        m = by_shape["poisson1x"][label]
        admitted, idle = m["retries_admitted_pct"], m["idle_capacity_pct"]
        ok = admitted is not None and admitted >= 95.0 and idle <= 5.0
        lines.append(f"{goal}: {label} {_verdict(ok)} (retries admitted {_fmt(admitted)}%, "
                     f"idle {_fmt(idle)}%)")
    return lines


def _goal_double(by_shape: dict, computed: list[str], statics: list[str]) -> list[str]:
    goal = "goal 2, const2x: retries admitted >= 2 x the best static"
    if "const2x" not in by_shape or not statics:
        return [f"{goal}: not measured (shape or static rows not run)"]
    ms = by_shape["const2x"]
    best = max((ms[s]["retries_admitted_pct"] or 0.0, s) for s in statics)
    lines = []
    for label in computed:
        admitted = ms[label]["retries_admitted_pct"]
        ok = admitted is not None and admitted >= 2 * best[0]
        need = ("unreachable" if 2 * best[0] > 100 else "needs") + f" {_fmt(2 * best[0])}%"
        lines.append(f"{goal}: {label} {_verdict(ok)} ({_fmt(admitted)}% vs {best[1]} "
                     f"{_fmt(best[0])}%, {need})")
    return lines


def _goal_no_worse(by_shape: dict, computed: list[str]) -> list[str]:
    goal = f"goal 3, every shape: no worse than {BASELINE} by more than {TOLERANCE:g}"
    if any(BASELINE not in ms for ms in by_shape.values()):
        return [f"{goal}: not measured ({BASELINE} not run)"]
    lines = []
    for label in computed:
        worse = [_comparison(shape, metric, m[label][metric], m[BASELINE][metric])
                 for shape, m in by_shape.items()
                 for metric in (*POINT_MEASURES, *RELATIVE_MEASURES)
                 if (_worse_by(metric, m[label][metric], m[BASELINE][metric]) or 0.0)
                 > TOLERANCE]
        detail = "; ".join(worse) if worse else "within tolerance everywhere"
        lines.append(f"{goal}: {label} {_verdict(not worse)} ({detail})")
    return lines


def _comparison(shape: str, metric: str, value: float | None, base: float | None) -> str:
    digits = 1 if metric in POINT_MEASURES else 2
    return f"{shape} {metric} {_fmt(value, digits)} vs {_fmt(base, digits)}"


def retry_after_given(records: list[dict[str, Any]]) -> dict[str, dict[str, dict]]:
    """``{mode: {shape: {policy: {"<seconds>": rejections}}}}``, summed over runs: the
    Retry-After values a policy gave (a histogram; integer seconds, so a few keys each)."""
    out: dict = {}
    for r in records:
        counts = out.setdefault(r["mode"], {}).setdefault(r["shape"], {}).setdefault(
            r["policy"], Counter())
        counts.update(json.loads(r["retry_after_given"]))
    for by_shape in out.values():
        for by_policy in by_shape.values():
            for policy, counts in by_policy.items():
                by_policy[policy] = dict(sorted(counts.items(), key=lambda kv: _seconds(kv[0])))
    return out


def _seconds(key: str) -> float:
    return float("inf") if key == "none" else float(key)


def broken(records: list[dict[str, Any]]) -> list[str]:
    """Runs that measured nothing (no arrival in the window, or nothing completed): a
    harness that no longer drives the Router, not a policy's result."""
    return [f"{r['mode']} {r['shape']} {r['policy']} run {r['run']}" for r in records
            if not r["arrivals"] or not r["goodput_per_s"]]


def as_json(by_mode: dict[str, dict]) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{shape: {policy: {"<mode>_<metric>": median}}}``."""
    out: dict = {}
    for mode, by_shape in by_mode.items():
        for shape, by_policy in by_shape.items():
            for policy, values in by_policy.items():
                merged = out.setdefault(shape, {}).setdefault(policy, {})
                merged.update({f"{mode}_{k}": None if v is None else round(v, 3)
                               for k, v in values.items()})
    return out


def _names(values: list[str], known: Iterable[str], what: str,
           parser: argparse.ArgumentParser) -> list[str]:
    """Space- or comma-separated names, each checked against ``known``."""
    names = [n for v in values for n in v.split(",") if n]
    for name in names:
        if name not in known:
            parser.error(f"{what}: unknown name {name!r}; use one of {', '.join(known)}")
    return names


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), help=", ".join(SHAPES))
    p.add_argument("--policies", nargs="+", default=list(POLICIES), help=", ".join(POLICIES))
    p.add_argument("--static-s", nargs="+", type=float, default=[5.0, 1.0],
                   help="static rows; the first is also the computed policies' fallback")
    p.add_argument("--duration-s", type=float, default=60.0, help="measured window")
    p.add_argument("--warmup-s", type=float, default=70.0,
                   help="before the window: >= the longest Retry-After (60 s) + 10 s")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routers", type=int, default=1)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-ongoing", type=int, default=2)
    p.add_argument("--max-queued", type=int, default=4)
    p.add_argument("--handler-s", type=float, default=0.5)
    p.add_argument("--handler-jitter", type=float, default=0.0,
                   help="each handler time is handler-s x U(1 - j, 1 + j); 0: fixed")
    p.add_argument("--status-code", type=int, default=429)
    p.add_argument("--mode", choices=(*MODES, "both"), default="both")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny run of the same path (what the test suite runs): --shapes "
                   "const2x --runs 1 --warmup-s 10 --duration-s 10 unless given")
    return p


def _sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(replicas=args.replicas, max_ongoing=args.max_ongoing,
                     max_queued=args.max_queued, handler_s=args.handler_s,
                     handler_jitter=args.handler_jitter, status_code=args.status_code,
                     routers=args.routers, warmup_s=args.warmup_s, duration_s=args.duration_s)


def _print_setup(base: SimConfig, args: argparse.Namespace, shapes: list[str]) -> None:
    print(f"machine: {describe_line()}")
    print(f"config: {base.replicas} replica(s) x max_ongoing_requests {base.max_ongoing}, "
          f"{base.handler_s:g} s handler (+-{100 * base.handler_jitter:g}%), capacity "
          f"{base.capacity_per_s:g} req/s, max_queued_requests {base.max_queued} per "
          f"router, {base.routers} router(s), status {base.status_code}; computed policies "
          f"fall back to {args.static_s[0]:g} s; {base.warmup_s:g} s warm-up, "
          f"{base.duration_s:g} s measured, {args.runs} runs (seeds {args.seed}.."
          f"{args.seed + args.runs - 1}), medians shown")
    print("fleetplane's real Router in virtual time over simulated replicas; Ray Serve "
          "2.60 is NOT simulated (its rows in issue 14 were measured on real HTTP)")
    for shape in shapes:
        print(f"shape {shape}: {SHAPES[shape].description}")


def _print_mode(mode: str, by_shape: dict, rows: list[PolicyRow], base: SimConfig) -> None:
    print(f"\nmode {mode}: " + ("a rejected request retries once, after its Retry-After"
          if mode == "once" else "retries after each Retry-After until admitted, "
          f"giving up past {base.give_up_after_s:g} s from its first arrival"))
    print(table(by_shape))
    for line in goal_lines(by_shape, rows):
        print(f"[{mode}] {line}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parse_args(parser, SMOKE, argv)
    shapes = _names(args.shapes, SHAPES, "--shapes", parser)
    rows = policy_rows(_names(args.policies, POLICIES, "--policies", parser), args.static_s)
    base = _sim_config(args)
    modes = list(MODES) if args.mode == "both" else [args.mode]
    _print_setup(base, args, shapes)
    started = time.perf_counter()
    configs = [replace(base, mode=mode) for mode in modes]
    records = run_all(shapes, rows, configs, args.runs, args.seed, args.jobs)
    wall_s = time.perf_counter() - started
    by_mode = medians(records)
    for mode in modes:
        _print_mode(mode, by_mode[mode], rows, base)
    summary = {"config": {**vars(args), "capacity_per_s": base.capacity_per_s,
                          "give_up_after_s": base.give_up_after_s},
               "medians": as_json(by_mode),
               "goals": {mode: goal_lines(by_mode[mode], rows) for mode in modes},
               "retry_after_given": retry_after_given(records),
               "wall_s": round(wall_s, 2), "simulated_runs": len(records)}
    path = record("retry_after_eval", summary, records, smoke=args.smoke)
    print(f"\nresults: {path}")
    print(f"wall time: {wall_s:.1f} s for {len(records)} simulated runs "
          f"(slowest {max(r['wall_s'] for r in records):.2f} s), {args.jobs} process(es)")
    print(f"machine: {json.dumps(describe())}")
    failed = broken(records)
    if failed:
        print(f"BROKEN: {len(failed)} run(s) measured nothing: {'; '.join(failed[:5])}",
              file=sys.stderr)
    print(json.dumps(as_json(by_mode)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
