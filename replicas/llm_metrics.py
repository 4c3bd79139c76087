"""One read of a vLLM server's ``/metrics``, reduced to the few numbers the health check uses.

Owns the parsing of vLLM's Prometheus text (with prometheus_client's own parser) into a
frozen ``MetricsSnapshot``, and the rule that says whether two snapshots came from the
same server process. Pure: the caller passes the text and the time it was read.

Progress is counted in engine steps, the sample count of the ``vllm:iteration_tokens_total``
histogram, never in output tokens: during a long prefill the engine keeps stepping while
``vllm:generation_tokens_total`` stands still (seed 001, "Engine steps, not output tokens").
Series are summed over their label sets, so a server with several engines (the ``engine``
label) or served model names is judged as one.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
STEPS = "vllm:iteration_tokens_total_count"  # histogram sample count = engine steps
GENERATION_TOKENS = "vllm:generation_tokens_total"
START_TIME = "process_start_time_seconds"  # absent when vLLM runs several API servers
# KV-cache use, 0-1 (vLLM v1's name since 0.10; gpu_cache_usage_perc before): the kv_load
# routing policies read it through VLLMServer.record_routing_stats, never the check.
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# Time to first token, a histogram (its cumulative ``_bucket`` samples by ``le``): the LLM
# autoscaling policy reads its p90 between two reads (``ttft_quantile``), never the check.
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
# A finished request's time in the RUNNING phase (holding a batch slot: prefill + decode),
# a histogram whose _sum and _count give the mean between two reads (``slot_seconds``):
# the LLM autoscaling policy sizes the fleet with it.
INFERENCE_SUM = "vllm:request_inference_time_seconds_sum"
INFERENCE_COUNT = "vllm:request_inference_time_seconds_count"
_REQUIRED = (RUNNING, WAITING, STEPS)
_SUMMED = (RUNNING, WAITING, STEPS, GENERATION_TOKENS, INFERENCE_SUM, INFERENCE_COUNT)


class MetricsUnusable(Exception):
    """The text is not vLLM metrics we can judge from (the check falls back to no-metrics)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class MetricsSnapshot:
    at_s: float                  # when it was read (monotonic seconds of the reader)
    running: float               # requests in the running batch
    waiting: float               # requests queued for a slot
    steps: float                 # engine steps since the process started
    generation_tokens: float     # output tokens since the process started (reported only)
    start_time_s: float | None   # process start (epoch s); None with several API servers
    model_name: str | None = None  # from the ``model_name`` label, for the tiny answer
    kv_cache_usage: float | None = None  # the fullest engine's, 0-1; None when not served
    # cumulative TTFT counts by upper bound (summed over engines), ascending; () when absent
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    # finished requests' RUNNING time: seconds and count since the process started (0: absent)
    inference_s: float = 0.0
    inference_count: float = 0.0

    @property
    def requests_present(self) -> bool:
        return self.running > 0 or self.waiting > 0

    def same_process_as(self, earlier: "MetricsSnapshot") -> bool:
        """False when the server restarted between ``earlier`` and this read.

        A changed start time proves a restart; without that series (vLLM with several API
        servers) a counter that went down does, since counters only fall when their process
        is replaced (seed 001, "A restart between the two reads").
        """
        if self.start_time_s is not None and earlier.start_time_s is not None:
            if self.start_time_s != earlier.start_time_s:
                return False
        elif (self.start_time_s is None) != (earlier.start_time_s is None):
            return False  # the series came or went: a different server configuration
        return (self.steps >= earlier.steps
                and self.generation_tokens >= earlier.generation_tokens)


def parse_metrics(text: str, at_s: float) -> MetricsSnapshot:
    """Parse Prometheus text from vLLM; raises MetricsUnusable when the series are missing."""
    sums: dict[str, float] = {}
    start_time: float | None = None
    kv_usage: float | None = None
    model_name: str | None = None
    ttft: dict[float, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _SUMMED:
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                    model_name = model_name or sample.labels.get("model_name")
                elif sample.name == START_TIME:
                    start_time = sample.value
                elif sample.name in KV_CACHE_USAGE:  # a fraction: the fullest engine's
                    kv_usage = max(kv_usage or 0.0, sample.value)
                elif sample.name == TTFT_BUCKET:
                    bound = float(sample.labels.get("le", "inf"))
                    ttft[bound] = ttft.get(bound, 0.0) + sample.value
    except ValueError as e:  # prometheus_client's parser rejects malformed text this way
        raise MetricsUnusable(f"/metrics is not Prometheus text: {e}") from None
    missing = [name for name in _REQUIRED if name not in sums]
    if missing:
        raise MetricsUnusable(f"/metrics lacks vLLM series {', '.join(missing)}")
    return MetricsSnapshot(at_s=at_s, running=sums[RUNNING], waiting=sums[WAITING],
                           steps=sums[STEPS], generation_tokens=sums.get(GENERATION_TOKENS, 0.0),
                           start_time_s=start_time, model_name=model_name,
                           kv_cache_usage=kv_usage, ttft_buckets=tuple(sorted(ttft.items())),
                           inference_s=sums.get(INFERENCE_SUM, 0.0),
                           inference_count=sums.get(INFERENCE_COUNT, 0.0))


def engine_stats(before: MetricsSnapshot | None, after: MetricsSnapshot,
                 slots: int) -> dict[str, float]:
    """One read, as the LLM autoscaling policy takes it (``record_autoscaling_stats``):
    requests running and waiting, the engine's slots, KV-cache use where served, the
    TTFT p90 of the requests that got their first token since the read before, and the
    requests that finished since it (``finished``) with their mean time holding a slot
    (``slot_s``)."""
    stats = {"running": after.running, "waiting": after.waiting, "slots": float(slots)}
    if after.kv_cache_usage is not None:
        stats["kv_cache_usage"] = after.kv_cache_usage
    p90 = ttft_quantile(before, after, 0.9)
    if p90 is not None:
        stats["ttft_p90_s"] = p90
    slot = slot_seconds(before, after)
    if slot is not None:
        stats["finished"], stats["slot_s"] = slot
    return stats


def slot_seconds(before: MetricsSnapshot | None,
                 after: MetricsSnapshot) -> tuple[float, float] | None:
    """(requests finished, their mean seconds in the RUNNING phase) between two reads of
    one process; None when none finished (or the histogram is not served)."""
    if before is None or not after.same_process_as(before):
        return None
    finished = after.inference_count - before.inference_count
    if finished <= 0:
        return None
    return finished, max(0.0, after.inference_s - before.inference_s) / finished


def ttft_quantile(before: MetricsSnapshot | None, after: MetricsSnapshot,
                  q: float = 0.9) -> float | None:
    """The ``q`` quantile of the TTFTs observed between two reads of one process, as
    Prometheus' ``histogram_quantile`` computes it (linear within a bucket; the last finite
    bound for the +Inf bucket); None when nothing was observed between them."""
    if before is None or not after.same_process_as(before) or not after.ttft_buckets:
        return None
    earlier = dict(before.ttft_buckets)
    deltas = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after.ttft_buckets]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in deltas:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower
