"""A simulated vLLM engine: slots, a waiting queue, engine steps, long prefill, faults.

Owns the engine's state and its Prometheus text, and no I/O or timer: the HTTP server
(``server.py``) calls ``step()`` at its step rate or when a test asks it to (``/sim/step``),
unit tests call it under a fake clock.
The metrics are rendered by prometheus_client in vLLM's real names and labels
(``model_name``, ``engine``), as vLLM's v1 engine serves them (``vllm/v1/metrics/loggers.py``,
the same from 0.11 to 0.32, the newest read): ``vllm:num_requests_running``/``_waiting``
gauges, the ``vllm:generation_tokens`` and ``vllm:prompt_tokens`` counters (``_total`` when
exposed), the ``vllm:iteration_tokens_total`` histogram (its ``_count`` is engine steps), the
``vllm:time_to_first_token_seconds`` and ``vllm:request_inference_time_seconds`` (a
finished request's time in the RUNNING phase: holding a slot) histograms (vLLM's buckets)
and ``process_start_time_seconds``, left out when the engine plays vLLM with several API servers.

A request first spends ``prefill_steps`` steps reading its prompt (steps, no output tokens),
then makes one output token per step until ``max_tokens``. With ``prefill_tokens_per_step``
(token mode, ``prefix_cache.Calibration``) a request submitted with its prompt text reads
that prompt's tokens instead, from a budget the running requests share each step (first
come first), less the prefix ``cache`` holds (``prefix_cache.PrefixCache``), and the cache,
the ``vllm:kv_cache_usage_perc`` gauge and the ``vllm:prefix_cache_queries``/``_hits``
counters (tokens) follow. Fault modes:
- ``stuck``: no more steps; running requests stay running, new ones wait;
- ``wedged``: nothing runs and the waiting queue grows (seen on real vLLM, seeds/README.md);
- ``no-metrics``: /metrics answers 404 (the server layer reads ``fault``);
- ``dead``: the server process exits (the server layer does it);
and the one-shot ``restart()``: a new process (counters from 0, new start time) that fails
every in-flight request with vLLM's 500 text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.exposition import generate_latest

from tests.llm_sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_keys, prompt_tokens

FAULTS = ("none", "stuck", "wedged", "no-metrics", "dead")
RESTART_ERROR = "cannot schedule new futures after shutdown"  # what seed 001's clients saw
# vLLM's iteration-token buckets follow its CUDA-graph capture sizes; these are close enough.
BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# vLLM's vllm:time_to_first_token_seconds buckets (vllm/v1/metrics, unchanged since 0.8)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# vLLM's request_latency_buckets (vllm/v1/metrics/loggers.py), for the request-time histograms
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(eq=False)
class SimRequest:
    max_tokens: int
    prefill_steps: int                 # steps left reading the prompt
    internal: bool = False             # made by /sim/load, not received over HTTP
    output_tokens: int = 0
    error: str | None = None
    on_finish: Callable[["SimRequest"], None] | None = None
    prompt_tokens: int = 0             # token mode: the prompt's length in tokens
    prompt_left: int = 0               # token mode: tokens still to read (set when scheduled)
    blocks: tuple[int, ...] = ()       # token mode: the prompt's block keys
    submitted_at: float = 0.0          # wall time it arrived (its TTFT counts from here)
    scheduled_at: float = 0.0          # wall time it got a slot (RUNNING from here)

    @property
    def done(self) -> bool:
        return self.output_tokens >= self.max_tokens

    @property
    def steps_left(self) -> int:
        """Steps it still needs once it holds a slot."""
        return self.prefill_steps + self.prompt_tokens + self.max_tokens - self.output_tokens


class SimEngine:
    def __init__(self, model: str, slots: int, wall: Callable[[], float],
                 publish_start_time: bool = True, prefill_chunk_tokens: int = 512,
                 prefill_tokens_per_step: int = 0, cache_blocks: int = 4096) -> None:
        self.model = model
        self.prefill_tokens_per_step = prefill_tokens_per_step  # 0: step mode
        self.cache_blocks = cache_blocks
        self.slots = slots
        self.publish_start_time = publish_start_time
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.fault = "none"
        self.restarts = 0
        self._wall = wall
        self.start_time_s = 0.0
        self._new_process()

    def _new_process(self) -> None:
        self.start_time_s = max(self._wall(), self.start_time_s + 0.001)
        self.steps = 0
        self.iteration_tokens_sum = 0.0
        self.bucket_counts = [0] * len(BUCKETS)  # per bucket, not cumulative
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)  # per bucket, the last is +Inf
        self.ttft_sum = 0.0
        self.inference_counts = [0] * (len(REQUEST_BUCKETS) + 1)  # time in RUNNING, finished
        self.inference_sum = 0.0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.cache = PrefixCache(self.cache_blocks)  # a new process caches nothing
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()

    @property
    def full(self) -> bool:
        """Every slot taken: a request arriving now would wait for one."""
        return len(self.running) >= self.slots

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def has_room(self) -> bool:
        """A request arriving now gets a slot at the next step (nobody queued before it)."""
        return len(self.running) + len(self.waiting) < self.slots

    def submit(self, max_tokens: int, prefill_steps: int = 0, internal: bool = False,
               on_finish: Callable[[SimRequest], None] | None = None,
               prompt: str | None = None) -> SimRequest:
        request = SimRequest(max(1, max_tokens), max(0, prefill_steps), internal,
                             on_finish=on_finish, submitted_at=self._wall())
        if prompt is not None and self.prefill_tokens_per_step:
            request.prefill_steps = 0
            request.prompt_tokens = prompt_tokens(prompt)
            request.blocks = block_keys(prompt)
        self.waiting.append(request)
        return request

    def kv_cache_usage(self) -> float:
        """Blocks the running requests hold over the cache's blocks (vLLM's gauge: cached
        blocks no request holds count as free)."""
        held = sum(-(-(r.prompt_tokens + r.output_tokens) // BLOCK_TOKENS)
                   for r in self.running)
        return min(1.0, held / max(1, self.cache.capacity_blocks))

    def abort(self, request: SimRequest) -> None:
        """The client went away (vLLM aborts such a request)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def step(self) -> bool:
        """Take one engine step; False when none was taken (no work, or a fault)."""
        if self.fault in ("stuck", "wedged", "dead"):
            return False
        while self.waiting and len(self.running) < self.slots:
            self._schedule(self.waiting.popleft())
        if not self.running:
            return False  # vLLM takes no steps while it has nothing to do
        tokens, budget = 0, self.prefill_tokens_per_step
        for request in list(self.running):
            if request.prompt_left > 0:  # token mode: reading the prompt from the budget
                read = min(budget, request.prompt_left)
                budget -= read
                tokens += read
                self._read_prompt(request, read)
            else:
                tokens += self._advance(request)
        self.steps += 1
        self.iteration_tokens_sum += tokens
        self.bucket_counts[_bucket_index(tokens)] += 1
        return True

    def step_until_done(self, request: SimRequest, max_steps: int) -> bool:
        """Step until ``request`` has all its tokens, a step is not taken (no work, or a
        fault) or ``max_steps`` were taken; True when it is done."""
        for _ in range(max_steps):
            if request.done or not self.step():
                break
        return request.done

    def _schedule(self, request: SimRequest) -> None:
        """A slot for it: in token mode, what it must read is its prompt less the prefix
        the cache holds."""
        if request.prompt_tokens:
            request.prompt_left = request.prompt_tokens - self.cache.lookup(
                request.blocks, request.prompt_tokens)
        request.scheduled_at = self._wall()
        self.running.append(request)

    def _read_prompt(self, request: SimRequest, tokens: int) -> None:
        request.prompt_left -= tokens
        self.prompt_tokens += tokens
        if request.prompt_left == 0:
            self.cache.insert(request.blocks)

    def _advance(self, request: SimRequest) -> int:
        if request.prefill_steps > 0:  # reading the prompt: a step, no output token
            request.prefill_steps -= 1
            self.prompt_tokens += self.prefill_chunk_tokens
            return self.prefill_chunk_tokens
        request.output_tokens += 1
        self.generation_tokens += 1
        if request.output_tokens == 1:
            self._observe_ttft(self._wall() - request.submitted_at)
        if request.done:
            self.running.remove(request)
            seconds = self._wall() - request.scheduled_at
            self.inference_sum += seconds
            self.inference_counts[_index(REQUEST_BUCKETS, seconds)] += 1
            _finish(request)
        return 1

    def _observe_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_counts[_index(TTFT_BUCKETS, seconds)] += 1

    def set_fault(self, mode: str) -> None:
        if mode not in FAULTS:
            raise ValueError(f"unknown fault '{mode}'; one of {', '.join(FAULTS)}")
        if mode == "wedged":  # nothing runs: what was running goes back to the queue
            self.waiting.extendleft(reversed(self.running))
            self.running.clear()
        self.fault = mode

    def restart(self) -> None:
        """A new process: counters from 0, a new start time, every in-flight request fails."""
        in_flight = self.running + list(self.waiting)
        self._new_process()
        self.fault = "none"
        self.restarts += 1
        for request in in_flight:
            request.error = RESTART_ERROR
            _finish(request)

    def clear(self) -> None:
        """Drop every request (a test's reset between cases); counters keep counting."""
        in_flight = self.running + list(self.waiting)
        self.running.clear()
        self.waiting.clear()
        self.fault = "none"
        for request in in_flight:
            request.error = "simulator reset"
            _finish(request)

    def metrics_text(self) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(self))
        return generate_latest(registry).decode()


