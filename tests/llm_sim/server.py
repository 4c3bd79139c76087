"""The simulator's HTTP face: the OpenAI subset vLLM serves, its /metrics, and /sim controls.

Owns the HTTP routes and the step loop over a ``SimEngine``; loopback only. The engine steps
on a wall-clock period (``step_rate_hz``), or, with a rate of 0, only when told: a test then
decides exactly how many steps happen between two reads, and never sleeps for them. In that
manual mode a completion that finds a free slot is stepped to its end at once (an idle vLLM
answers at once, as the in-process ``fake_http.SimFetcher`` does), and one that would have
to queue waits for ``/sim/step`` (or its client's timeout).

- ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (with
  ``"stream": true``: server-sent events, a chunk per step that made tokens, then
  ``data: [DONE]``), ``GET /metrics`` (404 in the ``no-metrics`` fault);
- ``POST /sim/fault {"mode": M}``: switch a fault at run time (``restart`` restarts now,
  ``dead`` answers and then the process exits);
- ``POST /sim/load {"n", "max_tokens", "prefill_steps"}``: start requests inside the engine,
  so a test fills every slot without holding HTTP connections (one step admits them);
- ``POST /sim/step?n=K``: take K engine steps now, synchronously, and answer when they are
  done with the stats and ``stepped``, the steps actually taken (fewer when the engine runs
  out of work, none in the ``stuck``/``wedged`` faults); works at any step rate;
- ``GET /sim/stats``: counters, among them ``completions_while_full``, the completion
  requests received while every slot was taken: the number the health check must keep at 0;
- ``POST /sim/reset``: drop all requests, clear the fault, the counters and the prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from aiohttp import web

from tests.llm_sim.engine import SimEngine, SimRequest
from tests.llm_sim.prefix_cache import PrefixCache, prompt_text

_MAX_STEPS_PER_CALL = 100_000  # the call blocks the server while it steps
_COUNTERS = ("completions", "completions_while_full", "completions_while_busy", "metrics_reads",
             "models_reads", "completion_errors")


class SimServer:
    def __init__(self, engine: SimEngine, step_rate_hz: float, prefill_steps: int,
                 stream_interval_s: float = 0.0) -> None:
        if step_rate_hz < 0:
            raise ValueError("step_rate_hz must be 0 (steps only when told) or above")
        self.engine = engine
        self.step_period_s = 1.0 / step_rate_hz if step_rate_hz else None  # None: manual
        self.prefill_steps = prefill_steps
        self.stream_interval_s = stream_interval_s  # after the first token: coalesce chunks
        self.counters = dict.fromkeys(_COUNTERS, 0)

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.get("/v1/models", self.models), web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat), web.get("/metrics", self.metrics),
            web.get("/health", self.health), web.post("/sim/fault", self.set_fault),
            web.post("/sim/load", self.load), web.post("/sim/step", self.step),
            web.get("/sim/stats", self.stats), web.post("/sim/reset", self.reset)])
        if self.step_period_s is not None:
            app.cleanup_ctx.append(self._stepping)
        return app

    async def _stepping(self, app: web.Application):
        task = asyncio.get_running_loop().create_task(self._step_forever())
        yield
        task.cancel()

    async def _step_forever(self) -> None:
        while True:
            await asyncio.sleep(self.step_period_s)
            self.engine.step()

    # ---- the OpenAI subset ------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        self.counters["models_reads"] += 1
        return web.json_response({"object": "list", "data": [
            {"id": self.engine.model, "object": "model", "owned_by": "vllm",
             "max_model_len": 4096}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def completions(self, request: web.Request) -> web.Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.Response:
        body = await request.json()
        if body.get("model") != self.engine.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        self.counters["completions"] += 1
        self.counters["completions_while_full"] += self.engine.full
        self.counters["completions_while_busy"] += self.engine.busy
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        finished = lambda r: done.done() or done.set_result(r)
        has_room = self.engine.has_room
        sim_request = self.engine.submit(int(body.get("max_tokens") or 16),
                                         int(body.get("prefill_steps", self.prefill_steps)),
                                         on_finish=finished, prompt=prompt_text(body))
        if self.step_period_s is None and has_room:  # manual: a free slot answers at once
            self.engine.step_until_done(sim_request, sim_request.steps_left)
        if body.get("stream"):
            return await self._stream(request, sim_request, done, chat)
        try:
            result: SimRequest = await done
        except asyncio.CancelledError:  # the client went away: vLLM aborts the request
            self.engine.abort(sim_request)
            raise
        if result.error is not None:
            self.counters["completion_errors"] += 1
            return _error(500, result.error, "InternalServerError")
        return web.json_response(_completion_body(self.engine.model, result, chat))

    async def _stream(self, request: web.Request, sim_request: SimRequest,
                      done: asyncio.Future, chat: bool) -> web.StreamResponse:
        """Server-sent events: the tokens made since the last event, as vLLM streams."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sent = 0
        try:
            while True:
                finished = done.done()
                if sim_request.output_tokens > sent:
                    chunk = _stream_chunk(self.engine.model, sim_request,
                                          sim_request.output_tokens - sent, chat)
                    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    sent = sim_request.output_tokens
                if finished:
                    break
                wait_s = self.step_period_s or 0.01
                if sent:  # the first token went at once; later ones at most this often
                    wait_s = max(wait_s, self.stream_interval_s)
                await asyncio.wait([done], timeout=wait_s)
        except (asyncio.CancelledError, ConnectionResetError):
            self.engine.abort(sim_request)
            raise
        if sim_request.error is not None:
            self.counters["completion_errors"] += 1
            error = {"object": "error", "message": sim_request.error, "type": "InternalServerError"}
            await response.write(f"data: {json.dumps(error)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        if self.engine.fault == "no-metrics":
            return web.Response(status=404, text="Not Found")
        self.counters["metrics_reads"] += 1
        return web.Response(text=self.engine.metrics_text(),
                            content_type="text/plain", charset="utf-8")

    # ---- /sim controls ------------------------------------------------------------------------
    async def set_fault(self, request: web.Request) -> web.Response:
        mode = (await request.json())["mode"]
        if mode == "restart":
            self.engine.restart()
        elif mode == "dead":  # answer first, then go away like a crashed server
            asyncio.get_running_loop().call_later(0.05, os._exit, 17)
        else:
            try:
                self.engine.set_fault(mode)
            except ValueError as e:
                return _error(400, str(e), "BadRequestError")
        return web.json_response(self._stats())

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        for _ in range(int(body.get("n", 1))):
            self.engine.submit(int(body.get("max_tokens", 1000)),
                               int(body.get("prefill_steps", 0)), internal=True)
        self.engine.step()  # admit them now, so a read right after sees every slot taken
        return web.json_response(self._stats())

    async def step(self, request: web.Request) -> web.Response:
        try:
            n = int(request.query.get("n", "1"))
        except ValueError:
            n = -1
        if not 0 <= n <= _MAX_STEPS_PER_CALL:
            return _error(400, f"n must be an integer from 0 to {_MAX_STEPS_PER_CALL}",
                          "BadRequestError")
        stepped = 0
        for _ in range(n):
            if not self.engine.step():
                break  # no work, or a fault: no later step of this call would be taken either
            stepped += 1
        return web.json_response({**self._stats(), "stepped": stepped})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self._stats())

    async def reset(self, request: web.Request) -> web.Response:
        self.engine.clear()
        self.engine.cache = PrefixCache(self.engine.cache_blocks)
        self.counters = dict.fromkeys(_COUNTERS, 0)
        return web.json_response(self._stats())

    def _stats(self) -> dict:
        e = self.engine
        return {**self.counters, "running": len(e.running), "waiting": len(e.waiting),
                "slots": e.slots, "steps": e.steps, "generation_tokens": e.generation_tokens,
                "fault": e.fault, "restarts": e.restarts, "pid": os.getpid(),
                "prompt_tokens": e.prompt_tokens, "cache_queries_tokens": e.cache.queries_tokens,
                "cache_hits_tokens": e.cache.hits_tokens, "cached_blocks": len(e.cache)}


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": kind,
                              "code": status}, status=status)


def _stream_chunk(model: str, request: SimRequest, tokens: int, chat: bool) -> dict:
    text = " tok" * tokens
    if chat:
        return {"id": f"chatcmpl-{id(request)}", "object": "chat.completion.chunk",
                "model": model, "choices": [{"index": 0, "delta": {"content": text}}]}
    return {"id": f"cmpl-{id(request)}", "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": text}]}


def _completion_body(model: str, result: SimRequest, chat: bool) -> dict:
    text = " tok" * result.output_tokens
    prompt = max(1, result.prompt_tokens)
    usage = {"prompt_tokens": prompt, "completion_tokens": result.output_tokens,
             "total_tokens": prompt + result.output_tokens}
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "length"}
        return {"id": f"chatcmpl-{id(result)}", "object": "chat.completion",
                "created": int(time.time()), "model": model, "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return {"id": f"cmpl-{id(result)}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage}
