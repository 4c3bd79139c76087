"""MEASURED.md's section for ``release_tests.llm_routing``: the setup, the issue's bars with
what was measured, a table per workload and the TTFT and throughput plots."""

from __future__ import annotations

from release_tests import report_plots
from release_tests.report_tables import Where, table

COLUMNS = ["ingress", "policy", "load", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms",
           "throughput_rps", "hit_rate", "max_mean_load", "failed", "decision_p99_ms"]


def _warmups(setup: dict) -> str:
    """The warm-up before each point (a run from before ``session_warmup_s`` had one)."""
    if setup.get("session_warmup_s") is None:
        return f"{setup.get('warmup_s')} s warm-up"
    return (f"warm-up of {setup['session_warmup_s']} s for shared prefixes (their chat "
            f"sessions' steady mix of turns) and {setup.get('warmup_s')} s for random prompts")


def _rounds(setup: dict) -> str:
    rounds = setup.get("random_rounds") or 1
    return (f"; at 0.8, {rounds} rounds of every policy in turn, each policy's pooled"
            if rounds > 1 else "")


def render_llm_routing(summary: dict, where: Where, name: str) -> list[str]:
    setup = summary.get("setup", {})
    lines = [f"{setup.get('replicas')} replicas of `VLLMServer` on the engine simulator, "
             f"calibrated to {setup.get('calibration')}, its clock {setup.get('speedup')}x "
             f"GB10's (times are the sped-up ones), {setup.get('slots')} sequences and a "
             f"prefix cache of {setup.get('cache_blocks')} 16-token blocks each; "
             f"max_ongoing_requests {setup.get('max_ongoing_requests')}. Capacity (requests/s "
             f"p2c completes, closed loop): {_capacities(summary)}. Loads are fractions of "
             f"it, Poisson, {setup.get('seconds')} s measured (random prompts: "
             f"{setup.get('random_seconds', setup.get('seconds'))} s{_rounds(setup)}) "
             "after a "
             f"{_warmups(setup)} on reset engines. HAProxy's p2c and kv_load "
             "are its leastconn (it sees no KV-cache use).", ""]
    if summary.get("criteria"):
        lines += ["What the issue asked, and what this run measured:", ""]
        lines += table([{**c, "met": "yes" if c["met"] else "NO"}
                        for c in summary["criteria"]])
    for workload, ingresses in summary.get("results", {}).items():
        rows = [{"ingress": ingress, "policy": policy, "load": load, **stats}
                for ingress, policies in ingresses.items()
                for policy, loads in policies.items() for load, stats in loads.items()]
        lines += [f"**{workload}**", ""] + table(rows, COLUMNS)
    lines += _plots(summary, where, name)
    ramps = summary.get("throughput_at_equal_p99") or {}
    ramp_rows = [{"ingress": ingress, "policy": policy, "p99 budget (ms)":
                  r["budget_e2e_p99_ms"], "throughput at it (req/s)": r["throughput_rps"],
                  **_ramp_reading(r)}
                 for ingress, by_policy in ramps.items() for policy, r in by_policy.items()]
    if ramp_rows:
        lines += ["Throughput at equal p99 (shared prefix: each policy at rising loads until "
                  "its end-to-end p99 passes p2c's at 0.8; read on the line between the "
                  "last load within the budget and the first past it, where a run has "
                  "`between_loads`):", ""] + table(ramp_rows)
    for key, what, column in (("two_proxies", "One proxy against two", "proxies"),
                              ("two_haproxies", "One node's HAProxy against two nodes' "
                               "(peers; each request to either node at random)", "haproxies")):
        if summary.get(key):
            lines += [f"{what} (prefix, shared prefix, 0.8):", ""]
            lines += table([{column: k, **v} for k, v in summary[key].items()],
                           [column, "hit_rate", "ttft_p50_ms", "ttft_p99_ms",
                            "throughput_rps"])
    return lines


def _ramp_reading(ramp: dict) -> dict:
    """Each load tried, with its end-to-end p99 (ms), and where the throughput was read (runs
    before the line was drawn took the best point within the budget: no ``between_loads``)."""
    tried = ", ".join(f"{p.get('load', 0.8):g}: {p['e2e_p99_ms']:,.0f}" for p in ramp["points"])
    between = ramp.get("between_loads")
    return {"e2e p99 by load": tried,
            "read between loads": "-".join(f"{x:g}" for x in between) if between
            else "best point within"}


