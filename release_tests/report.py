"""MEASURED.md, written from the release tests' results files and nothing else.

    python -m release_tests.report [--measured release_tests/measured] [--out MEASURED.md]

Every release test ends by recording a summary (``release_tests.results.record``:
``release_tests/measured/NAME.json``, with the command, commit, date and machine it ran
on). This command reads those files and writes MEASURED.md: one section per result, in
``SECTIONS`` order, opening with its command and provenance; its tables; and plots
(PNG under ``release_tests/measured/plots/``) where a reader would rather look than read:
the period's work against N for both systems, latency percentiles, Retry-After outcomes,
drain timelines. A figure that is in no results file is in no section: rerun the command
named, then this one. The output depends on the files alone (no clock), so regenerating
from the same files changes nothing.

``--smoke``: the same on the smoke runs' files (``release_tests/results/smoke`` or
``$FLEETPLANE_RESULTS_DIR/smoke``), written beside them (the suite's check).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from release_tests import report_plots
from release_tests.results import HERE, ROOT, folders, record

# (name, title, what it measures). Results without an entry here follow, by name.
SECTIONS = [
    ("scale", "The control plane at scale, beside Ray Serve",
     "fleetplane's shard and Ray Serve 2.60's controller state at the same N replicas, in "
     "process, at the products' defaults."),
    ("health_push", "Replica health through Ray: node batches and direct reports",
     "A real shard actor and simulated replicas: shard CPU per health update and freshness."),
    ("http_bench", "HTTP throughput beside Ray Serve", ""),
    ("soak", "Mixed traffic for minutes (locust)", ""),
    ("http_abuse", "HTTP abuse and the proxy's memory", ""),
    ("retry_after_http", "Retry-After on real HTTP, beside Ray Serve", ""),
    ("retry_after_eval", "Is the Retry-After good advice? (virtual time)", ""),
    ("overload_idle", "A saturated replica stays busy", ""),
    ("drain_events", "Drains behind HAProxy", ""),
    ("node_churn", "Node drains", ""),
    ("chaos", "Kills under load: what survives what", ""),
    ("serve_compat_diff", "The same Serve applications under Serve and fleetplane", ""),
    ("scale_compare", "Two commits side by side", ""),
]
MAX_ROWS = 40  # a table longer than this is cut (the results file has the rest)


def load(measured: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(measured.glob("*.json"))}


def provenance(result: dict) -> str:
    m = result.get("machine", {})
    dirty = " (with uncommitted changes)" if result.get("dirty") else ""
    return (f"`{result.get('command', '?')}` at {result.get('commit') or 'an unknown commit'}"
            f"{dirty}, {result.get('date', '?')}, on {m.get('cpu', '?')}, {m.get('cores', '?')}"
            f" cores, {m.get('memory_gib', '?')} GiB, Python {m.get('python', '?')}.")


@dataclass(frozen=True)
class Where:
    """Where a section's plots go, and how the report links them."""

    plots: Path
    out_dir: Path

    def image(self, png: Path | None, alt: str) -> list[str]:
        return [f"![{alt}]({os.path.relpath(png, self.out_dir)})", ""] if png else []


def section(name: str, title: str, about: str, result: dict, where: Where) -> str:
    lines = [f"## {title}", "", provenance(result), ""]
    if about:
        lines += [about, ""]
    render = RENDERERS.get(name, render_generic)
    lines += render(result["summary"], where, name)
    return "\n".join(lines).rstrip() + "\n"


# ---- tables ------------------------------------------------------------------------------
def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)[:60]
    return "-" if value is None else str(value)


def table(rows: list[dict], keys: list[str] | None = None) -> list[str]:
    keys = keys or list(dict.fromkeys(k for r in rows for k in r
                                      if not isinstance(r[k], (list, dict))))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        out.append(f"\n({len(rows) - MAX_ROWS} more rows in the results file)")
    return out + [""]


def render_generic(summary: dict, where: Where, name: str) -> list[str]:
    """Each list of records as a table, each mapping of scalars as one, nested mappings as
    a table with a row per key."""
    lines: list[str] = []
    for key, value in summary.items():
        rows = _rows(value)
        if rows:
            lines += [f"**{key}**", ""] + table(rows)
    return lines


