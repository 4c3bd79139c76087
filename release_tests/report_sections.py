"""MEASURED.md's sections with a shape of their own: each renderer takes a release test's
recorded summary and returns the section's Markdown lines (tables, ratios, plots).

``release_tests.report`` picks the renderer by the result's name (``RENDERERS``) and falls
back to a generic table per mapping. A renderer reads only its summary: a figure that is
not in the results file is not in the section.
"""

from __future__ import annotations

from typing import Any, Callable

from release_tests import report_plots
from release_tests.report_head_loss import render_head_loss
from release_tests.report_llm import (render_llm_autoscale, render_llm_autoscale_frontier,
                                      render_llm_routing)
from release_tests.report_tables import Where, fmt, table

Renderer = Callable[[dict, Where, str], list[str]]


# ---- the control plane at scale ----------------------------------------------------------
SCALE_ROWS = [("period_cpu_ms", "all work per 0.1 s period, CPU p50 (ms)"),
              ("period_cpu_direct_ms", "... with direct reports (ms)"),
              ("tick_p50_ms", "the tick alone, p50 (ms)"),
              ("replace_s", "rolling replacement of all N: controller time (s)"),
              ("rollout_tick_ms", "rolling replacement: the loop held, p50 (ms)"),
              ("rollout_period_cpu_ms", "rolling replacement: CPU per tick (ms; fleetplane: "
               "one tick of 32-transition slices, Serve: one update())"),
              ("scaleup_s", "0 -> N (s, controller time)"),
              ("cpu_us_per_start", "CPU per start, a full collection counted (us)"),
              ("scaleup_cpu_us_per_replica", "CPU per start, without it (us)"),
              ("push_batched_us", "CPU per report, node batches (us)"),
              ("push_us", "CPU per report, direct (us)"),
              ("pushes_per_tick", "reports per 0.1 s period"),
              ("scaledown_s", "N -> N/32 (s, controller time)"),
              ("shard_rss_mb", "memory of the state (RSS MB)"),
              ("status_ms", "status(), the full listing (ms)"),
              ("status_summary_ms", "status(summary=True) (ms)")]


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


# ---- HTTP --------------------------------------------------------------------------------
HTTP_PAIRS = [("fleetplane", "ray-serve-2.60", "proxy, one listener each, defaults"),
              ("fleetplane", "ray-serve-2.60-throughput", "proxy, Serve's throughput mode"),
              ("fleetplane-haproxy", "ray-serve-2.60-haproxy",
               "HAProxy, Serve's high-throughput pair of settings")]


def render_http_bench(summary: dict, where: Where, name: str) -> list[str]:
    systems = summary["systems"]
    lines = [f"wrk, one thread, {summary.get('connections')} keep-alive connections, "
             f"{summary.get('duration_s')} s per run, medians of {summary.get('runs')} runs "
             f"(systems alternating); {summary.get('deployment', '')}.", ""]
    lines += table([{"system": s, "setup": r["setup"], "requests/s": round(r["requests_per_s"]),
                     "p50 ms": r["p50_ms"], "p99 ms": r["p99_ms"], "p99.9 ms": r["p999_ms"],
                     "errors": r["errors"], "each run (req/s)": _joined(r["runs_requests_per_s"])}
                    for s, r in systems.items()])
    ratios = [f"- {label}: {a} / {b} = **{systems[a]['requests_per_s'] / systems[b]['requests_per_s']:.2f}x**"
              f" requests/s, p99 {systems[a]['p99_ms']:.2f} vs {systems[b]['p99_ms']:.2f} ms"
              for a, b, label in HTTP_PAIRS
              if a in systems and b in systems and systems[b]["requests_per_s"]]
    if ratios:
        lines += ["Ratios:", ""] + ratios + [""]
    if summary.get("asymmetries"):
        lines += ["Asymmetries that remain:", ""] + [f"- {a}" for a in summary["asymmetries"]]
        lines.append("")
    png = report_plots.cdf({s: r["cdf"] for s, r in systems.items() if r.get("cdf")},
                           where.plots / f"{name}.png", "latency of one request (ms, log)",
                           "latency CDF, the median run of each system")
    return lines + where.image(png, "latency CDF per system")


