"""The health check's ``Fetcher`` over an in-process ``SimEngine``: no sockets, no time.

Answers what the simulator's HTTP server would: ``/metrics`` (404 in the no-metrics fault),
``/v1/models``, and ``/v1/completions``, which an engine that can step answers by stepping
until the request is done (an idle engine answers at once) and a stuck or wedged one never
answers (a timeout). ``down`` plays a process that is not there (refused connections);
``completions_while_full`` counts completions received while every slot was taken.
"""

from __future__ import annotations

import json
from urllib.parse import urlparse

from replicas.llm_http import HttpResult
from tests.llm_sim.engine import SimEngine


class SimFetcher:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.down = False                  # nothing listens (dead, or a restart under way)
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        self.completions_while_full = 0
        self.completions_while_busy = 0

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p in self.requests if method is None or m == method]

    def get(self, url: str, timeout_s: float) -> HttpResult:
        path = urlparse(url).path
        self.requests.append(("GET", path))
        if self.down:
            return HttpResult(None, error="no answer: [Errno 111] Connection refused")
        if path == "/metrics":
            if self.engine.fault == "no-metrics":
                return HttpResult(404, "Not Found")
            return HttpResult(200, self.engine.metrics_text())
        if path == "/v1/models":
            return HttpResult(200, json.dumps({"data": [{"id": self.engine.model}]}))
        return HttpResult(404, "Not Found")

    def post_json(self, url: str, body: dict, timeout_s: float) -> HttpResult:
        path = urlparse(url).path
        self.requests.append(("POST", path))
        if self.down:
            return HttpResult(None, error="no answer: [Errno 111] Connection refused")
        self.completions_while_full += self.engine.full
        self.completions_while_busy += self.engine.busy
        request = self.engine.submit(int(body.get("max_tokens", 16)))
        if not self.engine.step_until_done(request, max_steps=10_000):
            self.engine.abort(request)  # the client timed out and went away
            return HttpResult(None, error=f"timed out after {timeout_s:g}s")
        return HttpResult(200, json.dumps({"choices": [{"text": " tok"}]}))
