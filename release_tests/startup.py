"""How long ``fleetplane run deployments/demo.yaml`` takes to serve: the README's first command.

    python -m release_tests.startup [--runs 5] [--config deployments/demo.yaml] [--smoke]

Each run starts ``fleetplane run CONFIG`` on its own embedded Ray, as a new user does, and
reads the times it prints itself (seconds from its start): ``Ray ready``, ``deployed`` (the
config validated, built and handed to the shards) and ``all N/N replicas RUNNING``; then
stops it with SIGINT (a Ctrl-C) and times the stop. Prints each run and the medians;
``release_tests.results.record`` keeps every run in ``measured/startup.json``. Exit 1 when a
run did not come up. ``--smoke``: one run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

from release_tests.machine import describe_line
from release_tests.results import ROOT, folders, record
from release_tests.soak import serving

PHASES = {"ray_ready_s": r"\[\s*([\d.]+)s\] Ray ready",
          "deployed_s": r"\[\s*([\d.]+)s\] deployed",
          "running_s": r"\[\s*([\d.]+)s\] all (\d+)/\d+ replicas RUNNING"}


def phases(log: str) -> dict[str, float]:
    """The times ``fleetplane run`` printed for each phase (those it reached), and the
    replica count it reported RUNNING."""
    out: dict[str, float] = {}
    for key, pattern in PHASES.items():
        m = re.search(pattern, log)
        if m:
            out[key] = float(m.group(1))
            if key == "running_s":
                out["replicas"] = int(m.group(2))
    return out


def one_run(config: Path, folder: Path, index: int) -> dict:
    log_path = folder / f"run_{index}.log"
    env = {"FLEETPLANE_STATE_DIR": tempfile.mkdtemp(prefix="startup_")}
    with serving(config, log_path, env=env) as timings:
        pass
    return {"run": index, **phases(log_path.read_text(errors="replace")), **timings}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--config", type=Path, default=ROOT / "deployments" / "demo.yaml")
    p.add_argument("--smoke", action="store_true", help="one run: what the test suite runs")
    args = p.parse_args(argv)
    runs = 1 if args.smoke else args.runs
    folder = folders(args.smoke)[1] / "startup"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(runs):
        row = one_run(args.config, folder, index)
        rows.append(row)
        print(f"run {index}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "run"),
              flush=True)
    keys = ("ray_ready_s", "deployed_s", "running_s", "ready_s", "stop_s")
    medians = {k: round(statistics.median(r[k] for r in rows), 2)
               for k in keys if all(k in r for r in rows)}
    config = args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config
    print(f"\nfleetplane run {config}, median of {runs}: {medians}; {describe_line()}")
    summary = {"config": str(config), "runs": runs, "medians": medians,
               "replicas": rows[0].get("replicas"), "each": rows}
    path = record("startup", summary, rows, smoke=args.smoke, argv=argv)
    print(f"results: {path}")
    print(json.dumps({"startup": medians}))
    return 0 if all("running_s" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