def render_soak(summary: dict, where: Where, name: str) -> list[str]:
    load = summary.get("load", {})
    lines = [f"{load.get('duration_s')} s of locust: {load.get('steady_users')} steady users "
             f"at {load.get('steady_rate')}/s each, +{load.get('burst_users')} burst users at "
             f"{load.get('burst_rate')}/s for {load.get('burst_for_s')} s every "
             f"{load.get('burst_every_s')} s, {load.get('stream_users')} users each reading a "
             f"{load.get('stream_chunks')}-line stream ({load.get('stream_every_s')} s apart) to "
             f"its end. Verdict: **{summary.get('verdict')}** ({summary.get('failed')} failed). "
             f"Ready in {summary.get('ready_s')} s, stopped in {summary.get('stop_s')} s.", ""]
    lines += table([{"type": t, **{k: v for k, v in r.items()}}
                    for t, r in summary["types"].items()])
    series = summary.get("series") or {}
    t = series.get("t_s", [])
    png = report_plots.panels(
        {"users": {"users": list(zip(t, series.get("users", [])))},
         "requests/s": {"requests/s": list(zip(t, series.get("requests_per_s", []))),
                        "failures": list(zip(t, series.get("failures", [])))},
         "p95 over 10 s (ms)": {k.removeprefix("p95_ms_"): [
             (x, y) for x, y in _points(t, series.get(k, [])) if y]  # 0: none sent
             for k in ("p95_ms_steady", "p95_ms_burst")}},
        where.plots / f"{name}.png", "seconds into the soak")
    return lines + where.image(png, "users, throughput and p95 over the soak")


# ---- drains and kills ---------------------------------------------------------------------
def render_drain_events(summary: dict, where: Where, name: str) -> list[str]:
    by_kind = {k: v for k, v in summary["table"].items() if isinstance(v, dict)}
    phase1 = summary["table"].get("phase1", True)
    lines = [f"Phase 1 of a replica's stop (deregistration before it closes) "
             f"**{'on' if phase1 else 'OFF'}**; {summary.get('rate')} POSTs/s over keep-alive "
             f"connections; deregistration window {summary.get('window_s')} s. Failed: "
             f"**{summary['table'].get('failed_total')}**.", ""]
    lines += table([{"event": k, **v} for k, v in by_kind.items()])
    idle = summary.get("idle_scale_down_s") or []
    if idle:
        lines += [f"Idle scale-down 4 -> 2 (deploy returned -> both gone): "
                  f"{', '.join(fmt(s) for s in idle)} s.", ""]
    png = _event_timelines(summary.get("timelines", []), where, name)
    return lines + where.image(png, "requests and latency through each kind of event")


def _event_timelines(chosen: list[dict], where: Where, name: str):
    series: dict[str, dict[str, list]] = {}
    for c in chosen:
        tl = c["timeline"]
        label = f"{c['kind']} #{c['index']} ({c['which']}, {c['failed']} failed)"
        per_s = [n / tl["bin_s"] for n in tl["sent"]]
        series.setdefault("answered per second", {})[label] = list(zip(tl["t_s"], per_s))
        series.setdefault("p50 latency (ms)", {})[label] = _points(tl["t_s"], tl["p50_ms"])
        if any(tl["failed"]):
            series.setdefault("failed per bin", {})[label] = list(zip(tl["t_s"], tl["failed"]))
    return report_plots.panels(series, where.plots / f"{name}.png", "seconds into the event")


def render_node_churn(summary: dict, where: Where, name: str) -> list[str]:
    t = summary["table"]
    lines = [f"{t.get('events')} drains and rejoins of worker nodes ({', '.join(summary.get('workers', []))}), "
             f"{t.get('ingress')} ingress, {t.get('rate')} POSTs/s, drain timeout "
             f"{t.get('drain_timeout_s')} s. Failed: **{t.get('failed')} of {t.get('sent')}**; "
             f"replicas moved off a draining node in a median {fmt(t.get('moved_s_median'))} s, "
             f"the node back and ready in {fmt(t.get('rejoined_s_median'))} s.", ""]
    lines += table(summary.get("events", []), ["index", "node", "replicas_on_node", "sent",
                                               "failed", "moved_s", "rejoined_s", "recovered"])
    chosen = [{"kind": "drain", "index": e["index"], "which": e["node"], **e}
              for e in summary.get("timelines", [])[:4]]
    png = _event_timelines(chosen, where, name)
    return lines + where.image(png, "requests and latency through node drains")


