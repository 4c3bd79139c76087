"""``VLLMServer``: an LLM replica kind that runs an OpenAI-compatible engine subprocess.

Deploy it with ``import_path: replicas.vllm_replica:VLLMServer`` and its constructor
arguments under ``args:`` (see ``deployments/llm-gb10.yaml``; ``deployments/llm-sim.yaml``
runs it on the simulator). It owns:

- the engine: ``vllm serve MODEL`` on 127.0.0.1 and a free port (``llm_engine.py``; the
  command is configurable), started by the constructor, which returns once /v1/models
  answers; the engine dies with the replica, even when Ray SIGKILLs the replica;
- traffic: ``__call__``/``completions``/``chat``/``models`` forward to the engine's API;
- health: seed 001's check (``llm_health.py``) runs in a background task every
  ``health_interval_s``; ``check_health()`` only reads its latest outcome, so it returns at
  once, never waits behind user traffic, and never sends a request itself. It raises only
  once ``RestartPolicy`` has decided a restart on a STUCK or DEAD verdict (or the engine
  exited), and then keeps raising: the shard, the one owner of restarts, replaces the
  replica after its unhealthy threshold, and the new replica starts with a fresh policy.
  Request errors never reach the policy, so the 5xx of one restart cannot cause the next.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import weakref
from typing import Any, Sequence

from controlplane.clock import Clock, SystemClock
from replicas.context import report_start_progress
from replicas.llm_client import EngineClient, EngineRequestError
from replicas.llm_engine import DEFAULT_COMMAND, EngineProcess, free_port, render_command
from replicas.llm_health import (DEFAULT_INTERVAL_S, BackendChecker, CheckSettings, CheckStep,
                                 first_model_id)
from replicas.llm_http import UrllibFetcher
from replicas.llm_metrics import MetricsSnapshot, engine_stats
from replicas.llm_restart import Decision, RestartPolicy
from replicas.llm_verdict import Action, Verdict

logger = logging.getLogger(__name__)

__all__ = ["VLLMServer", "EngineUnhealthy", "EngineRequestError"]


class EngineUnhealthy(Exception):
    """check_health's answer once a restart is decided (one failed check per call)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class VLLMServer:
    def __init__(self, model: str, tensor_parallel_size: int = 1, max_num_seqs: int = 16,
                 extra_args: Sequence[str] = (), command: Sequence[str] | None = None,
                 port: int | None = None, health_interval_s: float = DEFAULT_INTERVAL_S,
                 answer_timeout_s: float = 10.0, startup_timeout_s: float = 900.0,
                 request_timeout_s: float = 900.0, env: dict[str, str] | None = None,
                 clock: Clock | None = None) -> None:
        self.model = model
        self._clock = clock or SystemClock()
        host = "127.0.0.1"
        port = port or free_port(host)
        argv = render_command(command or DEFAULT_COMMAND, {
            "model": model, "host": host, "port": port, "max_num_seqs": max_num_seqs,
            "tensor_parallel_size": tensor_parallel_size, "python": sys.executable}, extra_args)
        self._engine = EngineProcess(argv, host, port, env)
        self._engine.start()
        report_start_progress(f"engine started (pid {self._engine.pid}); loading the model")
        # No engine outlives its replica: at garbage collection or interpreter exit too.
        self._finalizer = weakref.finalize(self, self._engine.stop)
        fetcher = UrllibFetcher()
        try:
            self._engine.wait_ready(
                fetcher, self._clock, startup_timeout_s, time.sleep,
                progress=lambda line: report_start_progress(
                    f"loading the model; engine says: {line[-120:]}" if line
                    else "loading the model"))
        except BaseException:
            self.shutdown()
            raise
        report_start_progress("engine answered /v1/models; first health check pending")
        self._settings = CheckSettings(interval_s=health_interval_s,
                                       answer_timeout_s=answer_timeout_s, slots=max_num_seqs)
        self._checker = BackendChecker(self._engine.url, fetcher, self._clock, self._settings)
        # The name the engine serves under (--served-model-name may differ from ``model``).
        served = first_model_id(fetcher.get(self._engine.url + "/v1/models", 5.0)) or model
        self._client = EngineClient(self._engine.url, served, request_timeout_s)
        self._policy = RestartPolicy()
        self._last: dict | None = None        # the latest check step, reported or not
        self._verdict: Verdict | None = None  # the latest verdict reported
        self._checks = 0
        self._kv_cache_usage: float | None = None  # from the last /metrics the check read
        self._max_num_seqs = max_num_seqs
        self._engine_stats: dict[str, float] = {}  # what the last read says, for scaling
        self._previous_read: MetricsSnapshot | None = None
        self._health_task: asyncio.Task | None = None

    # ---- traffic -------------------------------------------------------------------------------
    async def __call__(self, request: Any) -> Any:
        """A handle call with an OpenAI request body (``messages`` makes it a chat
        completion), or an HTTP request from the proxy, forwarded to the engine as is."""
        if not isinstance(request, dict):
            return await self._client.forward_http(request)
        if "messages" in request:
            return await self.chat(request)
        return await self.completions(request)

    async def completions(self, request: dict) -> dict:
        return await self._client.post("/v1/completions", request)

    async def chat(self, request: dict) -> dict:
        return await self._client.post("/v1/chat/completions", request)

    async def models(self) -> dict:
        return await self._client.get("/v1/models")

    # ---- health --------------------------------------------------------------------------------
    async def check_health(self) -> None:
        """Reads the background check's outcome; raises only when a restart is decided."""
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._check_forever())
        code = self._engine.exit_code()
        if code is not None:
            raise EngineUnhealthy(f"dead: the engine exited with status {code}\n"
                                  f"{self._engine.tail()}")
        if self._policy.restarting:
            raise EngineUnhealthy(f"restart decided: {self._policy.reason}")

    async def _check_forever(self) -> None:
        """The check's only owner: one read every interval, one at a time."""
        while True:
            try:
                await asyncio.to_thread(self.check_now)
            except Exception:  # outermost loop of the task: log, keep checking
                logger.exception("LLM health check of %s failed", self._engine.url)
            await asyncio.sleep(self._settings.interval_s)

    def check_now(self) -> dict:
        """One step of the check and the policy's decision on it (blocking HTTP)."""
        if self._engine.exit_code() is not None:
            return self._decide(Verdict.DEAD, "the engine process exited", None)
        step = self._checker.check_once()
        self._checks += 1
        if step.snapshot is not None:
            self._kv_cache_usage = step.snapshot.kv_cache_usage
            self._engine_stats = engine_stats(self._previous_read, step.snapshot,
                                              self._max_num_seqs)
            self._previous_read = step.snapshot
        j = step.judgement
        if j.action is not Action.REPORT:
            return self._decide(None, j.reason, step)
        return self._decide(j.verdict, j.reason, step)

    def _decide(self, verdict: Verdict | None, reason: str, step: CheckStep | None) -> dict:
        self._policy, decision = self._policy.decide(verdict, self._clock.monotonic(), reason)
        self._verdict = verdict or self._verdict
        if decision is Decision.RESTART:
            logger.error("engine %s: restart decided (%s)", self._engine.url, reason)
        report = None if step is None or verdict is None else self._checker.report([step])
        self._last = {"verdict": verdict.value if verdict else None, "reason": reason,
                      "decision": decision.value,
                      "report": report.to_dict() if report else None}
        return self._last

    def record_routing_stats(self) -> dict:
        """Serve's routing-stats hook: the KV-cache use the last check read of
        ``/metrics`` (the kv_load routing policies). Reads what the check has; never asks
        the engine (a probe must not wait)."""
        return {} if self._kv_cache_usage is None else {"kv_cache_usage": self._kv_cache_usage}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom-metrics hook (``record_autoscaling_stats``): what the last check
        read of ``/metrics`` (running, waiting, KV-cache use, TTFT p90 since the read
        before, and the engine's slots), for the LLM autoscaling policy. Reads what the
        check has; never asks the engine."""
        return dict(self._engine_stats)

    def statistics(self) -> dict:
        """A snapshot: engine, last check, restart decision."""
        return {"url": self._engine.url, "guard_pid": self._engine.pid,
                "engine_exit_code": self._engine.exit_code(), "checks": self._checks,
                "verdict": self._verdict.value if self._verdict else None,
                "last_check": self._last, "restart_decided": self._policy.restarting,
                "restart_reason": self._policy.reason}

    # ---- shutdown ------------------------------------------------------------------------------
    def __del__(self) -> None:  # Serve's clean-up hook: the replica calls it on a stop
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the health task and the engine (idempotent; the replica may call it).

        ``weakref.finalize`` also runs it when the object is collected or the interpreter
        exits (the ``__del__``/atexit path). A replica killed outright is covered by the
        engine's guard and the kernel (``llm_engine_guard.py``).
        """
        if getattr(self, "_health_task", None) is not None:
            self._health_task.cancel()
        if getattr(self, "_client", None) is not None:
            try:
                asyncio.get_running_loop().create_task(self._client.close())
            except RuntimeError:
                pass  # no loop here: the session goes with the process
        self._finalizer()
