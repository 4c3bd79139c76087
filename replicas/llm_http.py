"""The health check's door to HTTP: a two-method ``Fetcher`` and its stdlib implementation.

Owns turning every HTTP outcome into one ``HttpResult`` value (a status, or no status and
an error), so the check's shell never handles transport exceptions and unit tests can
inject a fake with the same two methods.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Protocol

_BODY_LIMIT = 1 << 20  # /metrics of a large vLLM is ~100 KB; never read an unbounded body


@dataclass(frozen=True)
class HttpResult:
    status: int | None  # None: no HTTP answer at all (refused, reset, timed out)
    body: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        if self.status is None:
            return self.error or "no answer"
        return f"HTTP {self.status}" + (f": {self.body[:200]}" if not self.ok else "")


class Fetcher(Protocol):
    def get(self, url: str, timeout_s: float) -> HttpResult: ...

    def post_json(self, url: str, body: dict, timeout_s: float) -> HttpResult: ...


class UrllibFetcher:
    """Blocking stdlib HTTP; each call is bounded by its own timeout.

    Environment proxies (``http_proxy``) are ignored: the check must reach the server it
    judges directly, not whatever an environment variable routes it through.
    """

    def __init__(self) -> None:
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, url: str, timeout_s: float) -> HttpResult:
        return self._send(url, None, timeout_s)

    def post_json(self, url: str, body: dict, timeout_s: float) -> HttpResult:
        return self._send(url, json.dumps(body).encode(), timeout_s)

    def _send(self, url: str, data: bytes | None, timeout_s: float) -> HttpResult:
        try:
            request = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                             headers={"Content-Type": "application/json"})
        except ValueError as e:  # not a URL at all
            return HttpResult(None, error=f"bad URL: {e}")
        return self._open(request, timeout_s)

    def _open(self, request: urllib.request.Request, timeout_s: float) -> HttpResult:
        try:
            with self._opener.open(request, timeout=timeout_s) as response:
                return HttpResult(response.status, _text(response.read(_BODY_LIMIT)))
        except urllib.error.HTTPError as e:
            return HttpResult(e.code, _text(e.read(_BODY_LIMIT)))
        except urllib.error.URLError as e:
            return HttpResult(None, error=f"no answer: {e.reason}")
        except (socket.timeout, TimeoutError):
            return HttpResult(None, error=f"timed out after {timeout_s:g}s")
        except OSError as e:  # reset mid-response and the like
            return HttpResult(None, error=f"no answer: {e!r}")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
