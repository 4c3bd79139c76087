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
import ast
import json
import subprocess
import sys
from pathlib import Path

from release_tests import report_headlines
from release_tests.report_sections import RENDERERS
from release_tests.report_tables import Where, render_generic
from release_tests.results import HERE, ROOT, folders, record

# (name, title, what it measures). Results without an entry here follow, by name.
SECTIONS = [
    ("startup", "Start-up: the README's first command",
     "From the command to every replica RUNNING, on a fresh embedded Ray each run."),
    ("http_bench", "HTTP throughput beside Ray Serve",
     "The same no-op deployment behind each system's ingress, one listener each, driven "
     "by wrk on loopback; each system started fresh for each run."),
    ("scale", "The control plane at scale, beside Ray Serve",
     "fleetplane's shard and Ray Serve 2.60's controller state at the same N replicas, in "
     "process, fake replicas, at the products' defaults: the steady column is all the work "
     "of one 0.1 s period (tick, plus the ingest of the reports that arrive in it) beside "
     "Serve's `update()` (its health sweep included)."),
    ("health_push", "Replica health through Ray: node batches and direct reports",
     "A real shard actor and simulated replicas (2,048 per process, each process a node): "
     "shard CPU per health update and how many freshness deadlines were missed."),
    ("drain_events", "Drains behind HAProxy",
     "A 4-replica deployment in `ingress: haproxy` under keep-alive POST load (HAProxy "
     "never replays a POST it sent), with scale-downs, rollouts, replacements and HAProxy "
     "reloads in turn: the requests each event failed."),
    ("drain_events_nophase1", "Drains behind HAProxy, phase 1 off (what it prevents)",
     "The same with `ReplicaSettings.deregister_before_stop` off."),
    ("node_churn", "Node drains",
     "A local multi-node Ray under POST load; each event SIGTERMs a worker's `ray start "
     "--block` (a drain, as a spot interruption) and starts it again."),
    ("chaos", "Kills under load: what survives what",
     "Steady load on `fleetplane run`, one SIGKILL of a random control actor or replica at "
     "a time: failed requests, replicas restarted and time to recover per kind. A killed "
     "proxy or replica fails the requests it held (their connections, their work); a "
     "killed controller, shard or reporter should fail none."),
    ("soak", "Mixed traffic for minutes (locust)",
     "locust, headless: steady users, bursts from a load shape, and long streams read to "
     "their end, against one `fleetplane run`."),
    ("overload_idle", "A saturated replica stays busy",
     "One replica, 2 slots, a 0.5 s handler, 20 requests/s offered: completions per "
     "second, both systems with one proxy."),
    ("retry_after_http", "Retry-After on real HTTP, beside Ray Serve",
     "One 0.5 s replica per policy behind one proxy with a queue of 4 on both systems; "
     "seeded Poisson arrivals; a rejected client retries once, after the Retry-After it got."),
    ("retry_after_eval", "Is the Retry-After good advice? (virtual time)",
     "The real router in virtual time on open-loop load shapes, each policy on the same "
     "arrivals."),
    ("http_abuse", "HTTP abuse and the proxy's memory",
     "One proxy under abuse (huge bodies, huge heads, slowloris, idle and malformed "
     "connections) beside a normal client."),
    ("llm_day", "An LLM server's day: the health check against seed 001",
     "A simulated vLLM engine through the day seed 001 tells (bursts, long prefills, JIT "
     "stalls), the health check and restart policy under a fake clock."),
    ("llm_routing", "LLM-aware routing on simulated GB10 engines",
     "Prefix-cache and KV-load routing against power of two choices and round robin, "
     "through the proxy and through HAProxy, on engines that cache prefixes as vLLM does."),
    ("llm_autoscale", "LLM autoscaling and scale to zero over a day (virtual time)",
     "fleetplane's LLM policy with scale to zero against Ray Serve 2.60's default policy, "
     "on the same day trace, data plane and simulated GB10 engines."),
    ("llm_autoscale_frontier", "LLM autoscaling: cost against SLO along each knob and peak",
     "`llm_autoscale`'s day, each policy along its own knob and both defaults across the "
     "day's peak rate, on several days each."),
    ("serve_compat_diff", "The same Serve applications under Serve and fleetplane",
     "Each request sent to both, on one local Ray; differences by design are named."),
    ("head_loss", "The head node dies and comes back",
     "3 nodes on loopback, the head's GCS on a real Redis; open-loop GET and POST on every "
     "node's listener; the head's Ray processes SIGKILLed, down 30 s, started again on the "
     "same Redis; then a worker's replica killed to see reconcile act. The head's own "
     "listener's failures are counted apart."),
    ("head_loss_haproxy", "The head node dies and comes back, haproxy mode",
     "The same drill with `ingress: haproxy`."),
    ("head_loss_workers", "The head node dies and comes back, control plane on workers",
     "The same drill with `fleetplane run --control-plane-on workers`: the controller, "
     "shards and facade off the head, so the head's restart does not restart them."),
    ("chaos_head", "Kills under load on a cluster, the head node among them",
     "`release_tests.chaos --kinds head,...` on a 3-node cluster with GCS fault tolerance "
     "(Redis): the load on a worker node's listener; a head kill is 10 s down and back on "
     "the same Redis, its recovery time counted from the kill."),
    ("serve_tools", "Ray Serve's own tools against fleetplane",
     "Ray's `serve` CLI, KubeRay's RayService call sequence and a driver without fleetplane "
     "installed, through fleetplane's own Serve API listener (embedded Ray) and through Ray's "
     "dashboard (`ray start --head`); a driver's handle calls through the bridge and direct, "
     "sequential, on the demo's `api.add`."),
    ("scale_compare", "Two commits side by side",
     "The control plane's costs at two commits, alternating runs in one go."),
]


