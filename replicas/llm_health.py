"""The LLM health check's shell: HTTP to a vLLM server, driven by the verdict table.

Owns the I/O of seed 001's check and nothing of its judgement (``llm_verdict.py``): read
``/metrics``; send the tiny completion (max_tokens=1, short timeout) only when the table
asks for it, which it does only for a server that holds no request or publishes no metrics;
report. A proxy is checked only through ``/v1/models`` (``check_proxy``): behind a
least-connection proxy each ``/metrics`` read may come from a different backend, so its
counters cannot be compared; its backends are checked directly.

HTTP goes through an injected ``Fetcher`` (stdlib ``urllib`` in production, a fake in unit
tests) and time through an injected ``Clock``, so the whole shell runs without a network.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from controlplane.clock import Clock
from replicas.llm_http import Fetcher, HttpResult
from replicas.llm_metrics import MetricsSnapshot, MetricsUnusable, parse_metrics
from replicas.llm_verdict import (Action, Answer, CheckState, Judgement, Verdict, judge_answer,
                                  judge_read)

# Stuck needs two intervals without an engine step, so two intervals must outlast the
# longest healthy step: JIT compiles have stalled vLLM steps for 30-70 s.
DEFAULT_INTERVAL_S = 40.0
TINY_PROMPT = "ping"


@dataclass(frozen=True)
class CheckSettings:
    interval_s: float = DEFAULT_INTERVAL_S  # between two reads of /metrics
    metrics_timeout_s: float = 5.0          # /metrics is served beside the engine, not by it
    models_timeout_s: float = 5.0
    answer_timeout_s: float = 10.0          # the tiny answer: an idle engine gives it at once
    max_reads: int = 6                      # a standalone check gives up waiting for a verdict
    slots: int | None = None                # the engine's max_num_seqs, where known


@dataclass(frozen=True)
class CheckStep:
    """What one ``check_once`` saw and did."""

    judgement: Judgement
    snapshot: MetricsSnapshot | None
    sent_test_request: bool
    steps_per_s: float | None = None
    generation_tokens_per_s: float | None = None


@dataclass(frozen=True)
class HealthReport:
    url: str
    kind: str                      # "backend" or "proxy"
    verdict: Verdict
    healthy: bool
    sent_test_request: bool        # a tiny completion was sent during this check
    restarted: bool                # the server restarted between two reads of this check
    reads: int                     # reads of /metrics (proxies: 0)
    detail: str
    running: float | None = None
    waiting: float | None = None
    steps_per_s: float | None = None
    generation_tokens_per_s: float | None = None

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["verdict"] = self.verdict.value
        return out


def server_root(url: str) -> str:
    """``http://h:p/v1/`` and ``http://h:p`` name the same server; /metrics is at its root."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def first_model_id(result: HttpResult) -> str | None:
    try:
        return json.loads(result.body)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class BackendChecker:
    """Checks one vLLM backend; keeps the verdict table's state between reads."""

    def __init__(self, url: str, fetcher: Fetcher, clock: Clock,
                 settings: CheckSettings = CheckSettings(), model: str | None = None) -> None:
        self.url = server_root(url)
        self._fetcher = fetcher
        self._clock = clock
        self._settings = settings
        self._model = model
        self._state = CheckState()

    @property
    def state(self) -> CheckState:
        return self._state

    def check_once(self) -> CheckStep:
        """One read of /metrics and, only where the table asks, one tiny answer."""
        before = self._state.last
        snapshot, why = self._read_metrics()
        judgement = judge_read(self._state, snapshot, why, self._settings.slots)
        sent = False
        if judgement.action in (Action.ANSWER, Action.ANSWER_RESTARTED):
            answer, detail, sent = self._tiny_answer(snapshot.model_name or self._model)
            judgement = judge_answer(judgement.state, judgement.action, answer, detail)
        elif judgement.action is Action.BLIND:
            answer, detail, sent = self._blind()
            judgement = judge_answer(judgement.state, Action.BLIND, answer, detail)
        self._state = judgement.state
        return CheckStep(judgement, snapshot, sent, *_rates(before, snapshot))

    def run_until_verdict(self, sleep: Callable[[float], None]) -> HealthReport:
        """Read, and read again one interval later, until the table gives a verdict."""
        steps = [self.check_once()]
        while (steps[-1].judgement.action is Action.READ_AGAIN
               and len(steps) < self._settings.max_reads):
            sleep(self._settings.interval_s)
            steps.append(self.check_once())
        return self.report(steps)

    def report(self, steps: list[CheckStep]) -> HealthReport:
        last = steps[-1]
        j, snap = last.judgement, last.snapshot
        verdict, healthy, detail = j.verdict, j.healthy, j.reason
        if verdict is None:  # out of reads while requests come and go: not shown stuck
            verdict, healthy = Verdict.BUSY, True
            detail = f"no verdict after {len(steps)} reads ({j.reason}); not shown stuck"
        return HealthReport(
            url=self.url, kind="backend", verdict=verdict, healthy=bool(healthy),
            sent_test_request=any(s.sent_test_request for s in steps),
            restarted=any(s.judgement.state.restarted for s in steps),
            reads=len(steps), detail=detail,
            running=snap.running if snap else None, waiting=snap.waiting if snap else None,
            steps_per_s=last.steps_per_s, generation_tokens_per_s=last.generation_tokens_per_s)

    def _read_metrics(self) -> tuple[MetricsSnapshot | None, str]:
        result = self._fetcher.get(self.url + "/metrics", self._settings.metrics_timeout_s)
        if not result.ok:
            return None, f"/metrics: {result.describe()}"
        try:
            return parse_metrics(result.body, self._clock.monotonic()), ""
        except MetricsUnusable as e:
            return None, e.reason

    def _tiny_answer(self, model: str | None) -> tuple[Answer, str, bool]:
        if model is None:
            model = first_model_id(self._get_models())
            if model is None:
                return Answer.FAILED, "no model name (from /metrics or /v1/models)", False
        body = {"model": model, "prompt": TINY_PROMPT, "max_tokens": 1, "temperature": 0}
        result = self._fetcher.post_json(self.url + "/v1/completions", body,
                                         self._settings.answer_timeout_s)
        return (Answer.OK if result.ok else Answer.FAILED), result.describe(), True

    def _blind(self) -> tuple[Answer, str, bool]:
        models = self._get_models()
        if not models.ok:
            return Answer.NO_MODELS, f"/v1/models: {models.describe()}", False
        return self._tiny_answer(self._model or first_model_id(models))

    def _get_models(self) -> HttpResult:
        return self._fetcher.get(self.url + "/v1/models", self._settings.models_timeout_s)