AUTOSCALE_COLUMNS = ["system", "replica_seconds", "failed", "requests", "held", "held_wait_s",
                     "hinted",
                     "cold_starts", "slo_windows_met", "first_answer_after_start_s",
                     "measured_start_s"]


def render_llm_autoscale(summary: dict, where: Where, name: str) -> list[str]:
    first, last = summary.get("hours", [0, 24])
    lines = [f"Hours {first}-{last} of the day trace (seed {summary.get('seed')}, peak "
             f"{summary.get('peak_rps')} requests/s), simulated GB10 engines (8 tokens/s, 4 "
             "slots, 120-300 s loads) in virtual time; each row's `autoscaling_config` is "
             "in the results file. The data plane is the same for every row (fleetplane's "
             f"router, {_ongoing(summary)}); the policies are their own code (Serve's from "
             "`ray.serve`).", ""]
    if summary.get("criteria"):
        lines += ["What the issue asked (judged on the `fleetplane` row, its defaults), and "
                  "what this run measured:", ""]
        lines += table([{**c, "met": "yes" if c["met"] else "NO"}
                        for c in summary["criteria"]])
    results = summary.get("results", {})
    lines += table([{"system": k, **v} for k, v in results.items()], AUTOSCALE_COLUMNS)
    if "foresight" in results:
        lines += ["`foresight` is no policy but a yardstick: the LLM policy's Erlang bound on "
                  "the rate the arrivals were drawn at, 300 s ahead (the longest load), "
                  "applied at once. What it misses, the bound itself misses; the gap to "
                  "`fleetplane` is what estimating the demand and reacting to it cost.", ""]
    series = {k: [(i * 5 / 60 + first, n) for i, n in enumerate(v.get(
        "replicas_every_5min", []))] for k, v in results.items()}
    png = report_plots.timeline(series, where.plots / f"{name}_replicas.png", "hour of day",
                                "replicas", "Replicas held (loading, serving, draining)")
    lines += where.image(png, "replicas over the day, per policy")
    ttft = {k: [(first + h, v) for h, v in enumerate(r.get("ttft_p99_by_hour_s", []))
                if v is not None] for k, r in results.items()}
    png = report_plots.timeline(ttft, where.plots / f"{name}_ttft.png", "hour of day",
                                "TTFT p99 (s)", "TTFT p99 per hour")
    lines += where.image(png, "TTFT p99 per hour, per policy")
    return lines + _by_seed(summary.get("by_seed") or {}, where, name)


def _ongoing(summary: dict) -> str:
    """The data plane's queue: a run from before the setting was recorded let 8 in."""
    n, slots = summary.get("max_ongoing_requests", 8), summary.get("slots", 4)
    return (f"`max_ongoing_requests` {n} a replica: "
            + (f"its engine's {slots} slots, the router holding the rest" if n <= slots else
               f"{n - slots} beyond the engine's {slots} slots wait in that engine's queue"))


def _by_seed(by_seed: dict, where: Where, name: str) -> list[str]:
    """Every row on every day drawn: a table and the cost-against-SLO plot."""
    seeds = sorted({seed for days in by_seed.values() for seed in days}, key=int)
    if len(seeds) < 2:
        return []
    rows = [{"system": system, **{f"seed {seed}": _day(days.get(seed)) for seed in seeds}}
            for system, days in by_seed.items()]
    lines = ["Each row on every day drawn (replica-seconds as a multiple of Serve's default "
             "policy's that day / share of windows within the SLO / failed):", ""]
    lines += table(rows)
    points = {system: [(d["vs_serve"], d["slo_windows_met"]) for d in days.values()]
              for system, days in by_seed.items()}
    png = report_plots.scatter(points, where.plots / f"{name}_cost_slo.png",
                               "replica-seconds / Serve default's (same day)",
                               "share of windows within the TTFT SLO",
                               "Cost against SLO, one point per day",
                               hlines={"SLO bar 0.95": 0.95}, vlines={"cost bar 0.8": 0.8})
    return lines + where.image(png, "cost against SLO per policy and day")


