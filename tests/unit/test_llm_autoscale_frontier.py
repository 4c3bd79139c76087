"""``release_tests.llm_autoscale_frontier``: which points it runs, and how a point's cost
and SLO are read against Serve's default on the same days."""

from __future__ import annotations

from release_tests import llm_autoscale
from release_tests.llm_autoscale_frontier import _parser, points, summarize
from release_tests.report_llm import render_llm_autoscale_frontier
from release_tests.report_tables import Where


def plan(*argv: str) -> list[dict]:
    return points(_parser().parse_args(list(argv)))


def test_each_knob_at_the_published_peak_and_both_defaults_at_every_other():
    got = plan("--peaks", "0.4,0.5,0.6", "--fleetplane-knob", "5,7,10,14,20",
               "--serve-knob", "1.5,2,2.5,3,4", "--data-plane", "4,8")
    at_peak = [(p["system"], p["knob"], p["value"], p["default"]) for p in got
               if p["peak_rps"] == 0.5 and p["knob"] != "max_ongoing_requests"]
    assert at_peak == [("fleetplane", "ttft_target_s", 5.0, False),
                       ("fleetplane", "ttft_target_s", 7.0, False),
                       ("fleetplane", "ttft_target_s", 10.0, True),
                       ("fleetplane", "ttft_target_s", 14.0, False),
                       ("fleetplane", "ttft_target_s", 20.0, False),
                       ("fleetplane", "surge", 0.3, False),
                       ("serve", "target_ongoing_requests", 1.5, False),
                       ("serve", "target_ongoing_requests", 2.0, True),
                       ("serve", "target_ongoing_requests", 2.5, False),
                       ("serve", "target_ongoing_requests", 3.0, False),
                       ("serve", "target_ongoing_requests", 4.0, False)]
    queues = [(p["system"], p["value"], p["default"], p["settings"].max_ongoing_requests)
              for p in got if p["knob"] == "max_ongoing_requests"]
    assert queues == [("fleetplane", 8.0, False, 8), ("serve", 8.0, False, 8)]  # 4: the default
    assert {p["settings"].max_ongoing_requests for p in got
            if p["knob"] != "max_ongoing_requests"} == {4}
    others = [(p["system"], p["peak_rps"], p["default"]) for p in got if p["peak_rps"] != 0.5]
    assert others == [("fleetplane", 0.4, True), ("serve", 0.4, True),
                      ("fleetplane", 0.6, True), ("serve", 0.6, True)]


def test_a_point_is_the_published_settings_with_its_knob_set():
    got = {(p["system"], p["knob"], p["value"]): p
           for p in plan("--peaks", "", "--data-plane", "", "--fleetplane-knob", "10,20")}
    published = llm_autoscale.systems(llm_autoscale._parser().parse_args([]))
    ours = got["fleetplane", "ttft_target_s", 20.0]["settings"]
    assert ours.autoscaling == {**published["fleetplane"].autoscaling,
                                "llm": {"ttft_target_s": 20.0}}
    assert got["fleetplane", "surge", 0.3]["settings"].autoscaling["llm"] == {"surge": 0.3}
    serve = got["serve", "target_ongoing_requests", 3.0]["settings"]
    assert serve.autoscaling == {**published["serve"].autoscaling,
                                 "target_ongoing_requests": 3.0}
    assert got["serve", "target_ongoing_requests", 2.0]["settings"] == published["serve"]


def test_the_yardstick_runs_when_serves_knob_leaves_out_its_default():
    got = plan("--peaks", "", "--serve-knob", "3", "--fleetplane-knob", "10", "--surge", "",
               "--data-plane", "")
    assert [(p["system"], p["value"], p["default"]) for p in got] == [
        ("fleetplane", 10.0, True), ("serve", 3.0, False), ("serve", 2.0, True)]


def test_cost_is_read_against_serves_default_on_the_same_day_and_peak():
    got = plan("--peaks", "0.4", "--fleetplane-knob", "10", "--surge", "", "--serve-knob", "2",
               "--data-plane", "")
    day = {0: {7: 80, 1: 90}, 1: {7: 100, 1: 100}, 2: {7: 70, 1: 60}, 3: {7: 50, 1: 80}}
    slo = {0: {7: 0.96, 1: 0.94}, 1: {7: 1.0, 1: 0.98}, 2: {7: 0.9, 1: 0.92},
           3: {7: 0.97, 1: 0.99}}
    done = [(i, seed, {"replica_seconds": day[i][seed], "slo_windows_met": slo[i][seed],
                       "failed": i}) for i in day for seed in (7, 1)]
    rows = summarize(got, [7, 1], done)
    assert [(r["system"], r["peak_rps"]) for r in rows] == [
        ("fleetplane", 0.5), ("serve", 0.5), ("fleetplane", 0.4), ("serve", 0.4)]
    assert rows[0]["vs_serve_by_seed"] == {"7": 0.8, "1": 0.9}
    assert rows[0]["vs_serve"] == 0.85
    assert (rows[0]["slo_windows_met"], rows[0]["slo_worst"]) == (0.95, 0.94)
    assert rows[2]["vs_serve_by_seed"] == {"7": 1.4, "1": 0.75}  # against 0.4's Serve
    assert rows[3]["vs_serve"] == 1.0 and rows[2]["failed"] == 4


def test_the_report_shows_each_knob_and_the_peaks(tmp_path):
    rows = [{"system": s, "knob": k, "value": v, "peak_rps": peak, "default": d,
             "vs_serve": x, "vs_serve_by_seed": {"7": x}, "slo_windows_met": 0.96,
             "slo_worst": 0.95, "failed": 0}
            for s, k, v, peak, d, x in [("fleetplane", "ttft_target_s", 10.0, 0.5, True, 0.8),
                                        ("serve", "target_ongoing_requests", 2.0, 0.5, True, 1.0),
                                        ("fleetplane", "ttft_target_s", 10.0, 0.4, True, 0.85),
                                        ("serve", "target_ongoing_requests", 2.0, 0.4, True, 1.0)]]
    summary = {"points": rows, "seeds": [7], "peak_rps": 0.5, "hours": [0, 24],
               "window_s": 600.0, "ttft_slo_s": 10.0}
    lines = render_llm_autoscale_frontier(summary, Where(tmp_path, tmp_path), "frontier")
    text = "\n".join(lines)
    assert "| fleetplane | ttft_target_s 10 (default) | 0.5 | 0.8x | 0.96 / 0.95 | 0 |" in text
    assert "| fleetplane | ttft_target_s 10 (default) | 0.4 | 0.85x |" in text
    assert (tmp_path / "frontier_knobs.png").exists()
    assert (tmp_path / "frontier_peaks.png").exists()