def _rates(before: MetricsSnapshot | None,
           after: MetricsSnapshot | None) -> tuple[float | None, float | None]:
    if before is None or after is None or not after.same_process_as(before):
        return None, None
    elapsed = after.at_s - before.at_s
    if elapsed <= 0:
        return None, None
    return ((after.steps - before.steps) / elapsed,
            (after.generation_tokens - before.generation_tokens) / elapsed)


def check_proxy(url: str, fetcher: Fetcher,
                settings: CheckSettings = CheckSettings()) -> HealthReport:
    """A least-connection proxy: only /v1/models, never /metrics, never a test request."""
    root = server_root(url)
    result = fetcher.get(root + "/v1/models", settings.models_timeout_s)
    verdict = Verdict.NO_METRICS if result.ok else Verdict.DEAD
    detail = ("proxy: /v1/models answered (its backends are checked directly)" if result.ok
              else f"proxy: /v1/models: {result.describe()}")
    return HealthReport(url=root, kind="proxy", verdict=verdict, healthy=result.ok,
                        sent_test_request=False, restarted=False, reads=0, detail=detail)


def check_all(backends: list[str], proxies: list[str], fetcher: Fetcher, clock: Clock,
              settings: CheckSettings, sleep: Callable[[float], None]) -> list[HealthReport]:
    """Every URL at once (each waits its own intervals); reports in the order given."""
    jobs: list[Callable[[], HealthReport]] = [
        (lambda u=u: BackendChecker(u, fetcher, clock, settings).run_until_verdict(sleep))
        for u in backends]
    jobs += [(lambda u=u: check_proxy(u, fetcher, settings)) for u in proxies]
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(len(jobs), 32)) as pool:
        return list(pool.map(lambda job: job(), jobs))
