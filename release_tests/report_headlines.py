"""The README's headline figures, written by ``release_tests.report`` from the same results
files as MEASURED.md, between two markers in README.md: a figure in the README is one a
command measured, with a link to its section (command, commit, date, machine).

Each row is a function of the results (``{name: results file}``) that returns its cells,
or None when a result it needs is missing (the row is left out, not guessed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from release_tests.report_tables import fmt

BEGIN = "<!-- headline figures: written by `python -m release_tests.report`; do not edit -->"
END = "<!-- end of headline figures -->"
Row = Callable[[dict[str, dict]], "tuple[str, ...] | None"]  # what, ours, Serve's[, ratio]


def _x(a: float, b: float) -> str:
    """``a`` over ``b`` as "2.9x"."""
    if not b:
        return "-"
    return f"{a / b:.1f}x" if a / b < 10 else f"{a / b:,.0f}x"


def _summary(results: dict[str, dict], name: str) -> dict | None:
    result = results.get(name)
    return result["summary"] if result else None


def http(results: dict[str, dict]) -> tuple[str, str, str] | None:
    s = _summary(results, "http_bench")
    if not s:
        return None
    rps = {k: v["requests_per_s"] for k, v in s["systems"].items()}
    need = ("fleetplane", "ray-serve-2.60", "fleetplane-haproxy", "ray-serve-2.60-haproxy")
    if not all(k in rps for k in need):
        return None
    return ("no-op HTTP, requests/s, one listener each: proxy / HAProxy (Serve's HAProxy with "
            "its throughput mode, as its guide pairs them)",
            f"{rps['fleetplane']:,.0f} / {rps['fleetplane-haproxy']:,.0f}",
            f"{rps['ray-serve-2.60']:,.0f} / {rps['ray-serve-2.60-haproxy']:,.0f}",
            f"{_x(rps['fleetplane'], rps['ray-serve-2.60'])} / "
            f"{_x(rps['fleetplane-haproxy'], rps['ray-serve-2.60-haproxy'])}")


def _scale(results: dict[str, dict], key: str, label: str, unit: str, steady: bool = False):
    s = _summary(results, "scale")
    if not s:
        return None
    figures = s["figures"]
    sizes = sorted({int(n) for by_n in figures.values() for n in by_n})
    if not sizes or "serve" not in figures or "fleetplane" not in figures:
        return None
    n = str(sizes[-1])
    a, b = (figures[system].get(n, {}).get(key) for system in ("fleetplane", "serve"))
    if a is None or b is None:
        return None
    interval = figures["fleetplane"][n].get("report_interval_s")
    reports = f" (reports every {fmt(interval)} s, the default)" if steady else ""
    return (f"{label}, {int(n):,} replicas{reports}", f"{fmt(a)} {unit}", f"{fmt(b)} {unit}",
            f"{_x(b, a)} less")


def steady(results: dict[str, dict]):
    return _scale(results, "period_cpu_ms", "controller CPU per 0.1 s period, steady "
                  "(tick + the period's reports)", "ms", steady=True)


def rollout(results: dict[str, dict]):
    s = _summary(results, "scale")
    figures = (s or {}).get("figures", {})
    if "fleetplane" not in figures or "serve" not in figures:
        return None
    n = str(max(int(k) for k in figures["fleetplane"]))
    a, b = figures["fleetplane"].get(n, {}), figures["serve"].get(n, {})
    if None in (a.get("replace_s"), b.get("replace_s"), a.get("rollout_tick_ms"),
                b.get("rollout_tick_ms")):
        return None
    return (f"a rolling replacement of all {int(n):,} replicas (20% batches, replicas ready "
            f"at once): controller time / the loop held, p50",
            f"{fmt(a['replace_s'])} s / {fmt(a['rollout_tick_ms'])} ms",
            f"{fmt(b['replace_s'])} s / {fmt(b['rollout_tick_ms'])} ms",
            f"{_x(b['replace_s'], a['replace_s'])} / "
            f"{_x(b['rollout_tick_ms'], a['rollout_tick_ms'])} less")


def per_start(results: dict[str, dict]):
    return _scale(results, "cpu_us_per_start", "controller CPU per replica started (full "
                  "collection counted)", "µs")


def health(results: dict[str, dict]):
    s = _summary(results, "health_push")
    batched = (s or {}).get("figures", {}).get("batched")
    if not batched:
        return None
    return (f"replica health through Ray, {batched['replicas']:,} replicas in node batches: "
            f"freshness misses, shard CPU per update",
            f"{100 * batched['miss_rate']:.2f}%, {batched['controller_cpu_us_per_update']:.1f} µs",
            "")


def drains(results: dict[str, dict]):
    s = _summary(results, "drain_events")
    if not s:
        return None
    table = s["table"]
    sent = sum(v.get("sent", 0) for v in table.values() if isinstance(v, dict))
    return (f"failed requests over {len(s['events'])} scale, rollout, replacement and reload "
            f"events behind HAProxy (POSTs)", f"{table['failed_total']} of {sent:,}", "")


def chaos(results: dict[str, dict]):
    s = _summary(results, "chaos")
    if not s:
        return None
    by_kind = s["by_kind"]
    sent = sum(v["sent"] for v in by_kind.values())
    return (f"failed requests over {sum(v['kills'] for v in by_kind.values())} SIGKILLs under "
            f"load, by what was killed (a killed proxy or replica fails what it held)",
            ", ".join(f"{kind} {v['failed']}" for kind, v in by_kind.items())
            + f" (of {sent:,})", "")


def node_drains(results: dict[str, dict]):
    s = _summary(results, "node_churn")
    if not s:
        return None
    t = s["table"]
    return (f"failed requests over {t['events']} node drains and rejoins ({t['ingress']} "
            f"ingress, POSTs)", f"{t['failed']} of {t['sent']:,}", "")


def soak(results: dict[str, dict]):
    s = _summary(results, "soak")
    if not s:
        return None
    types = s["types"]
    sent = sum(t["requests"] for t in types.values())
    return (f"a {s['load']['duration_s']:g} s locust soak (steady users, bursts, "
            f"{s['load']['stream_chunks'] * s['load']['stream_every_s']:g} s streams): failed",
            f"{s['failed']} of {sent:,}", "")


def overload(results: dict[str, dict]):
    s = _summary(results, "overload_idle")
    rows = {r["system"]: r for r in (s or {}).get("table", [])}
    if "fleetplane" not in rows or "ray-serve-2.60" not in rows:
        return None
    a, b = rows["fleetplane"]["utilisation"], rows["ray-serve-2.60"]["utilisation"]
    return ("a saturated replica's slots kept busy (2 slots, 0.5 s handler, 20 requests/s "
            "offered, one proxy each)", f"{a:.0%}", f"{b:.0%}", _x(a, b))


def startup(results: dict[str, dict]):
    s = _summary(results, "startup")
    if not s or "running_s" not in s["medians"]:
        return None
    return (f"`fleetplane run {s['config']}` to all {s.get('replicas')} replicas RUNNING "
            f"(median of {s['runs']})", f"{s['medians']['running_s']:.1f} s", "")


def llm_routing(results: dict[str, dict]):
    s = _summary(results, "llm_routing")
    shared = (s or {}).get("results", {}).get("shared_prefix", {})
    cells = []
    for ingress in ("proxy", "haproxy"):
        policies = shared.get(ingress, {})
        base = policies.get("p2c", {}).get("0.8")
        best = min((policies[p]["0.8"]["ttft_p50_ms"] for p in ("prefix", "prefix_kv")
                    if "0.8" in policies.get(p, {})), default=None)
        if base and best:
            cells.append((ingress, best, base["ttft_p50_ms"]))
    if not cells:
        return None
    return ("LLM time to first token p50, prefix routing against power of two choices "
            "(shared prefixes, 0.8 of capacity, simulated GB10 engines sped up): "
            + " / ".join(c[0] for c in cells),
            " / ".join(f"{c[1]:.0f} vs {c[2]:.0f} ms ({1 - c[1] / c[2]:.0%} less)"
                       for c in cells), "")


ROWS: list[tuple[str, Row]] = [  # (the MEASURED.md section it links to, the row)
    ("http_bench", http), ("scale", steady), ("scale", rollout), ("scale", per_start),
    ("overload_idle", overload), ("health_push", health), ("drain_events", drains),
    ("node_churn", node_drains), ("chaos", chaos), ("soak", soak), ("startup", startup),
    ("llm_routing", llm_routing),
]


def block(results: dict[str, dict], anchors: dict[str, str]) -> str:
    """The Markdown between the markers."""
    lines = [BEGIN, "", "| | fleetplane | Ray Serve 2.60 | ratio | measured by |",
             "|---|---|---|---|---|"]
    for name, row in ROWS:
        cells = row(results)
        if cells:
            what, ours, serve, ratio = (*cells, "")[:4]
            link = f"[{name}](MEASURED.md#{anchors.get(name, name)})"
            lines.append(f"| {what} | {ours} | {serve or '-'} | {ratio or '-'} | {link} at "
                         f"{results[name].get('commit')} |")
    return "\n".join(lines + ["", END])


def rewrite(readme: Path, results: dict[str, dict], anchors: dict[str, str]) -> bool:
    """Replace the block between the markers in ``readme``; False when it has none."""
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        return False
    readme.write_text(pattern.sub(lambda _: block(results, anchors), text, count=1))
    return True