def _finish(request: SimRequest) -> None:
    if request.on_finish is not None:
        request.on_finish(request)


def _index(bounds: tuple[float, ...], value: float) -> int:
    """The bucket of ``value`` (len(bounds): +Inf)."""
    return next((i for i, bound in enumerate(bounds) if value <= bound), len(bounds))


def _bucket_index(tokens: int) -> int:
    for i, bound in enumerate(BUCKETS):
        if tokens <= bound:
            return i
    return len(BUCKETS) - 1


class _Families:
    """A prometheus_client collector rendering the engine as vLLM names it."""

    def __init__(self, engine: SimEngine) -> None:
        self._e = engine

    def collect(self):
        e, names, values = self._e, ["engine", "model_name"], ["0", self._e.model]
        running = GaugeMetricFamily("vllm:num_requests_running",
                                    "Number of requests in model execution batches.", labels=names)
        running.add_metric(values, len(e.running))
        waiting = GaugeMetricFamily("vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.", labels=names)
        waiting.add_metric(values, len(e.waiting))
        generation = CounterMetricFamily("vllm:generation_tokens",
                                         "Number of generation tokens processed.", labels=names)
        generation.add_metric(values, e.generation_tokens)
        prompt = CounterMetricFamily("vllm:prompt_tokens",
                                     "Number of prefill tokens processed.", labels=names)
        prompt.add_metric(values, e.prompt_tokens)
        yield from (running, waiting, generation, prompt, self._iteration_tokens(names, values),
                    _seconds("vllm:time_to_first_token_seconds", "Histogram of time to first "
                             "token in seconds.", TTFT_BUCKETS, e.ttft_counts, e.ttft_sum,
                             names, values),
                    _seconds("vllm:request_inference_time_seconds", "Histogram of time spent "
                             "in RUNNING phase for request.", REQUEST_BUCKETS,
                             e.inference_counts, e.inference_sum, names, values))
        yield from self._cache_families(names, values)
        if e.publish_start_time:
            yield GaugeMetricFamily("process_start_time_seconds", "Start time of the process "
                                    "since unix epoch in seconds.", value=e.start_time_s)

    def _cache_families(self, names: list[str], values: list[str]):
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc",
                                  "KV-cache usage. 1 means 100 percent usage.", labels=names)
        usage.add_metric(values, self._e.kv_cache_usage())
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix cache queries, in "
                                      "terms of number of queried tokens.", labels=names)
        queries.add_metric(values, self._e.cache.queries_tokens)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix cache hits, in terms of "
                                   "number of cached tokens.", labels=names)
        hits.add_metric(values, self._e.cache.hits_tokens)
        return usage, queries, hits

    def _iteration_tokens(self, names: list[str], values: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily("vllm:iteration_tokens_total",
                                       "Histogram of number of tokens per engine_step.",
                                       labels=names)
        cumulative, buckets = 0, []
        for bound, count in zip(BUCKETS, self._e.bucket_counts):
            cumulative += count
            buckets.append((f"{float(bound)}", cumulative))
        buckets.append(("+Inf", self._e.steps))
        family.add_metric(values, buckets, sum_value=self._e.iteration_tokens_sum)
        return family


def _seconds(name: str, doc: str, bounds: tuple[float, ...], counts: list[int], total: float,
             names: list[str], values: list[str]) -> HistogramMetricFamily:
    """A histogram of seconds from per-bucket counts (the last is +Inf), as vLLM renders it."""
    family = HistogramMetricFamily(name, doc, labels=names)
    cumulative, buckets = 0, []
    for bound, count in zip((*map(str, bounds), "+Inf"), counts):
        cumulative += count
        buckets.append((bound, cumulative))
    family.add_metric(values, buckets, sum_value=total)
    return family