def _day(day: dict | None) -> str:
    if not day:
        return ""
    return f"{day['vs_serve']}x / {day['slo_windows_met']} / {day['failed']}"


def _capacities(summary: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in summary.get("capacity_rps", {}).items())


def _plots(summary: dict, where: Where, name: str) -> list[str]:
    out = []
    for metric, label in (("ttft_p50_ms", "TTFT p50 (ms)"), ("hit_rate", "prefix-cache hit rate")):
        groups = {f"{workload}, {ingress}": {policy: loads.get("0.8", {}).get(metric)
                                             for policy, loads in policies.items()}
                  for workload, ingresses in summary.get("results", {}).items()
                  for ingress, policies in ingresses.items()}
        png = report_plots.bars(groups, where.plots / f"{name}_{metric}.png", label,
                                f"{label} at 0.8 of capacity, per policy")
        out += where.image(png, f"{label} per policy")
    return out


def render_llm_autoscale_frontier(summary: dict, where: Where, name: str) -> list[str]:
    rows, peak = summary.get("points", []), summary.get("peak_rps")
    seeds = ", ".join(str(s) for s in summary.get("seeds", []))
    lines = [f"`llm_autoscale`'s day (hours {summary.get('hours')}, simulated GB10 engines) on "
             f"the days of seeds {seeds}, each point one `autoscaling_config`; cost is "
             "replica-seconds as a multiple of Serve's default policy's on the same day and "
             f"peak (the mean over days), the SLO the share of {summary.get('window_s'):g} s "
             f"windows whose TTFT p99 is within {summary.get('ttft_slo_s'):g} s (the mean "
             "over days, and the worst day). Not judged: it shows where the published day "
             "sits on each policy's curve.", "",
             f"Along each policy's own knob, at the published peak ({peak} requests/s):", ""]
    knobs = [r for r in rows if r["peak_rps"] == peak]
    lines += table([{**_point(r), "per day": ", ".join(f"{s}: {v}x" for s, v in
                                                      r["vs_serve_by_seed"].items())}
                    for r in knobs])
    series: dict[str, list[tuple[float, float]]] = {}
    notes: dict[str, list[str]] = {}
    for r in sorted(knobs, key=lambda r: r["value"]):
        key = f"{r['system']} ({r['knob']})"
        series.setdefault(key, []).append((r["vs_serve"], r["slo_windows_met"]))
        notes.setdefault(key, []).append(f"{r['value']:g}")
    png = report_plots.scatter(series, where.plots / f"{name}_knobs.png",
                               "replica-seconds / Serve default's (mean over days)",
                               "share of windows within the TTFT SLO (mean)",
                               f"Cost against SLO along each knob, peak {peak}/s",
                               hlines={"SLO bar 0.95": 0.95}, vlines={"cost bar 0.8": 0.8},
                               notes=notes)
    lines += where.image(png, "cost against SLO along each policy's knob")
    defaults = sorted((r for r in rows if r["default"]), key=lambda r: r["peak_rps"])
    if len({r["peak_rps"] for r in defaults}) > 1:
        lines += ["Both defaults across the day's peak rate (the same shape, busier or "
                  "quieter):", ""]
        lines += table([_point(r) for r in defaults])
        panels = {"replica-seconds / Serve default's": {
                      "fleetplane": [(r["peak_rps"], r["vs_serve"]) for r in defaults
                                     if r["system"] == "fleetplane"]},
                  "windows within the TTFT SLO (mean over days)": {
                      system: [(r["peak_rps"], r["slo_windows_met"]) for r in defaults
                               if r["system"] == system] for system in ("fleetplane", "serve")}}
        png = report_plots.panels(panels, where.plots / f"{name}_peaks.png",
                                  "peak requests/s")
        lines += where.image(png, "both defaults across the peak rate")
    return lines


def _point(r: dict) -> dict:
    return {"system": r["system"], "knob": f"{r['knob']} {r['value']:g}"
            + (" (default)" if r["default"] else ""), "peak": r["peak_rps"],
            "vs Serve's default": f"{r['vs_serve']}x",
            "SLO windows (mean / worst day)": f"{r['slo_windows_met']} / {r['slo_worst']}",
            "failed": r["failed"]}