def render_http_abuse(summary: dict, where: Where, name: str) -> list[str]:
    lines = [f"The normal client's success under abuse: **{summary.get('normal_success_under_abuse')}**;"
             f" unexpected answers: {summary.get('unexpected') or 'none'}.", ""]
    lines += table(summary.get("table", []), ["phase", "seconds", "normal_requests",
                                               "normal_success", "p50_ms", "p99_ms",
                                               "peak_own_mb", "settled_own_mb"])
    lines += ["What each abuse got (status: count):", ""]
    lines += table([{"abuse": k, "expected": summary.get("expected", {}).get(k),
                     "got": ", ".join(f"{status} x{n}" for status, n in v.items())}
                    for k, v in summary.get("abuse", {}).items()])
    phases = summary.get("phases", [])
    png = report_plots.panels(
        {"the proxy's own memory (MB)": {p["phase"]: list(zip(p["memory_mb"]["t_s"],
                                                              p["memory_mb"]["own"]))
                                         for p in phases if p.get("memory_mb")}},
        where.plots / f"{name}_memory.png", "seconds into the phase")
    cdf = report_plots.cdf(
        {p["phase"]: [[100 * i / max(1, len(p["latency_cdf_ms"]) - 1), ms]
                      for i, ms in enumerate(p["latency_cdf_ms"])]
         for p in phases if p.get("latency_cdf_ms")},
        where.plots / f"{name}.png", "the normal client's latency (ms, log)",
        "the normal client's latency per phase")
    return lines + where.image(cdf, "latency per phase") + where.image(png, "memory per phase")


def render_chaos(summary: dict, where: Where, name: str) -> list[str]:
    lines = [f"{summary.get('rate')} requests/s, a kill every {summary.get('every_s')} s "
             f"(seed {summary.get('seed')}), kinds {', '.join(summary.get('kinds', []))}; "
             f"config `{summary.get('config')}`.", ""]
    lines += table([{"killed": k, **v} for k, v in summary["by_kind"].items()])
    tl = summary.get("timeline")
    png = None
    if tl:
        png = report_plots.panels(
            {"answered per second": {"answered": [(t, n / tl["bin_s"])
                                                  for t, n in zip(tl["t_s"], tl["sent"])]},
             "failed per bin": {"failed": list(zip(tl["t_s"], tl["failed"]))}},
            where.plots / f"{name}.png", "seconds into the load (dashed: a kill)",
            marks=[(k["at_s"], k["kind"]) for k in summary.get("kills", [])])
    return lines + where.image(png, "the load through the kills")


def render_overload_idle(summary: dict, where: Where, name: str) -> list[str]:
    lines = table(summary["table"]) if isinstance(summary.get("table"), list) else \
        table([{"system": k, **v} for k, v in summary.get("table", {}).items()])
    per_s = summary.get("completed_per_s") or {}
    png = report_plots.panels({"completed per second": {
        system: list(enumerate(counts)) for system, counts in per_s.items()}},
        where.plots / f"{name}.png", "seconds into the window")
    return lines + where.image(png, "completions per second, both systems")


