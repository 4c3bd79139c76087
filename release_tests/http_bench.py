"""fleetplane against Ray Serve 2.60, proxy and HAProxy modes, side by side, in one run.

For each system in turn (fleetplane's proxy, Ray Serve's default proxy, fleetplane's
``ingress: haproxy``, Ray Serve with ``RAY_SERVE_ENABLE_HA_PROXY=1``), starts it serving
the same no-op deployment on its own loopback port, drives it with wrk, stops it. Prints
requests/s, p50 and p99 (medians over --runs), the machine, and writes every run as
Parquet under release_tests/results/.

    python -m release_tests.http_bench [--runs 3] [--duration-s 20] [--connections 16]
                                       [--systems fleetplane,fleetplane-haproxy,...]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from release_tests.machine import describe, describe_line

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "release_tests" / "results"
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not answering after {timeout_s}s")


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, **env})


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def parse_wrk(text: str) -> dict:
    """Requests/s, p50/p99 (ms) and error count from `wrk --latency` output."""
    def latency(pct: str) -> float:
        m = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                              r"timeout (\d+)", text)
    errors = int(non2xx.group(1)) if non2xx else 0
    if socket_errors:
        errors += sum(int(g) for g in socket_errors.groups())
    return {"requests_per_s": float(rps.group(1)) if rps else 0.0,
            "p50_ms": latency("50"), "p99_ms": latency("99"), "errors": errors}


def _wrk(url: str, connections: int, duration_s: int) -> dict:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


def measure(cmd: list[str], env: dict[str, str], health_url: str, url: str, args) -> dict:
    proc = _start(cmd, env)
    try:
        _wait_ready(health_url, timeout_s=180)
        _wrk(url, args.connections, 3)  # warm-up, not recorded
        return _wrk(url, args.connections, args.duration_s)
    finally:
        _stop(proc)


SYSTEMS = {  # name: (command, environment, health URL, measured URL)
    "fleetplane": ([sys.executable, "-m", "fleetplane.cli", "run", "release_tests/noop.yaml"],
                   {}, "http://127.0.0.1:8000/noop", "http://127.0.0.1:8000/noop"),
    "ray-serve-2.60": ([sys.executable, "-m", "release_tests.serve_baseline", "--port", "8001"],
                       {}, "http://127.0.0.1:8001/noop", "http://127.0.0.1:8001/noop"),
    # haproxy ingress: a real HAProxy in front of a replica serving HTTP itself
    "fleetplane-haproxy": ([sys.executable, "-m", "fleetplane.cli", "run",
                            "release_tests/noop_haproxy.yaml"],
                           {}, "http://127.0.0.1:8002/noop", "http://127.0.0.1:8002/noop"),
    "ray-serve-2.60-haproxy": ([sys.executable, "-m", "release_tests.serve_baseline",
                                "--port", "8003"], {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
                               "http://127.0.0.1:8003/noop", "http://127.0.0.1:8003/noop"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-s", type=int, default=20)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, from: {', '.join(SYSTEMS)}")
    args = parser.parse_args()
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        sys.exit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk (Debian)")
    machine = describe()
    systems = {name: SYSTEMS[name] for name in args.systems.split(",")}
    records = []
    for run in range(args.runs):
        for system, (cmd, env, health, url) in systems.items():
            result = measure(cmd, env, health, url, args)
            records.append({"system": system, "run": run, "connections": args.connections,
                            "duration_s": args.duration_s, **result, **machine})
            print(f"run {run} {system:<15} {result['requests_per_s']:8.0f} req/s  "
                  f"p50 {result['p50_ms']:6.2f} ms  p99 {result['p99_ms']:7.2f} ms  "
                  f"errors {result['errors']}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"http_bench_{int(time.time())}.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    print(f"\nwrk -t1 -c{args.connections} -d{args.duration_s}s, medians of {args.runs} runs, "
          f"loopback; machine: {describe_line()}")
    print("| system | requests/s | p50 ms | p99 ms |\n|---|---|---|---|")
    for system in systems:
        rows = [r for r in records if r["system"] == system]
        med = lambda k: statistics.median(r[k] for r in rows)
        print(f"| {system} | {med('requests_per_s'):.0f} | {med('p50_ms'):.1f} | "
              f"{med('p99_ms'):.1f} |")
    print(f"records: {path}")


if __name__ == "__main__":
    main()
