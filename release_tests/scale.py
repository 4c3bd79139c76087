"""The control plane at fleet scale: fleetplane's shard and Ray Serve 2.60's controller state
at the same N replicas, on the same machine, in one run.

    python -m release_tests.scale --replicas 1000,4000,16000,32000 [--quick] [--ray]

In process, no Ray cluster: each (system, N) runs in its own worker process (so RSS and
the garbage collector's state are its own), through the real controller objects with
fake replicas that start and stop at once (``scale_fleet``: ``ShardCore``;
``scale_serve``: ``DeploymentStateManager``). Both at their products' defaults: every
fleetplane replica reports every ``--report-interval-s`` (default: the product's
``metrics_report_interval_s``, 1 s) with its health riding on it, through node batches
(the default path); Serve's controller checks each replica's health every
``health_check_period_s`` (10 s) inside its ``update()``. Measured per N:

- ``period_cpu_ms`` (the headline): all of the controller's work in one 0.1 s period.
  fleetplane: its tick, the ingest of every report that arrived in that period and the
  owned tasks; Serve: its ``update()``, its health checks included. Median over the
  steady periods, CPU time. fleetplane's with direct reports (one call each, the path of
  a replica whose node has no reporter) beside it.
- ``tick_p50_ms``: the tick (``update()``) alone, wall, reports flowing.
- ``rollout_period_cpu_ms``: the same per-period work during a rolling replacement of all
  N, each at its product's default batch (fleetplane's ``rolling_surge_fraction`` and
  Serve's ``rolling_update_percentage``, both 20%); fleetplane's loop is also held at most
  one slice at a time, shown as ``rollout_tick_ms``.
- ``scaleup_s`` and ``cpu_us_per_start``: 0 -> N RUNNING, the controller's time with its
  calls back to back (replicas start at once, so this is the control plane's own bound)
  and its CPU per start with a full collection after it counted for both (fleetplane's
  shard defers its collection while it starts replicas: ``plan_freeze``);
  ``scaleup_cpu_us_per_replica`` is the same without the collection.
- fleetplane: the tick's own work (no reports), the cost per report (batched and direct),
  shard RSS; both: the rolling replacement and a scale-down to N/32.
- with ``--ray``: ``release_tests.health_push`` (``--ray-mode``: batched by default, or
  push; a real shard actor and simulated replicas at the same report interval) at each N
  for ``--ray-duration-s``: shard CPU per health update and the freshness miss rate.

Prints the machine, the table, the 16K/1K growth of tick p50 for both, py-spy's top
frames of the 16K steady tick (flame graph under ``release_tests/results/``), records
``release_tests/measured/scale.json`` (``release_tests.results``) and, as its last line,
one JSON object keyed by system and N. ``--smoke``: both systems at 200 replicas, a few
ticks, no profile (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from controlplane.settings import ReplicaSettings, ShardSettings

RESULTS = Path(__file__).resolve().parent / "results"
_PRODUCT_REPORT_S = ReplicaSettings().metrics_report_interval_s
_PRODUCT_SURGE = ShardSettings().rolling_surge_fraction
FULL_SIZES = "1000,4000,16000,32000"
QUICK_SIZES = "1000,4000"
# The last line's keys, per system and N (a system without one shows null).
KEYS = ("period_cpu_ms", "tick_p50_ms", "rollout_period_cpu_ms", "scaleup_s",
        "cpu_us_per_start", "report_interval_s", "tick_p99_ms", "tick_cpu_p50_ms",
        "period_cpu_p99_ms", "rollout_tick_ms", "rollout_tick_cpu_ms",
        "scaleup_cpu_us_per_replica", "period_cpu_direct_ms", "push_batched_us", "push_us",
        "shard_cpu_us_per_update", "miss_rate", "pushes_per_tick", "replace_s", "scaledown_s",
        "shard_rss_mb", "status_ms", "status_summary_ms")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


@dataclass(frozen=True)
class PhaseResult:
    """A phase driven until it converged: the controller's time with its calls back to back,
    the CPU they took, and the control-loop iterations (ticks) it needed."""

    controller_s: float
    cpu_s: float
    ticks: int
    converged: bool

    def text(self, changed: int) -> str:
        tail = "" if self.converged else f" (NOT converged after {self.ticks} ticks)"
        return (f"{self.controller_s:.2f}s controller time over {self.ticks} ticks, "
                f"{self.cpu_s / max(1, changed) * 1e6:.0f} us CPU per replica{tail}")

    def as_dict(self, name: str, changed: int) -> dict:
        ok = self.converged
        return {f"{name}_s": self.controller_s if ok else None, f"{name}_ticks": self.ticks,
                f"{name}_cpu_us_per_replica": self.cpu_s / max(1, changed) * 1e6 if ok else None}


@dataclass(frozen=True)
class Limits:
    """When a phase that has not converged is given up on (and reported as such): on this
    2-core machine Serve's replacement of 32K replicas alone would take many minutes."""

    max_ticks: int = 20_000
    budget_s: float = 120.0  # wall seconds per phase

    def reached(self, ticks: int, started: float) -> bool:
        return ticks >= self.max_ticks or time.monotonic() - started > self.budget_s


