"""A soak under locust: steady users, bursts and long streams against one ``fleetplane run``.

    python -m release_tests.soak [--duration-s 300] [--steady-users 8] [--burst-users 32]
                                 [--stream-users 4] [--stream-chunks 80] ... [--smoke]

Starts ``fleetplane run release_tests/soak.yaml`` (its own embedded Ray, serving on
127.0.0.1:8031 only), waits until every replica is RUNNING, runs locust headless on
``release_tests/locustfile.py`` (the user classes and the burst shape are described there),
then stops the run with SIGINT and waits for it (it drains and shuts its Ray down).

Per request type (``steady``, ``burst``, ``stream``): requests, failures, latency and
throughput, as a table and a last JSON line. Latencies are locust's: its percentiles come
from a histogram rounded to two significant figures above 100 ms (a 20.7 s stream is
"21000"), so a stream's exact figure is its average, beside the nominal length it asked for.
Locust's own reports stay in ``<results>/soak_<time>/``: ``locust_stats.csv``,
``locust_stats_history.csv`` (every type, every second), ``locust_failures.csv``,
``locust.html``, beside both processes' logs. ``release_tests.results.record`` writes the
summary, with the most frequent failures and a time series of users, requests/s, p95 and
failures (at most MAX_POINTS points, for a plot), to ``measured/soak.json``.
Exit 1 when any request failed (a non-2xx answer, a stream cut short) or a type had none.

``--smoke``: the same for 8 s with a handful of users and 2 s streams (the suite runs it).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from release_tests.machine import describe_line
from release_tests.results import ROOT, folders, record

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "soak.yaml"
LOCUSTFILE = HERE / "locustfile.py"
TYPES = ("steady", "burst", "stream")
MAX_POINTS = 240  # time-series points kept in the summary
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Load:
    """What locust runs. Each field is an option of this command and of the locustfile,
    spelled alike (``duration_s`` is the locustfile's ``--soak-duration-s``)."""

    duration_s: float = 300.0
    steady_users: int = 8
    steady_rate: float = 10.0  # requests/s per steady user
    burst_users: int = 32
    burst_rate: float = 20.0  # requests/s per burst user
    burst_every_s: float = 30.0
    burst_for_s: float = 5.0
    stream_users: int = 4
    stream_chunks: int = 80
    stream_every_s: float = 0.25

    @property
    def stream_s(self) -> float:
        return self.stream_chunks * self.stream_every_s

    def locust_options(self) -> list[str]:
        options = {**dataclasses.asdict(self), "soak_duration_s": self.duration_s}
        del options["duration_s"]
        return [arg for name, value in options.items()
                for arg in (f"--{name.replace('_', '-')}", str(value))]


SMOKE = Load(duration_s=8.0, steady_users=2, burst_users=4, burst_every_s=4.0, burst_for_s=2.0,
             stream_users=2, stream_chunks=8)


@contextmanager
def serving(config: Path, log_path: Path, env: dict[str, str] | None = None,
            args: tuple[str, ...] = ()) -> Iterator[dict[str, float]]:
    """``fleetplane run config [args]`` (with ``env`` added to this environment) for the
    block; yields timings (``ready_s``, later ``stop_s``). Its own session, so a Ctrl-C
    reaches it once, from us."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fleetplane.cli", "run", str(config),
                                 *args],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
        try:
            _wait_ready(proc, log_path)
            timings["ready_s"] = round(time.monotonic() - started, 2)
            yield timings
        finally:
            stopping = time.monotonic()
            _stop(proc)
            timings["stop_s"] = round(time.monotonic() - stopping, 2)


def _wait_ready(proc: subprocess.Popen, log_path: Path) -> None:
    """Until ``run`` prints that every replica is RUNNING (its "Ctrl-C to stop" line)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while "Ctrl-C to stop" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fleetplane run did not come up (exit {proc.poll()}):\n{tail}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C: ``run`` drains, stops its actors and shuts its Ray down."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"  fleetplane run still up {STOP_TIMEOUT_S:.0f}s after SIGINT; killing its group")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_locust(load: Load, host: str, reports: Path) -> None:
    """Locust headless, its reports under ``reports``; raises if locust itself broke."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
           "--csv", str(reports / "locust"), "--csv-full-history",
           "--html", str(reports / "locust.html"), "--only-summary",
           # users stopping (end of a burst, end of the soak) finish what they hold: a
           # stream is read to its end, not cut off by locust
           "--stop-timeout", str(math.ceil(load.stream_s + 10)),
           "--exit-code-on-error", "0",  # failures are judged from the CSV, below
           *load.locust_options()]
    log_path = reports / "locust.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=load.duration_s + load.stream_s + 120)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    if rc != 0:
        raise RuntimeError(f"locust exited {rc}:\n{log_path.read_text()[-3000:]}")


def _number(text: str) -> float | None:
    return None if text in ("", "N/A") else round(float(text), 1)


def read_types(stats_csv: Path, load: Load) -> list[dict]:
    """One row per request type from locust's ``_stats.csv`` (zeros for a type never sent)."""
    with open(stats_csv) as f:
        by_name = {row["Name"]: row for row in csv.DictReader(f)}
    rows = []
    for name in TYPES:
        row = by_name.get(name, {})
        rows.append({
            "type": name,
            "requests": int(row.get("Request Count", 0)),
            "failures": int(row.get("Failure Count", 0)),
            "avg_ms": _number(row.get("Average Response Time", "")),
            "p50_ms": _number(row.get("50%", "")),
            "p95_ms": _number(row.get("95%", "")),
            "p99_ms": _number(row.get("99%", "")),
            "max_ms": _number(row.get("Max Response Time", "")),
            "requests_per_s": round(float(row.get("Requests/s", 0.0)), 2),
        })
    rows[TYPES.index("stream")]["nominal_ms"] = load.stream_s * 1000
    return rows


def read_series(history_csv: Path, max_points: int = MAX_POINTS) -> dict[str, list]:
    """Users, requests/s, failures and the short types' p95 over time, from locust's
    ``_stats_history.csv`` (one row a second per type), in at most ``max_points`` buckets.
    Requests/s and failures come from the running totals (exact per bucket); p95 is locust's
    own, over its last 10 s, the highest in the bucket."""
    with open(history_csv) as f:
        rows = list(csv.DictReader(f))
    seconds = sorted({int(r["Timestamp"]) for r in rows})
    if not seconds:
        return {}
    total = {int(r["Timestamp"]): r for r in rows if r["Name"] == "Aggregated"}
    p95 = {(int(r["Timestamp"]), r["Name"]): _number(r["95%"]) for r in rows}
    step = max(1, math.ceil(len(seconds) / max_points))
    series: dict[str, list] = {"t_s": [], "users": [], "requests_per_s": [], "failures": [],
                               "p95_ms_steady": [], "p95_ms_burst": []}
    last_t, last_count, last_failed = seconds[0], 0, 0
    for start in range(0, len(seconds), step):
        bucket = [t for t in seconds[start:start + step] if t in total]
        if not bucket:
            continue
        end = total[bucket[-1]]
        count, failed = int(end["Total Request Count"]), int(end["Total Failure Count"])
        series["t_s"].append(bucket[-1] - seconds[0])
        series["users"].append(max(int(total[t]["User Count"]) for t in bucket))
        elapsed_s = max(1, bucket[-1] - last_t)
        series["requests_per_s"].append(round((count - last_count) / elapsed_s, 1))
        series["failures"].append(failed - last_failed)
        for name in ("steady", "burst"):
            values = [v for t in bucket if (v := p95.get((t, name))) is not None]
            series[f"p95_ms_{name}"].append(max(values) if values else None)
        last_t, last_count, last_failed = bucket[-1], count, failed
    return series


def print_table(rows: list[dict], load: Load) -> None:
    print(f"\nsoak: {load.duration_s:g} s; steady {load.steady_users} x {load.steady_rate:g}/s, "
          f"burst +{load.burst_users} x {load.burst_rate:g}/s for {load.burst_for_s:g} s every "
          f"{load.burst_every_s:g} s, stream {load.stream_users} x {load.stream_s:g} s; "
          f"{describe_line()}")
    print(f"{'type':8s} {'requests':>9s} {'failures':>9s} {'avg ms':>8s} {'p50 ms':>8s}"
          f" {'p95 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'req/s':>8s}")
    for r in rows:
        cells = [f"{r[k]:8.0f}" if r[k] is not None else f"{'-':>8s}"
                 for k in ("avg_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")]
        print(f"{r['type']:8s} {r['requests']:9d} {r['failures']:9d} {' '.join(cells)}"
              f" {r['requests_per_s']:8.2f}")


def read_failures(failures_csv: Path, keep: int = 10) -> list[dict]:
    """The most frequent failures locust saw (its ``_failures.csv``): type, error, count."""
    with open(failures_csv) as f:
        rows = [{"type": r["Name"], "error": r["Error"], "count": int(r["Occurrences"])}
                for r in csv.DictReader(f)]
    return sorted(rows, key=lambda r: -r["count"])[:keep]


def verdict(rows: list[dict]) -> str:
    """'' when every type was sent and nothing failed; else what went wrong."""
    problems = [f"{r['type']}: {r['failures']} failed" for r in rows if r["failures"]]
    problems += [f"{r['type']}: no request" for r in rows if not r["requests"]]
    return "; ".join(problems)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Load]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Defaults: " + ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(Load))
        + "; --smoke: " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(SMOKE).items()))
    for field in dataclasses.fields(Load):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default),
                            default=None, help=f"default {field.default}")
    parser.add_argument("--smoke", action="store_true",
                        help="a bounded run (~8 s of load, a handful of users), for the suite")
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Load)
             if getattr(args, f.name) is not None}
    return args, dataclasses.replace(SMOKE if args.smoke else Load(), **given)