def _rows(value: Any) -> list[dict]:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return value
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        if all(isinstance(vv, dict) for v in value.values() for vv in v.values()):
            return [{"": f"{k} {kk}", **vv} for k, v in value.items() for kk, vv in v.items()]
        return [{"": k, **v} for k, v in value.items()]
    if isinstance(value, dict) and value and not any(isinstance(v, dict) for v in value.values()):
        return [value]
    return []


# ---- sections with their own shape --------------------------------------------------------
SCALE_ROWS = [("period_cpu_ms", "all work per 0.1 s period, CPU p50 (ms)"),
              ("period_cpu_direct_ms", "... with direct reports (ms)"),
              ("tick_p50_ms", "the tick alone, p50 (ms)"),
              ("rollout_period_cpu_ms", "rolling replacement: work per period (ms)"),
              ("rollout_tick_ms", "rolling replacement: the loop held, p50 (ms)"),
              ("scaleup_s", "0 -> N (s, controller time)"),
              ("cpu_us_per_start", "CPU per start, a full collection counted (us)"),
              ("scaleup_cpu_us_per_replica", "CPU per start, without it (us)"),
              ("push_batched_us", "CPU per report, node batches (us)"),
              ("push_us", "CPU per report, direct (us)")]


def render_scale(summary: dict, where: Where, name: str) -> list[str]:
    figures = summary["figures"]
    sizes = sorted({int(n) for by_n in figures.values() for n in by_n})
    rows = []
    for key, label in SCALE_ROWS:
        for system in figures:
            values = [figures[system].get(str(n), {}).get(key) for n in sizes]
            if any(v is not None for v in values):
                rows.append({"figure": label, "system": system,
                             **{f"N={n}": v for n, v in zip(sizes, values)}})
    config = summary.get("config", {})
    lines = [f"fleetplane's replicas report every {config.get('report_interval_s', '?')} s "
             f"(the product's default), through node batches; Serve checks each replica's "
             f"health every {config.get('health_check_period_s', 10)} s inside `update()`.", ""]
    lines += table(rows)
    png = report_plots.scale(figures, where.plots / f"{name}.png")
    return lines + where.image(png, "the work per period against N, both systems")


def render_health_push(summary: dict, where: Where, name: str) -> list[str]:
    config = summary.get("config", {})
    lines = [f"{config.get('replicas', '?')} simulated replicas reporting every "
             f"{config.get('report_interval_s', '?')} s, health period "
             f"{config.get('period_s', '?')} s.", ""]
    return lines + table([{"mode": mode, **figs} for mode, figs in summary["figures"].items()])


RENDERERS: dict[str, Callable[[dict, Where, str], list[str]]] = {
    "scale": render_scale, "health_push": render_health_push,
}


# ---- the file -------------------------------------------------------------------------------
def write(measured: Path, out: Path) -> list[str]:
    """Write ``out`` from ``measured``; the names of the sections written."""
    results = load(measured)
    where = Where(measured / "plots", out.parent)
    known = [(n, t, a) for n, t, a in SECTIONS if n in results]
    known += [(n, n.replace("_", " "), "") for n in results if n not in dict.fromkeys(
        s[0] for s in SECTIONS)]
    parts = ["# fleetplane: measured", "",
             f"Generated by `python -m release_tests.report` from `{_rel_or(measured)}/*.json`;"
             " do not edit by hand. Each section names the command that produced it and the "
             "commit, date and machine it ran on; rerun that command, then this one, to "
             "refresh it.", ""]
    parts += [f"- [{t}](#{_anchor(t)})" for _, t, _ in known] + [""]
    parts += [section(n, t, a, results[n], where) for n, t, a in known]
    out.write_text("\n".join(parts))
    return [n for n, _, _ in known]


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


def _rel_or(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", type=Path, default=HERE / "measured")
    p.add_argument("--out", type=Path, default=ROOT / "MEASURED.md")
    p.add_argument("--smoke", action="store_true",
                   help="from the smoke runs' results, written beside them (the suite's)")
    args = p.parse_args(argv)
    if args.smoke:
        args.measured = folders(smoke=True)[0]
        args.out = args.measured / "MEASURED.md"
        if not any(args.measured.glob("*.json")):  # on its own: one result to render
            subprocess.run([sys.executable, "-m", "release_tests.scale", "--smoke"], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
    names = write(args.measured, args.out)
    print(f"{args.out}: {len(names)} sections ({', '.join(names)})")
    if args.smoke:
        record("report", {"sections": names, "out": str(args.out)}, smoke=True)
    return 0 if names else 1


if __name__ == "__main__":
    sys.exit(main())