# ---- workers: one (system, N) per process ---------------------------------------------------
def run_worker(args: argparse.Namespace) -> None:
    if args.phase == "scaleup":
        Path(args.out).write_text(json.dumps({"result": _scaleup_only(args), "samples": []}))
        return
    if args.worker == "fleetplane":
        import logging
        logging.basicConfig(level=logging.WARNING)
        from release_tests.scale_fleet import FleetOptions, run_fleet
        opts = FleetOptions(steady_ticks=args.steady_ticks, start_delay_s=args.start_delay_s,
                            surge_fraction=args.surge_fraction, limits=_limits(args),
                            profile_s=args.profile_s if args.n == args.profile_n else 0.0,
                            profile_path=str(RESULTS / f"scale_tick_{args.n}.svg"),
                            report_interval_s=args.report_interval_s)
        result, samples = run_fleet(args.n, opts, log)
    else:
        from release_tests.scale_serve import run_serve
        result, samples = run_serve(args.n, args.steady_ticks, args.start_delay_s,
                                    _limits(args), log)
    Path(args.out).write_text(json.dumps({"result": result, "samples": samples}))


def _scaleup_only(args: argparse.Namespace) -> dict:
    if args.worker == "fleetplane":
        from release_tests.scale_fleet import FleetOptions, run_fleet_scaleup
        return run_fleet_scaleup(args.n, FleetOptions(
            steady_ticks=0, start_delay_s=args.start_delay_s, limits=_limits(args),
            report_interval_s=args.report_interval_s))
    from release_tests.scale_serve import run_serve_scaleup
    return run_serve_scaleup(args.n, args.start_delay_s, _limits(args))


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(args.max_ticks, args.phase_budget_s)


