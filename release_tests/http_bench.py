"""fleetplane against Ray Serve 2.60, proxy and HAProxy modes, side by side, in one run.

    python -m release_tests.http_bench [--runs 3] [--duration-s 20] [--connections 16]
                                       [--systems fleetplane,ray-serve-2.60,...] [--smoke]

For each system in turn, starts it serving the same no-op deployment (one replica,
``max_ongoing_requests`` 32, ``num_cpus`` 0) on its own loopback port, warms it for 3 s,
drives it with wrk (one thread, ``--connections`` keep-alive connections) and stops it;
``--runs`` rounds, the systems alternating within each round. Like for like:

- ``fleetplane`` and ``ray-serve-2.60``: one proxy each (``http_options.proxies_per_node: 1``
  beside Serve's one proxy per node), each at its defaults otherwise.
- ``fleetplane-2-proxies``: fleetplane's default of two proxies per node, labelled as such.
- ``ray-serve-2.60-throughput``: Serve's proxy with ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``.
- ``fleetplane-haproxy`` (``ingress: haproxy``) and ``ray-serve-2.60-haproxy``: one HAProxy
  each. Serve's with ``RAY_SERVE_ENABLE_HA_PROXY=1`` and ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``,
  the pair Serve's guide "Enable High Throughput on Ray Serve with KubeRay" sets together
  (HAProxy mode alone: ``ray-serve-2.60-haproxy-only``, about half that on this machine).

Asymmetries that remain, each stated in the recorded summary: Serve writes an access-log
line per request by default (its throughput mode buffers them), fleetplane writes none;
Serve's HAProxy forwards to its own per-replica ingress server, fleetplane's to the replica's
own HTTP listener; both run their replicas at Ray's worker niceness and fleetplane's control
processes at the raylet's.

Prints requests/s, p50, p99 and p99.9 (medians over the runs) and the machine;
``release_tests.results.record`` keeps every run with its latency percentiles (wrk's
histogram through ``wrk_percentiles.lua``: the CDF plot) in ``measured/http_bench.json``.
Exit 1 when a system answered nothing or answered with errors. ``--smoke``: one round of
``fleetplane-haproxy`` and ``ray-serve-2.60`` (one of each launcher), 2 s each.
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
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from release_tests.machine import describe_line
from release_tests.python_load import closed_loop
from release_tests.results import parse_args, record

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "release_tests"
PERCENTILES_LUA = HERE / "wrk_percentiles.lua"
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
SMOKE = {"runs": 1, "duration_s": 2, "warmup_s": 1,
         "systems": "fleetplane-haproxy,ray-serve-2.60"}
ASYMMETRIES = [
    "Serve writes an access-log line per request by default (RAY_SERVE_THROUGHPUT_OPTIMIZED "
    "buffers them); fleetplane writes none.",
    "Serve's HAProxy forwards to Serve's per-replica ingress server; fleetplane's to the "
    "replica's own HTTP listener (uvicorn, in the replica's process).",
    "Replicas run at Ray's worker niceness in both; fleetplane's control processes at the "
    "raylet's (0), Serve's controller and proxy at Ray's.",
]


def _wait_ready(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    """True once ``url`` answers 200; False when ``proc`` (the server) ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return True
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.5)
    raise TimeoutError(f"{url} not answering after {timeout_s}s")


