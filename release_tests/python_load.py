"""A closed-loop HTTP load in Python: what ``http_bench --smoke`` uses where ``wrk`` is not
installed (the suite runs on machines with Python and pip only). Its figures are not wrk's
(a Python client is far slower than the servers it drives): a smoke run records which
load it used, and a measurement (no ``--smoke``) still requires wrk."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit


def closed_loop(url: str, connections: int, duration_s: float) -> dict:
    """``connections`` keep-alive clients sending GET ``url`` back to back for
    ``duration_s``: requests/s, p50/p99 (ms) and errors, in ``parse_wrk``'s shape."""
    parts = urlsplit(url)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def client() -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        mine, failed = [], 0
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            try:
                conn.request("GET", parts.path or "/")
                response = conn.getresponse()
                response.read()
                if response.status >= 400:
                    failed += 1
                mine.append((time.perf_counter() - began) * 1000)
            except (OSError, http.client.HTTPException):
                failed += 1
                conn.close()
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.close()
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    threads = [threading.Thread(target=client) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered \
        else float("nan")
    return {"requests_per_s": len(ordered) / duration_s, "p50_ms": pick(0.5),
            "p99_ms": pick(0.99), "p999_ms": pick(0.999), "errors": errors[0], "cdf": []}