def load(measured: Path) -> dict[str, dict]:
    """Every results file but this command's own (its smoke run records itself)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(measured.glob("*.json"))
            if p.stem != "report"}


def provenance(result: dict) -> str:
    m = result.get("machine", {})
    dirty = " (with uncommitted changes)" if result.get("dirty") else ""
    return (f"`{result.get('command', '?')}` at {result.get('commit') or 'an unknown commit'}"
            f"{dirty}, {result.get('date', '?')}, on {m.get('cpu', '?')}, {m.get('cores', '?')}"
            f" cores, {m.get('memory_gib', '?')} GiB, Python {m.get('python', '?')}.")


# Found after a section's run, at the commit it ran at: said under its provenance until a
# later run replaces it ((section, commit) -> what the reader should know).
FOUND_SINCE: dict[tuple[str, str], str] = {}


def section(name: str, title: str, about: str, result: dict, where: Where) -> str:
    lines = [f"## {title}", "", provenance(result), ""]
    found = FOUND_SINCE.get((name, str(result.get("commit"))[:7]))
    if found:
        lines += [f"**{found}**", ""]
    if about:
        lines += [about, ""]
    render = RENDERERS.get(name, render_generic)
    lines += render(result["summary"], where, name)
    return "\n".join(lines).rstrip() + "\n"


# ---- the file -------------------------------------------------------------------------------
def write(results: dict[str, dict], measured: Path, out: Path) -> list[tuple[str, str]]:
    """Write ``out`` from ``results`` (read from ``measured``); (name, title) per section."""
    where = Where(measured / "plots", out.parent)
    known = [(n, t, a) for n, t, a in SECTIONS if n in results]
    known += [(n, n.replace("_", " "), "") for n in results if n not in dict.fromkeys(
        s[0] for s in SECTIONS)]
    parts = ["# fleetplane: measured", "",
             f"Generated by `python -m release_tests.report` from `{_rel_or(measured)}/*.json`;"
             " do not edit by hand. Each section names the command that produced it and the "
             "commit, date and machine it ran on; rerun that command, then this one, to "
             "refresh it.", ""]
    parts += [f"- [{t}](#{_anchor(t)})" for _, t, _ in known]
    parts += ["- [The commands](#the-commands)", ""]
    parts += [section(n, t, a, results[n], where) for n, t, a in known]
    parts += commands()
    out.write_text("\n".join(parts))
    return [(n, t) for n, t, _ in known]


def commands() -> list[str]:
    """Every release test with the first line of its docstring (what it measures)."""
    lines = ["## The commands", "",
             "Each ends by recording its results (`release_tests/measured/NAME.json`, raw rows as "
             "Parquet under `release_tests/results/`); `--smoke` runs it small (the test suite "
             "runs every one so), `--help` gives its options.", "",
             "| command | measures |", "|---|---|"]
    for path in sorted(HERE.glob("*.py")):
        text = path.read_text()
        if '__name__ == "__main__"' in text and path.stem not in ("serve_baseline",):
            lines.append(f"| `python -m release_tests.{path.stem}` | {_gist(text)} |")
    return lines + [""]


def _gist(source: str, limit: int = 220) -> str:
    """A module docstring's first paragraph as one line, cut after a sentence near ``limit``."""
    doc = (ast.get_docstring(ast.parse(source)) or "").strip()
    text = " ".join(doc.split("\n\n")[0].split()).replace("``", "`")
    if len(text) > limit:
        cut = text.rfind(". ", 0, limit)
        text = text[:cut + 1] if cut > 0 else text[:limit] + "..."
    return text.replace("|", "\\|")


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
    p.add_argument("--readme", type=Path, default=None,
                   help="whose headline figures (between their markers) are rewritten "
                   "(default: README.md when --measured is the default, else none)")
    p.add_argument("--smoke", action="store_true",
                   help="from the smoke runs' results, written beside them (the suite's)")
    args = p.parse_args(argv)
    if args.smoke:
        args.measured = folders(smoke=True)[0]
        args.out = args.measured / "MEASURED.md"
        args.readme = args.measured / "README.md"
        args.readme.parent.mkdir(parents=True, exist_ok=True)
        args.readme.write_text(f"{report_headlines.BEGIN}\n{report_headlines.END}\n")
        if not any(args.measured.glob("*.json")):  # on its own: one result to render
            subprocess.run([sys.executable, "-m", "release_tests.scale", "--smoke"], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
    if args.readme is None and args.measured == HERE / "measured":
        args.readme = ROOT / "README.md"
    results = load(args.measured)
    written = write(results, args.measured, args.out)
    names = [n for n, _ in written]
    print(f"{_rel_or(args.out)}: {len(names)} sections ({', '.join(names)})")
    anchors = {n: _anchor(t) for n, t in written}
    if args.readme is None:
        return 0 if names else 1
    if not report_headlines.rewrite(args.readme, results, anchors):
        print(f"{_rel_or(args.readme)}: no headline markers; not rewritten", file=sys.stderr)
        return 1
    print(f"{_rel_or(args.readme)}: headline figures rewritten")
    if args.smoke:
        record("report", {"sections": names, "out": str(args.out)}, smoke=True)
    return 0 if names else 1


if __name__ == "__main__":
    sys.exit(main())