# ---- Retry-After --------------------------------------------------------------------------
def render_retry_after_http(summary: dict, where: Where, name: str) -> list[str]:
    policies = summary.get("policies", {})
    params = {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
    lines = [", ".join(f"{k} {v}" for k, v in params.items()) + ".", ""] if params else []
    lines += table([{"policy": p, **{k: v for k, v in r.items() if not isinstance(v, (dict, list))}}
                    for p, r in policies.items()])
    outcome_keys = ("first_try_rejected_pct", "retries_admitted_pct", "finally_rejected_pct")
    png = report_plots.bars({p: {k: r.get(k) for k in outcome_keys if r.get(k) is not None}
                             for p, r in policies.items()},
                            where.plots / f"{name}.png", "% of requests",
                            "what became of the requests, per policy")
    return lines + where.image(png, "Retry-After outcomes per policy")


EVAL_FIGURES = [("retries_admitted_pct", "retries admitted (%)"),
                ("finally_rejected_pct", "finally rejected (%)"),
                ("idle_capacity_pct", "idle capacity (%)"), ("goodput_per_s", "goodput (/s)")]


def render_retry_after_eval(summary: dict, where: Where, name: str) -> list[str]:
    """Per mode (a client retries ``once`` or ``until`` admitted) and figure, a policy x shape
    table; the goals' verdicts; one plot of retries admitted per shape and policy."""
    config, medians = summary.get("config", {}), summary.get("medians", {})
    lines = [f"{config.get('runs')} runs per cell, {config.get('duration_s')} s windows after "
             f"{config.get('warmup_s')} s of warm-up, {config.get('routers')} router(s), "
             f"{config.get('replicas')} replica(s) of {config.get('max_ongoing')} slots and a "
             f"queue of {config.get('max_queued')}, a {config.get('handler_s')} s handler; "
             f"medians. Modes: `once` (a rejected client retries once) and `until`.", ""]
    modes = [m for m in ("once", "until") if any(
        k.startswith(f"{m}_") for shape in medians.values() for row in shape.values() for k in row)]
    for mode in modes:
        for key, label in EVAL_FIGURES:
            policies = list(dict.fromkeys(p for shape in medians.values() for p in shape))
            rows = [{"policy": p, **{shape: medians[shape].get(p, {}).get(f"{mode}_{key}")
                                     for shape in medians}} for p in policies]
            lines += [f"**{mode}: {label}**", ""] + table(rows)
    goals = summary.get("goals", {})
    for mode, verdicts in goals.items():
        lines += [f"Goals, `{mode}`:", ""] + [f"- {v}" for v in verdicts] + [""]
    png = report_plots.bars(
        {shape: {p: row.get("once_retries_admitted_pct") for p, row in by_policy.items()}
         for shape, by_policy in medians.items()},
        where.plots / f"{name}.png", "% of retries admitted",
        "a client that retries once after the Retry-After: admitted, per load shape")
    return lines + where.image(png, "retries admitted per shape and policy")


# ---- the LLM day --------------------------------------------------------------------------
def render_llm_day(summary: dict, where: Where, name: str) -> list[str]:
    params = summary.get("parameters", {})
    lines = [f"Seed {params.get('seed')}, {params.get('hours')} h, {params.get('step_hz')} "
             f"engine steps/s, {params.get('slots')} slots; the first interval is the "
             f"production default ({params.get('production_interval_s')} s), the others are "
             f"counterfactuals.", ""]
    runs = summary.get("intervals", {})
    lines += table([{"interval": k, **{kk: vv for kk, vv in v.items()
                                       if not isinstance(vv, (dict, list))}}
                    for k, v in runs.items()])
    if summary.get("seeded_days"):
        lines += ["Other seeded days:", ""] + table(summary["seeded_days"])
    per_hour = {k: v.get("per_hour") or {} for k, v in runs.items()}  # columns by name

    def by_hour(column: str) -> dict[str, list]:
        return {k: list(zip(h.get("hour", []), h.get(column, []))) for k, h in per_hour.items()}

    first = next(iter(per_hour.values()), {})
    png = report_plots.panels(
        {"checks with every slot taken, per hour": by_hour("full_slot_checks"),
         "token-based stucks per hour (each a restart by the old rule)":
             by_hour("token_based_stucks"),
         "seconds stalled by JIT compiles, per hour":
             {"engine": list(zip(first.get("hour", []), first.get("stalled_s", [])))}},
        where.plots / f"{name}.png", "hour of the day")
    return lines + where.image(png, "the day hour by hour")


def _points(t: list, values: list) -> list[tuple[Any, Any]]:
    return [(x, y) for x, y in zip(t, values) if y is not None]


def _joined(values: list) -> str:
    return ", ".join(str(v) for v in values)


RENDERERS: dict[str, Renderer] = {
    "scale": render_scale, "health_push": render_health_push,
    "http_bench": render_http_bench, "soak": render_soak,
    "drain_events": render_drain_events, "drain_events_nophase1": render_drain_events,
    "chaos": render_chaos, "chaos_head": render_chaos, "overload_idle": render_overload_idle,
    "node_churn": render_node_churn, "http_abuse": render_http_abuse,
    "retry_after_http": render_retry_after_http, "retry_after_eval": render_retry_after_eval,
    "llm_day": render_llm_day, "llm_routing": render_llm_routing,
    "llm_autoscale": render_llm_autoscale,
    "llm_autoscale_frontier": render_llm_autoscale_frontier, "head_loss": render_head_loss,
    "head_loss_haproxy": render_head_loss, "head_loss_workers": render_head_loss,
}
