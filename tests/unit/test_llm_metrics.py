"""Parsing vLLM's /metrics into a snapshot, and telling whether two reads share a process."""

from __future__ import annotations

import pytest

from replicas.llm_metrics import (MetricsSnapshot, MetricsUnusable, engine_stats,
                                  parse_metrics, slot_seconds)
from tests.llm_sim.engine import SimEngine

# As vLLM prints it with two engines (data parallel) and several API servers: no
# process_start_time_seconds, one series per engine label.
TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 12.0
vllm:num_requests_running{engine="1",model_name="qwen"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 107.0
vllm:generation_tokens_total{engine="1",model_name="qwen"} 20.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="qwen"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="qwen"} 50.0
vllm:iteration_tokens_total_count{engine="0",model_name="qwen"} 50.0
vllm:iteration_tokens_total_sum{engine="0",model_name="qwen"} 900.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="qwen"} 1.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="qwen"} 7.0
vllm:iteration_tokens_total_count{engine="1",model_name="qwen"} 7.0
vllm:iteration_tokens_total_sum{engine="1",model_name="qwen"} 30.0
"""


def snap(steps: float = 10, tokens: float = 5, start: float | None = 100.0) -> MetricsSnapshot:
    return MetricsSnapshot(at_s=0.0, running=1, waiting=0, steps=steps,
                           generation_tokens=tokens, start_time_s=start)


def test_sums_every_engine_and_notes_the_missing_start_time():
    s = parse_metrics(TWO_ENGINES, at_s=7.5)
    assert (s.running, s.waiting, s.steps, s.generation_tokens) == (15, 4, 57, 127)
    assert s.start_time_s is None and s.model_name == "qwen" and s.at_s == 7.5
    assert s.requests_present


def test_kv_cache_use_is_the_fullest_engines_under_either_name():
    assert parse_metrics(TWO_ENGINES, at_s=0).kv_cache_usage is None  # not served: unknown
    kv = ("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"qwen\"} 0.25\n"
          "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"qwen\"} 0.75\n")
    assert parse_metrics(TWO_ENGINES + kv, at_s=0).kv_cache_usage == 0.75
    old = "vllm:gpu_cache_usage_perc{model_name=\"qwen\"} 0.5\n"  # before vLLM 0.10
    assert parse_metrics(TWO_ENGINES + old, at_s=0).kv_cache_usage == 0.5


def test_reads_the_simulators_text_and_counts_prefill_as_steps_without_tokens():
    engine = SimEngine("m", slots=2, wall=lambda: 1234.0)
    engine.submit(max_tokens=3, prefill_steps=4)
    for _ in range(4):
        engine.step()
    s = parse_metrics(engine.metrics_text(), at_s=1.0)
    assert (s.running, s.steps, s.generation_tokens, s.start_time_s) == (1, 4, 0, 1234.0)


# vLLM v1's histogram of a finished request's time RUNNING (vllm/v1/metrics/loggers.py)
INFERENCE = """\
# TYPE vllm:request_inference_time_seconds histogram
vllm:request_inference_time_seconds_count{engine="0",model_name="qwen"} %s
vllm:request_inference_time_seconds_sum{engine="0",model_name="qwen"} %s
vllm:request_inference_time_seconds_count{engine="1",model_name="qwen"} 1.0
vllm:request_inference_time_seconds_sum{engine="1",model_name="qwen"} 30.0
"""


def test_the_slot_time_is_the_mean_running_time_of_the_requests_finished_between_reads():
    before = parse_metrics(TWO_ENGINES + INFERENCE % (4.0, 80.0), at_s=0)
    after = parse_metrics(TWO_ENGINES + INFERENCE % (7.0, 146.0), at_s=40)
    assert (after.inference_count, after.inference_s) == (8.0, 176.0)  # both engines
    assert slot_seconds(before, after) == (3.0, 22.0)
    stats = engine_stats(before, after, slots=4)
    assert (stats["finished"], stats["slot_s"]) == (3.0, 22.0)
    assert slot_seconds(after, after) is None  # none finished between
    assert "slot_s" not in engine_stats(None, after, slots=4)  # a first read
    plain = parse_metrics(TWO_ENGINES, at_s=0)  # not served: nothing measured, no error
    assert plain.inference_count == 0 and slot_seconds(plain, plain) is None


def test_the_simulator_serves_the_running_time_histogram():
    clock = [0.0]
    engine = SimEngine("m", slots=2, wall=lambda: clock[0])
    before = parse_metrics(engine.metrics_text(), at_s=0)
    engine.submit(max_tokens=3)
    for _ in range(5):
        clock[0] += 1.0
        engine.step()  # scheduled at 1 s, tokens at 1, 2, 3: finished at 3 s
    assert slot_seconds(before, parse_metrics(engine.metrics_text(), at_s=5)) == (1.0, 2.0)


@pytest.mark.parametrize("text, missing", [
    ("# TYPE foo gauge\nfoo 1\n", "vllm:num_requests_running"),
    (TWO_ENGINES.replace("vllm:iteration_tokens_total", "vllm:other"),
     "vllm:iteration_tokens_total_count"),
])
def test_text_without_the_series_is_unusable(text, missing):
    with pytest.raises(MetricsUnusable, match=missing):
        parse_metrics(text, at_s=0.0)


def test_malformed_text_is_unusable_not_a_crash():
    with pytest.raises(MetricsUnusable, match="not Prometheus text"):
        parse_metrics("vllm:num_requests_running{engine=\"0\" 1\n", at_s=0.0)


@pytest.mark.parametrize("earlier, later, same", [
    (snap(), snap(steps=20, tokens=9), True),                      # counters up, same start
    (snap(), snap(steps=20, start=200.0), False),                  # start time changed
    (snap(start=None), snap(steps=20, tokens=9, start=None), True),  # several API servers
    (snap(start=None), snap(steps=3, tokens=9, start=None), False),  # steps went down
    (snap(start=None), snap(steps=20, tokens=1, start=None), False),  # tokens went down
    (snap(start=100.0), snap(steps=20, start=None), False),        # the series went away
])
def test_same_process(earlier, later, same):
    assert later.same_process_as(earlier) is same