def main(argv: list[str] | None = None) -> int:
    args, load = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the ``finally`` blocks stop locust and fleetplane run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    config = yaml.safe_load(CONFIG.read_text())
    host = f"http://{config['http_options']['host']}:{config['http_options']['port']}"
    slots = sum(d["num_replicas"] * d["max_ongoing_requests"]
                for app in config["applications"] for d in app["deployments"])
    peak = load.steady_users + load.burst_users + load.stream_users
    if peak > slots:  # each user holds at most one request
        print(f"  warning: {peak} users at a burst's peak, {slots} replica slots in "
              f"{CONFIG.name}: requests will queue, streams behind short ones")
    reports = folders(args.smoke)[1] / f"soak_{int(time.time())}"
    reports.mkdir(parents=True, exist_ok=True)
    with serving(CONFIG, reports / "fleetplane.log") as timings:
        print(f"  fleetplane run ready in {timings['ready_s']} s on {host}; locust for "
              f"{load.duration_s:g} s")
        started = time.monotonic()
        run_locust(load, host, reports)
        timings["locust_s"] = round(time.monotonic() - started, 2)
    rows = read_types(reports / "locust_stats.csv", load)
    print_table(rows, load)
    problem = verdict(rows)
    summary = {"load": dataclasses.asdict(load), "host": host, **timings,
               "types": {r["type"]: {k: v for k, v in r.items() if k != "type"} for r in rows},
               "failed": sum(r["failures"] for r in rows), "verdict": problem or "ok",
               "failures": read_failures(reports / "locust_failures.csv"),
               "reports": _shown(reports),
               "series": read_series(reports / "locust_stats_history.csv")}
    path = record("soak", summary, rows, smoke=args.smoke, argv=argv)
    print(f"  locust reports: {_shown(reports)}/ (locust.html, locust_*.csv); "
          f"summary: {_shown(path)}")
    if problem:
        print(f"  FAILED: {problem}")
        for failure in summary["failures"]:
            print(f"    {failure['type']}: {failure['error']} x{failure['count']}")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("series", "load")}))
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