def _tail(log: Path, lines: int = 8) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _start(cmd: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen:
    """The server, in a session of its own; its output to ``log`` (else discarded)."""
    with open(log or os.devnull, "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **env})


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def parse_wrk(text: str) -> dict:
    """Requests/s, p50/p99 (ms), error count and, when ``wrk_percentiles.lua`` ran, every
    percentile it printed (``cdf``: [percentile, ms]) from ``wrk --latency`` output."""
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
    cdf = [[float(p), int(us) / 1000] for p, us in
           re.findall(r"^PERCENTILE ([\d.]+) (\d+)$", text, re.M)]
    p999 = next((ms for p, ms in cdf if p == 99.9), float("nan"))
    return {"requests_per_s": float(rps.group(1)) if rps else 0.0,
            "p50_ms": latency("50"), "p99_ms": latency("99"), "p999_ms": p999,
            "errors": errors, "cdf": cdf}


def _wrk(url: str, connections: int, duration_s: int) -> dict:
    if shutil.which("wrk") is None:  # a smoke run only (main refuses a measurement)
        return closed_loop(url, connections, duration_s)
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency",
                          "-s", str(PERCENTILES_LUA), url],
                         capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


def fleetplane_config(base: str, **http_options) -> Path:
    """``release_tests/<base>`` with ``http_options`` overridden, in a file of its own."""
    config = yaml.safe_load((HERE / base).read_text())
    config["http_options"].update(http_options)
    path = Path(tempfile.mkdtemp(prefix="http_bench_")) / base
    path.write_text(yaml.safe_dump(config))
    return path


def _fleetplane(base: str, port: int, setup: str, **http_options) -> dict:
    return {"kind": "fleetplane", "base": base, "port": port, "http_options": http_options,
            "env": {}, "setup": setup}


def _serve(port: int, env: dict[str, str], setup: str) -> dict:
    return {"kind": "serve", "port": port, "env": env, "setup": setup}


HA, FAST = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
SYSTEMS = {  # name: how it is started and what it is, for the table and the record
    "fleetplane": _fleetplane("noop.yaml", 8000, "1 proxy (proxies_per_node: 1)",
                              proxies_per_node=1),
    "ray-serve-2.60": _serve(8001, {}, "1 proxy, defaults"),
    "fleetplane-2-proxies": _fleetplane("noop.yaml", 8000, "2 proxies (fleetplane's default)",
                                        proxies_per_node=2),
    "ray-serve-2.60-throughput": _serve(8001, FAST, "1 proxy, RAY_SERVE_THROUGHPUT_OPTIMIZED=1"),
    "fleetplane-haproxy": _fleetplane("noop_haproxy.yaml", 8002, "1 HAProxy (ingress: haproxy)"),
    "ray-serve-2.60-haproxy": _serve(8003, {**HA, **FAST}, "1 HAProxy, RAY_SERVE_ENABLE_HA_"
                                     "PROXY=1 + RAY_SERVE_THROUGHPUT_OPTIMIZED=1"),
}
EXTRA = {"ray-serve-2.60-haproxy-only": _serve(8003, HA, "1 HAProxy, RAY_SERVE_ENABLE_HA_PROXY"
                                               "=1 alone")}


def command(system: dict) -> list[str]:
    if system["kind"] == "fleetplane":
        config = fleetplane_config(system["base"], port=system["port"], **system["http_options"])
        return [sys.executable, "-m", "fleetplane.cli", "run", str(config)]
    return [sys.executable, "-m", "release_tests.serve_baseline", "--port", str(system["port"])]


def measure(system: dict, args: argparse.Namespace) -> dict:
    """One run of one system: wrk's figures after a warm-up. A server whose process ends
    before it answers is started once more (seen on this 2-core machine under the test
    suite's parallel load: Ray's raylet gave up waiting for its agent's port file); the
    second failure raises with the end of its log."""
    url = f"http://127.0.0.1:{system['port']}/noop"
    for attempt in (1, 2):
        # its own instance record: another `fleetplane run` on this machine is not disturbed
        state = Path(tempfile.mkdtemp(prefix="http_bench_"))
        proc = _start(command(system), {**system["env"], "FLEETPLANE_STATE_DIR": str(state)},
                      state / "server.log")
        try:
            if _wait_ready(url, 180, proc):
                _wrk(url, args.connections, args.warmup_s)  # warm-up, not recorded
                return _wrk(url, args.connections, args.duration_s)
        finally:
            _stop(proc)
        print(f"the server ended before answering (exit {proc.returncode}, attempt {attempt})"
              f":\n{_tail(state / 'server.log')}", flush=True)
    raise RuntimeError(f"{url}: the server ended before answering, twice")


def _parser() -> argparse.ArgumentParser:
    every = {**SYSTEMS, **EXTRA}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration-s", type=int, default=20)
    p.add_argument("--warmup-s", type=int, default=3)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated, from: {', '.join(every)}")
    p.add_argument("--smoke", action="store_true",
                   help=", ".join(f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items())
                   + " unless given: what the test suite runs")
    return p


def table(systems: dict[str, dict], records: list[dict]) -> dict[str, dict]:
    """Per system: the medians over its runs, its setup, and the CDF of its median run."""
    out = {}
    for name, system in systems.items():
        rows = [r for r in records if r["system"] == name]
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("requests_per_s", "p50_ms", "p99_ms", "p999_ms")}
        middle = sorted(rows, key=lambda r: r["requests_per_s"])[(len(rows) - 1) // 2]
        out[name] = {**{k: round(v, 3) for k, v in med.items()}, "setup": system["setup"],
                     "errors": sum(r["errors"] for r in rows), "runs": len(rows),
                     "runs_requests_per_s": [round(r["requests_per_s"]) for r in rows],
                     "cdf": middle["cdf"]}
    return out


def print_table(summary: dict, args: argparse.Namespace) -> None:
    print(f"\nwrk -t1 -c{args.connections} -d{args.duration_s}s, medians of {args.runs} runs, "
          f"loopback; machine: {describe_line()}")
    print("| system | setup | requests/s | p50 ms | p99 ms | p99.9 ms | errors |\n"
          "|---|---|---|---|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} | {row['setup']} | {row['requests_per_s']:.0f} | {row['p50_ms']:.2f} | "
              f"{row['p99_ms']:.2f} | {row['p999_ms']:.2f} | {row['errors']} |")


def main() -> int:
    args = parse_args(_parser(), SMOKE)
    every = {**SYSTEMS, **EXTRA}
    unknown = set(args.systems.split(",")) - set(every)
    if unknown:
        sys.exit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(every)}")
    load = "wrk" if shutil.which("wrk") else "python (wrk not found: smoke only)"
    if load != "wrk" and not args.smoke:
        sys.exit("wrk not found: apt-get install wrk (Debian)")
    systems = {name: every[name] for name in args.systems.split(",")}
    records = []
    for run in range(args.runs):
        for name, system in systems.items():
            result = measure(system, args)
            records.append({"system": name, "run": run, "connections": args.connections,
                            "duration_s": args.duration_s, **result})
            print(f"run {run} {name:<26} {result['requests_per_s']:8.0f} req/s  "
                  f"p50 {result['p50_ms']:6.2f} ms  p99 {result['p99_ms']:7.2f} ms  "
                  f"errors {result['errors']}", flush=True)
    summary = table(systems, records)
    print_table(summary, args)
    if load != "wrk":
        print(f"load: {load}; these figures are not wrk's")
    path = record("http_bench", {"systems": summary, "connections": args.connections,
                                 "duration_s": args.duration_s, "runs": args.runs,
                                 "deployment": "one no-op replica, max_ongoing_requests 32",
                                 "load": load,
                                 "asymmetries": ASYMMETRIES},
                  [{k: v for k, v in r.items() if k != "cdf"} for r in records],
                  smoke=args.smoke)
    print(f"results: {path}")
    broken = [name for name, row in summary.items() if not row["requests_per_s"] or row["errors"]]
    for name in broken:
        print(f"BROKEN: {name} answered nothing or with errors", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
