"""Where a release test's results go, and what every one of them carries.

A release test ends with ``record(name, summary, rows)``:

- ``release_tests/measured/NAME.json``: what it measured, small enough to commit, with the
  command that produced it, the commit (and whether the tree had uncommitted changes),
  the date and the machine. ``python -m release_tests.report`` builds MEASURED.md and its
  plots from these files alone, so every published figure has a file and a command behind
  it;
- ``release_tests/results/NAME_TIMESTAMP.parquet`` (not committed): the raw rows, when
  there are any.

A smoke run (``--smoke``: a tiny, bounded version of the measurement, what the test suite
runs) writes under ``smoke/`` instead and never touches the committed summaries. The
environment variable ``FLEETPLANE_RESULTS_DIR`` moves both (the suite points it at a
temporary folder).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
import argparse
from typing import Any

from release_tests.machine import describe

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def parse_args(parser: argparse.ArgumentParser, smoke: dict[str, Any],
               argv: list[str] | None = None) -> argparse.Namespace:
    """``parser``'s arguments; with ``--smoke``, ``smoke`` as the defaults (a flag given on
    the command line still wins)."""
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    return args


def folders(smoke: bool = False) -> tuple[Path, Path]:
    """(where summaries go, where raw rows go)."""
    env = os.environ.get("FLEETPLANE_RESULTS_DIR")
    if env:
        root = Path(env) / "smoke" if smoke else Path(env)
        return root / "measured", root / "results"
    if smoke:
        root = HERE / "results" / "smoke"
        return root / "measured", root
    return HERE / "measured", HERE / "results"


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The command, commit, date and machine a result comes from."""
    argv = sys.argv[1:] if argv is None else argv
    module = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "?"
    return {"command": f"python -m release_tests.{module} {shlex.join(argv)}".strip(),
            "commit": _git("rev-parse", "--short", "HEAD"),
            # uncommitted changes to what is measured: another run's results are not
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".",
                               ":(exclude)release_tests/measured")),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": describe()}


def record(name: str, summary: dict[str, Any], rows: list[dict] | None = None, *,
           smoke: bool = False, argv: list[str] | None = None) -> Path:
    """Write ``summary`` (with its provenance) and ``rows``; the summary's path."""
    measured, raw = folders(smoke)
    measured.mkdir(parents=True, exist_ok=True)
    path = measured / f"{name}.json"
    path.write_text(json.dumps({"name": name, **provenance(argv), "summary": summary},
                               indent=1, default=_plain) + "\n")
    if rows:
        import pyarrow as pa
        import pyarrow.parquet as pq
        raw.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), raw / f"{name}_{int(time.time())}.parquet")
    return path


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