def _spawn(system: str, n: int, args: argparse.Namespace,
           phase: str = "all") -> tuple[dict | None, list]:
    """Run one worker (every phase, or the scale-up alone); (None, []) when it failed (its
    stderr is already on ours)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "release_tests.scale", "--worker", system, "--n", str(n),
           "--out", out, "--steady-ticks", str(args.steady_ticks),
           "--start-delay-s", str(args.start_delay_s), "--surge-fraction",
           str(args.surge_fraction), "--max-ticks", str(args.max_ticks),
           "--phase-budget-s", str(args.phase_budget_s),
           "--profile-n", str(args.profile_n), "--profile-s", str(args.profile_s),
           "--report-interval-s", str(args.report_interval_s), "--phase", phase]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent,
                              timeout=args.worker_timeout_s)
        if proc.returncode != 0:
            log(f"[{system} {n}] worker failed (exit {proc.returncode})")
            return None, []
        data = json.loads(Path(out).read_text())
    except subprocess.TimeoutExpired:
        log(f"[{system} {n}] worker ran past {args.worker_timeout_s}s; skipped")
        return None, []
    finally:
        os.unlink(out)
    log(f"[{system} {n}] done in {time.monotonic() - started:.0f}s")
    return data["result"], data["samples"]


# ---- through Ray: release_tests.health_push per N ----------------------------------------
def through_ray(sizes: list[int], args: argparse.Namespace) -> dict[int, dict]:
    """Shard CPU per health update and freshness misses through a real shard actor
    (``health_push.run_mode`` in ``--ray-mode``), per N."""
    import ray

    from controlplane.instance import start_local_ray
    from release_tests.health_push import run_mode
    start_local_ray()
    measured = {}
    try:
        for n in sizes:
            hp_args = argparse.Namespace(
                replicas=n, duration_s=args.ray_duration_s, period_s=10.0, timeout_s=30.0,
                report_interval_s=args.report_interval_s, warmup_periods=3.0, per_host=2048,
                batch_interval_s=1.0)
            measured[n], _rows = run_mode(args.ray_mode, hp_args)
            log(f"[ray {n}] {measured[n]['controller_cpu_us_per_update']:.1f} us shard CPU "
                f"per update, miss rate {measured[n]['miss_rate']:.4%}")
    finally:
        ray.shutdown()
    return measured


# ---- report --------------------------------------------------------------------------------
COLUMNS = [  # (header, key, format); a system without the key shows "-"
    ("work per 0.1 s period, CPU p50 ms", "period_cpu_ms", "{:.2f}"),
    ("... p99 ms", "period_cpu_p99_ms", "{:.2f}"),
    ("... with direct reports ms", "period_cpu_direct_ms", "{:.2f}"),
    ("tick alone p50 ms", "tick_p50_ms", "{:.3f}"), ("tick p99 ms", "tick_p99_ms", "{:.3f}"),
    ("own tick CPU p50 ms", "own_tick_cpu_p50_ms", "{:.3f}"),
    ("us per report batched", "push_batched_us", "{:.2f}"),
    ("us per report direct", "push_us", "{:.2f}"),
    ("reports per period", "pushes_per_tick", "{:.0f}"),
    ("rollout: work per period ms", "rollout_period_cpu_ms", "{:.1f}"),
    ("rollout: loop held p50 ms", "rollout_tick_ms", "{:.2f}"),
    ("scale-up s", "scaleup_s", "{:.2f}"), ("ticks", "scaleup_ticks", "{}"),
    ("CPU us/start (with GC)", "cpu_us_per_start", "{:.0f}"),
    ("CPU us/start (without)", "scaleup_cpu_us_per_replica", "{:.0f}"),
    ("replace-all s", "replace_s", "{:.2f}"), ("ticks", "replace_ticks", "{}"),
    ("scale-down s", "scaledown_s", "{:.2f}"), ("RSS MB", "shard_rss_mb", "{:.0f}"),
    ("status() ms", "status_ms", "{:.0f}"), ("summary ms", "status_summary_ms", "{:.2f}"),
    ("shard CPU us/update (Ray)", "shard_cpu_us_per_update", "{:.1f}"),
    ("miss rate", "miss_rate", "{:.4%}"),
]


def table(results: dict[str, dict[int, dict]]) -> str:
    lines = ["| N | system | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    sizes = sorted({n for by_n in results.values() for n in by_n})
    for n in sizes:
        for system, by_n in results.items():
            r = by_n.get(n)
            if r is None:
                continue
            cells = [fmt.format(r[key]) if r.get(key) is not None else "-"
                     for _, key, fmt in COLUMNS]
            lines.append(f"| {n} | {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def growth(by_n: dict[int, dict]) -> str:
    """Tick p50 at 16K over 1K (else largest over smallest N measured)."""
    have = sorted(n for n, r in by_n.items() if r.get("tick_p50_ms"))
    if len(have) < 2:
        return "n/a"
    lo, hi = (1000, 16000) if {1000, 16000} <= set(have) else (have[0], have[-1])
    return f"{by_n[hi]['tick_p50_ms'] / by_n[lo]['tick_p50_ms']:.1f}x ({hi}/{lo})"


def write_parquet(results: dict, samples: list[tuple], smoke: bool = False) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from release_tests.results import folders
    raw = folders(smoke)[1]
    raw.mkdir(parents=True, exist_ok=True)
    stamp = int(time.time())
    keys = sorted({k for by_n in results.values() for r in by_n.values() for k in r})
    rows = [{"system": s, "replicas": n,
             **{k: (json.dumps(r[k]) if isinstance(r.get(k), (list, dict)) else r.get(k))
                for k in keys}}
            for s, by_n in results.items() for n, r in by_n.items()]
    summary, ticks = raw / f"scale_{stamp}.parquet", raw / f"scale_ticks_{stamp}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), summary)
    pq.write_table(pa.table({name: [row[i] for row in samples] for i, name in enumerate(
        ("system", "replicas", "phase", "tick", "tick_ms", "tick_cpu_ms"))}), ticks)
    return [summary, ticks]


def busy_note() -> str:
    """Other CPU users that make the numbers noisy (a CI run shares these 2 cores)."""
    import psutil
    others = [p.pid for p in psutil.process_iter(["cmdline"])
              if p.pid != os.getpid() and "pytest" in " ".join(p.info["cmdline"] or [])]
    load = os.getloadavg()[0]
    if others:
        return f"NOISY: a pytest run shares the CPUs (pids {others}), load average {load:.1f}"
    return f"load average {load:.1f} at the start"


def print_profile(n: int, profile: dict) -> None:
    if not profile:
        return
    where = profile["samples"]
    total = sum(where.values()) or 1
    print(f"py-spy, {n} replicas, steady ticks with pushes: "
          + ", ".join(f"{part} {count / total:.0%}" for part, count in where.items())
          + " of samples; the shard's top functions by self time:")
    for name, share in profile["top"]:
        print(f"  {share:6.1%}  {name}")


def last_line(results: dict[str, dict[int, dict]]) -> dict:
    def pick(r: dict) -> dict:
        return {k: (round(r[k], 4) if isinstance(r.get(k), float) else r.get(k)) for k in KEYS}
    return {system: {str(n): pick(r) for n, r in by_n.items()}
            for system, by_n in results.items()}


# ---- main ----------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default=None,
                   help=f"comma-separated N (default {FULL_SIZES}; --quick: {QUICK_SIZES})")
    p.add_argument("--quick", action="store_true", help="small N and fewer steady ticks")
    p.add_argument("--smoke", action="store_true",
                   help="both systems at 200 replicas, a few ticks, no profile (the suite's)")
    p.add_argument("--report-interval-s", type=float, default=_PRODUCT_REPORT_S,
                   help="each replica's report interval (default: the product's "
                        f"metrics_report_interval_s, {_PRODUCT_REPORT_S:g} s)")
    p.add_argument("--steady-ticks", type=int, default=None,
                   help="steady ticks / updates measured (default 300; --quick 100)")
    p.add_argument("--start-delay-s", type=float, default=0.0,
                   help="fake time from a replica's start to ready (default: at once)")
    p.add_argument("--surge-fraction", type=float, default=_PRODUCT_SURGE,
                   help="fleetplane's rolling_surge_fraction during the replacement (default: "
                        f"the product's, {_PRODUCT_SURGE:g}, as Serve's rolling_update_percentage)")
    p.add_argument("--max-ticks", type=int, default=20_000,
                   help="a phase not converged after this many ticks is reported as such")
    p.add_argument("--phase-budget-s", type=float, default=120.0,
                   help="... or after this many wall seconds")
    p.add_argument("--no-serve", action="store_true", help="fleetplane only")
    p.add_argument("--profile-n", type=int, default=16000, help="N whose steady tick is profiled")
    p.add_argument("--profile-s", type=float, default=10.0, help="py-spy duration (0: none)")
    p.add_argument("--ray", action="store_true",
                   help="also run release_tests.health_push (push mode) at each N")
    p.add_argument("--ray-duration-s", type=float, default=60.0)
    p.add_argument("--ray-mode", default="batched", choices=("batched", "push"),
                   help="health_push's mode: node batches (the default path) or one call "
                        "per report")
    p.add_argument("--worker-timeout-s", type=float, default=1800.0)
    p.add_argument("--scaleup-runs", type=int, default=3,
                   help="0 -> N runs per system and N, each in a fresh process; the "
                        "median is reported (one run varies by up to a third here)")
    p.add_argument("--phase", default="all", choices=("all", "scaleup"),
                   help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=("fleetplane", "serve"), help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.replicas, args.steady_ticks, args.scaleup_runs = "200", 20, 1
        args.profile_s = 0.0
    if args.replicas is None:
        args.replicas = QUICK_SIZES if args.quick else FULL_SIZES
    if args.steady_ticks is None:
        args.steady_ticks = 100 if args.quick else 300
    return args


def measure(sizes: list[int], args: argparse.Namespace) -> tuple[dict, list]:
    results: dict[str, dict[int, dict]] = {"fleetplane": {}, "serve": {}}
    samples: list[tuple] = []
    for n in sizes:
        for system in ("fleetplane",) if args.no_serve else ("fleetplane", "serve"):
            result, rows = _spawn(system, n, args)
            if result is not None:
                results[system][n] = _median_scaleup(result, [
                    _spawn(system, n, args, "scaleup")[0]
                    for _ in range(args.scaleup_runs - 1)])
                samples += [(system, n, *row) for row in rows]
    ray_measured = through_ray(sizes, args) if args.ray else {}
    for n, r in results["fleetplane"].items():
        m = ray_measured.get(n)
        r["shard_cpu_us_per_update"] = m["controller_cpu_us_per_update"] if m else None
        r["miss_rate"] = m["miss_rate"] if m else None
    return results, samples


def _median_scaleup(result: dict, more: list[dict | None]) -> dict:
    """``result`` with its 0 -> N figures the median of its own and ``more`` runs' (a run
    that failed or did not converge left out); every run's figures kept beside."""
    runs = [r for r in [result, *more] if r is not None and r["scaleup_s"] is not None]
    if not runs:
        return result
    mid = sorted(runs, key=lambda r: r["cpu_us_per_start"])[(len(runs) - 1) // 2]
    return {**result, **{k: mid[k] for k in ("scaleup_s", "scaleup_ticks", "cpu_us_per_start",
                                             "scaleup_cpu_us_per_replica",
                                             "scaleup_collect_ms")},
            "scaleup_runs_cpu_us": [round(r["cpu_us_per_start"], 1) for r in runs]}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        run_worker(args)
        return 0
    from release_tests.machine import describe, describe_line
    from release_tests.results import record
    sizes = [int(s) for s in args.replicas.split(",")]
    print(f"machine: {describe_line()}")
    print(f"conditions: {busy_note()}")
    print(f"config: steady {args.steady_ticks} periods of 0.1 s (fake clock); fleetplane's "
          f"replicas report every {args.report_interval_s:g} s (node batches; direct beside), "
          f"an autoscaled deployment of N/16 beside; Serve checks health every 10 s in "
          f"update(); rolling surge {args.surge_fraction:.0%}; replica start delay "
          f"{args.start_delay_s}s")
    started = time.monotonic()
    results, samples = measure(sizes, args)
    print(table(results))
    print(f"tick p50 growth: fleetplane {growth(results['fleetplane'])}, "
          f"Ray Serve {growth(results['serve'])}")
    print("0 -> N, CPU us per start (a full collection counted) of each run (the table: "
          "their median): " + "; ".join(f"{system} {n}: {r.get('scaleup_runs_cpu_us')}"
                                        for system, by_n in results.items()
                                        for n, r in sorted(by_n.items())))
    for n, r in results["fleetplane"].items():
        print_profile(n, r.get("profile") or {})
    for path in write_parquet(results, samples, args.smoke):
        print(f"records: {path}")
    line = last_line(results)
    print(f"results: {record('scale', {'figures': line, 'config': _config(args)}, smoke=args.smoke)}")
    print(f"wall: {time.monotonic() - started:.0f}s; machine: {json.dumps(describe())}")
    print(json.dumps(line))
    return 0


def _config(args: argparse.Namespace) -> dict:
    return {"report_interval_s": args.report_interval_s, "steady_periods": args.steady_ticks,
            "surge_fraction": args.surge_fraction, "start_delay_s": args.start_delay_s,
            "scaleup_runs": args.scaleup_runs, "health_check_period_s": 10.0}


if __name__ == "__main__":
    sys.exit(main())
