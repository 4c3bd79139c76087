"""Push vs pull replica health at scale, through the real shard ingest path.

    python -m release_tests.health_push --replicas 16384 --duration-s 120 --mode batched,push

Each replica reports every ``--report-interval-s`` (default: the product's
``metrics_report_interval_s``, 1 s), its health riding on the report.

Runs N simulated replicas (many per host process, ``release_tests.sim_fleet``) against a
real ``ControllerShard`` (its ``report_batch`` / ``report_rows`` actor methods,
``ShardCore``, ``DeploymentHealth``, stall guard and probes), once per mode:

- batched (fleetplane's default path): each host stands for a node with its reporter: its
  replicas' reports go into the node reporter's ``ReportBatcher`` and the shard receives
  one ``report_batch`` call per host per ``--batch-interval-s``. The local hand-off a real
  replica makes to its node's reporter is not a Ray call here (it costs the node, not
  the shard being measured).
- push (one call per report, ``report_batch_interval_s: 0``): every metric report carries the replica's newest self-check result; pull probes
  run only for replicas whose push went stale.
- pull: the same metric reports without health; every replica's health comes from a pull
  probe once per health period (the same shard code path, with nothing pushed).

Measured per mode over ``--duration-s`` after start-up and a warm-up (3 health periods by
default: at 16K the start-up backlog takes about one period to drain): health
updates, misses of the freshness deadline (definitions in ``health_records``), the shard
process's CPU time per update (all its threads, Ray's included, less the harness's own
recording of each update, which is timed and shown apart), and pull probes issued
per health period. For context it also shows the CPU of the simulated replicas' host
processes and of the whole machine: on 2 cores the replica side shares the CPUs with the
controller, which a real fleet does not. Prints the machine, a table, writes every update
as Parquet under release_tests/results/, and prints as its last line one JSON object keyed
by mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from controlplane.instance import start_local_ray
from controlplane.settings import ReplicaSettings
from release_tests.machine import describe, describe_line
from release_tests.results import folders, record
from release_tests.sim_fleet import SimConfig, SimFleet

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = pa.schema([("mode", pa.string()), ("replica_id", pa.string()), ("source", pa.string()),
                    ("t_s", pa.float64()), ("gap_s", pa.float64()), ("age_s", pa.float64()),
                    ("delay_s", pa.float64()), ("missed", pa.bool_())])
KEYS = ("replicas", "updates", "misses", "miss_rate", "controller_cpu_us_per_update",
        "probes_per_period")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _start(fleet: SimFleet, n: int) -> float:
    started = time.monotonic()
    fleet.deploy()
    last = [0.0]

    def running(summary: dict) -> bool:
        if time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            _log(f"  {summary['running']}/{n} running")
        return summary["running"] >= n
    fleet.wait(running, timeout_s=max(300.0, n / 10), what=f"{n} replicas running", poll_s=1.0)
    return time.monotonic() - started


def run_mode(mode: str, args: argparse.Namespace) -> tuple[dict, dict]:
    cfg = SimConfig(replicas=args.replicas, push=mode != "pull", period_s=args.period_s,
                    timeout_s=args.timeout_s, report_interval_s=args.report_interval_s,
                    per_host=args.per_host, namespace=f"fleetplane_sim_{mode}_{time.time_ns()}",
                    batch_interval_s=args.batch_interval_s if mode == "batched" else 0.0)
    _log(f"[{mode}] starting {cfg.replicas} simulated replicas")
    fleet = SimFleet(cfg)
    try:
        startup_s = _start(fleet, cfg.replicas)
        warmup_s = args.warmup_periods * cfg.period_s
        _log(f"[{mode}] all running after {startup_s:.1f}s; warm-up {warmup_s:.0f}s")
        time.sleep(warmup_s)
        hosts_before, machine_before = _hosts_cpu_s(fleet), psutil.cpu_times()
        ray.get(fleet.shard.measure_start.remote())
        _log(f"[{mode}] measuring for {args.duration_s:.0f}s")
        time.sleep(args.duration_s)
        m = ray.get(fleet.shard.measure_stop.remote())
        m["hosts_cpu_s"] = _hosts_cpu_s(fleet) - hosts_before
        m["machine_busy_s"] = _busy_s(psutil.cpu_times()) - _busy_s(machine_before)
        summary = fleet.summary()
    finally:
        fleet.shutdown()
    return _result(cfg, m, summary, startup_s), m["rows"]


def _hosts_cpu_s(fleet: SimFleet) -> float:
    return sum(s["cpu_s"] for s in ray.get([h.stats.remote() for h in fleet.hosts]))


def _busy_s(times) -> float:
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _result(cfg: SimConfig, m: dict, summary: dict, startup_s: float) -> dict:
    updates, misses = m["updates"], m["misses"]
    overdue = sum(1 for s in m["rows"]["source"] if s == "overdue")
    gaps = [g for g, s in zip(m["rows"]["gap_s"], m["rows"]["source"]) if s != "overdue"]
    q = statistics.quantiles(gaps, n=100) if len(gaps) >= 2 else [float("nan")] * 99
    return {
        "replicas": cfg.replicas, "updates": updates, "misses": misses,
        "miss_rate": misses / max(1, updates + overdue),
        "controller_cpu_us_per_update": m["cpu_s"] * 1e6 / max(1, updates),
        "harness_cpu_us_per_update": m["harness_cpu_s"] * 1e6 / max(1, updates),
        "probes_per_period": m["pull_probes"] / (m["wall_s"] / cfg.period_s),
        # context beyond the contract keys
        "controller_cpu_cores": m["cpu_s"] / m["wall_s"], "measured_s": m["wall_s"],
        "hosts_cpu_cores": m["hosts_cpu_s"] / m["wall_s"],
        "machine_busy_cores": m["machine_busy_s"] / m["wall_s"],
        "gap_p50_s": q[49], "gap_p99_s": q[98], "gap_max_s": max(gaps, default=float("nan")),
        "overdue": overdue, "replaced": summary["created"] - cfg.replicas,
        "stall_episodes": m["stall_episodes"], "startup_s": startup_s,
        "gc_full_collections": m["gc_full_collections"], "gc_max_pause_s": m["gc_max_pause_s"],
    }


def _table(results: dict, args: argparse.Namespace) -> str:
    cols = [("mode", "{}"), ("replicas", "{}"), ("updates", "{}"), ("misses", "{}"),
            ("miss_rate", "{:.4%}"), ("controller_cpu_us_per_update", "{:.1f}"),
            ("harness_cpu_us_per_update", "{:.1f}"),
            ("controller_cpu_cores", "{:.2f}"), ("hosts_cpu_cores", "{:.2f}"),
            ("machine_busy_cores", "{:.2f}"), ("probes_per_period", "{:.1f}"),
            ("gap_p50_s", "{:.2f}"), ("gap_p99_s", "{:.2f}"), ("gap_max_s", "{:.2f}"),
            ("replaced", "{}"), ("stall_episodes", "{}")]
    lines = ["| " + " | ".join(name for name, _ in cols) + " |",
             "|" + "---|" * len(cols)]
    for mode, r in results.items():
        row = {"mode": mode, **r}
        lines.append("| " + " | ".join(fmt.format(row[name]) for name, fmt in cols) + " |")
    return "\n".join(lines)


def _write_parquet(all_rows: dict, args: argparse.Namespace) -> Path:
    raw = folders(args.smoke)[1]
    raw.mkdir(parents=True, exist_ok=True)
    path = raw / f"health_push_{args.replicas}_{int(time.time())}.parquet"
    tables = [pa.table({"mode": [mode] * len(rows["replica_id"]), **rows}, schema=SCHEMA)
              for mode, rows in all_rows.items()]
    pq.write_table(pa.concat_tables(tables), path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int)
    parser.add_argument("--duration-s", type=float)
    parser.add_argument("--mode", default="batched,push",
                        help="comma-separated: batched (node reporters' batches, the "
                             "default path), push (one call per report), pull; 'both' = "
                             "push,pull")
    parser.add_argument("--batch-interval-s", type=float, default=1.0,
                        help="batched mode: a host (node) sends its shard one batch per this")
    parser.add_argument("--period-s", type=float, default=10.0, help="health_check_period_s")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="health_check_timeout_s")
    parser.add_argument("--report-interval-s", type=float,
                        default=ReplicaSettings().metrics_report_interval_s,
                        help="each replica's report interval (default: the product's "
                             "metrics_report_interval_s)")
    parser.add_argument("--smoke", action="store_true",
                        help="200 replicas, batched, a few seconds (the suite's)")
    parser.add_argument("--warmup-periods", type=float, default=3.0,
                        help="health periods between all-running and measuring")
    parser.add_argument("--per-host", type=int, default=2048,
                        help="simulated replicas per host process")
    args = parser.parse_args(argv)
    if args.smoke:
        args.replicas, args.duration_s, args.warmup_periods, args.period_s = 200, 2.0, 1.0, 2.0
        args.per_host, args.mode = 200, "batched"
    if args.replicas is None or args.duration_s is None:
        parser.error("--replicas and --duration-s are required (or --smoke)")
    start_local_ray()
    print(f"machine: {describe_line()}")
    print(f"config: period {args.period_s}s, timeout {args.timeout_s}s, reports every "
          f"{args.report_interval_s}s, {args.per_host} replicas per host, warm-up "
          f"{args.warmup_periods} periods, {args.duration_s}s measured, freshness deadline "
          f"1.5 x period")
    results, all_rows = {}, {}
    modes = ["push", "pull"] if args.mode == "both" else args.mode.split(",")
    for mode in modes:
        if mode not in ("batched", "push", "pull"):
            parser.error(f"--mode: unknown mode {mode!r}; use batched, push or pull")
    for mode in modes:
        results[mode], all_rows[mode] = run_mode(mode, args)
    print(_table(results, args))
    for mode, r in results.items():
        print(f"{mode}: start-up {r['startup_s']:.0f}s, overdue at the end {r['overdue']}, "
              f"full GCs in the shard {r['gc_full_collections']} "
              f"(longest {1000 * r['gc_max_pause_s']:.0f} ms)")
    print(f"records: {_write_parquet(all_rows, args)}")
    print(f"machine: {json.dumps(describe())}")
    ray.shutdown()
    line = {mode: {k: r[k] for k in KEYS} for mode, r in results.items()}
    summary = {"figures": {mode: {k: v for k, v in r.items() if not isinstance(v, (list, dict))}
                           for mode, r in results.items()},
               "config": {k: getattr(args, k) for k in ("replicas", "duration_s", "period_s",
                                                        "report_interval_s", "batch_interval_s",
                                                        "per_host")}}
    print(f"results: {record('health_push', summary, smoke=args.smoke)}")
    print(json.dumps(line))
    if args.smoke and any(r["updates"] == 0 for r in results.values()):
        return 1  # a mode that took in no update is broken
    return 0


if __name__ == "__main__":
    sys.exit(main())
