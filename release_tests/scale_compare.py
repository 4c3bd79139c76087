"""The control plane's costs at two commits, side by side, in one run on this machine.

    python -m release_tests.scale_compare --old REV [--replicas 16000,32000] [--runs 3]

Checks REV out into a temporary git worktree and runs ``release_tests.scale`` (fleetplane
only, no profile) in it and in this checkout, alternately, ``--runs`` times each, so a
drift of the machine's speed over the run falls on both. Prints, per N, the median of
each figure for both and their ratio (new / old), with every run's value beside it, and
as its last line one JSON object: ``{"old": REV, "new": HEAD, "date", "machine",
"figures": {N: {KEY: {"old", "new", "ratio"}}}}``.

The figures (each where both trees' harnesses report it): ``cpu_us_per_start`` (CPU per
replica start, a full collection counted) and ``scaleup_cpu_us_per_replica`` (without),
``period_cpu_ms`` (all work per 0.1 s period), ``push_us`` (a replica's direct report),
``push_batched_us`` (a report in a node reporter's batch), ``tick_cpu_p50_ms`` (the steady
tick) and ``rollout_tick_cpu_ms``. Harnesses differ between commits (which path the steady
tick is measured on, the report interval): compare a figure across commits only where
its definition did not change, and pass ``--report-interval-s`` to match them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from release_tests.machine import describe, describe_line
from release_tests.results import record

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("cpu_us_per_start", "period_cpu_ms", "scaleup_cpu_us_per_replica", "push_us",
        "push_batched_us", "tick_cpu_p50_ms", "rollout_tick_cpu_ms")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def run_scale(tree: Path, args: argparse.Namespace) -> dict:
    """One ``release_tests.scale`` run in ``tree``: its last line, fleetplane's figures. A
    tree whose harness takes ``--report-interval-s`` is given ``args.report_interval_s``."""
    cmd = [sys.executable, "-m", "release_tests.scale", "--no-serve", "--replicas",
           args.replicas, "--profile-s", "0", "--scaleup-runs", "1", "--steady-ticks",
           str(args.steady_ticks)]
    if args.report_interval_s and "--report-interval-s" in (
            tree / "release_tests" / "scale.py").read_text():
        cmd += ["--report-interval-s", str(args.report_interval_s)]
    out = subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["fleetplane"]


def measure(trees: dict[str, Path], args: argparse.Namespace) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.runs):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            started = time.monotonic()
            runs[name].append(run_scale(trees[name], args))
            log(f"run {i + 1}/{args.runs} {name}: {time.monotonic() - started:.0f}s")
    return runs


def figures(runs: dict[str, list[dict]], sizes: list[str]) -> dict:
    out: dict = {}
    for n in sizes:
        for key in KEYS:
            values = {name: [r[n][key] for r in rs if r.get(n, {}).get(key) is not None]
                      for name, rs in runs.items()}
            if not all(values.values()):
                continue
            old, new = (statistics.median(values[k]) for k in ("old", "new"))
            out.setdefault(n, {})[key] = {"old": round(old, 3), "new": round(new, 3),
                                          "ratio": round(new / old, 3) if old else None,
                                          "old_runs": values["old"], "new_runs": values["new"]}
    return out


def table(result: dict) -> str:
    lines = ["| N | figure | old | new | new/old | old runs | new runs |",
             "|---|---|---|---|---|---|---|"]
    for n, by_key in result.items():
        for key, f in by_key.items():
            lines.append(f"| {n} | {key} | {f['old']} | {f['new']} | {f['ratio']} | "
                         f"{[round(v, 2) for v in f['old_runs']]} | "
                         f"{[round(v, 2) for v in f['new_runs']]} |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", help="the revision to compare this checkout with")
    p.add_argument("--replicas", default="16000,32000", help="comma-separated N")
    p.add_argument("--runs", type=int, default=3, help="runs per commit (medians)")
    p.add_argument("--steady-ticks", type=int, default=300)
    p.add_argument("--report-interval-s", type=float, default=None,
                   help="passed to each tree whose harness takes it (a harness older than "
                        "the flag reports every 10 s: pass 10 to compare with one)")
    p.add_argument("--smoke", action="store_true",
                   help="HEAD against itself at 200 replicas, one run (the suite's)")
    args = p.parse_args(argv)
    if args.smoke:
        args.old, args.replicas, args.runs, args.steady_ticks = "HEAD", "200", 1, 20
    elif args.old is None:
        p.error("--old is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    old_rev, new_rev = git("rev-parse", "--short", args.old), git("rev-parse", "--short", "HEAD")
    print(f"machine: {describe_line()}")
    print(f"old {old_rev}, new {new_rev} (this checkout, with any uncommitted change)")
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "old"
        git("worktree", "add", "--detach", str(worktree), old_rev)
        try:
            runs = measure({"old": worktree, "new": ROOT}, args)
        finally:
            git("worktree", "remove", "--force", str(worktree))
    result = figures(runs, args.replicas.split(","))
    print(table(result))
    print(f"results: {record('scale_compare', {'old': old_rev, 'new': new_rev, 'figures': result}, smoke=args.smoke)}")
    print(json.dumps({"old": old_rev, "new": new_rev, "date": time.strftime("%Y-%m-%d"),
                      "machine": describe(), "figures": result}))
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
