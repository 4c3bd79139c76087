"""A reload keeps the old worker until its streams end (the real binary, a local
streaming backend; no Ray): the stale worker the two-phase shutdown must reach."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import requests
import uvicorn

from controlplane.ingress.haproxy import membership
from controlplane.ingress.haproxy.config import Paths, render
from controlplane.ingress.haproxy.process import HAProxyProcess

LINES = 60  # a 3 s stream


async def slow_stream(scope, receive, send) -> None:
    """The replicas' direct ingress is uvicorn: a chunked HTTP/1.1 stream."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/-/healthz":  # HAProxy's checks, as a replica answers them
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"success"})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    for _ in range(LINES):
        await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
        await asyncio.sleep(0.05)
    await send({"type": "http.response.body", "body": b""})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_open_keep_alive_stream_survives_a_reload_in_the_old_worker(tmp_path):
    backend_port, port = free_port(), free_port()
    backend = uvicorn.Server(uvicorn.Config(slow_stream, host="127.0.0.1", port=backend_port,
                                            log_level="warning"))
    threading.Thread(target=backend.run, daemon=True).start()
    haproxy = HAProxyProcess(Paths(tmp_path))
    haproxy.start(render(haproxy.paths, "127.0.0.1", port, {"/app": "a/M"}))
    try:
        [worker] = haproxy.workers()
        for command in membership.add_commands(membership.backend_name("a/M"), "s1",
                                               f"127.0.0.1:{backend_port}", 5):
            haproxy.on_worker(worker, command)
        time.sleep(1.5)  # the backend up and its first health check passed
        with requests.get(f"http://127.0.0.1:{port}/app", stream=True, timeout=10) as r:
            chunks = r.iter_content(chunk_size=None)
            first = next(chunks)
            haproxy.reload(render(haproxy.paths, "127.0.0.1", port,
                                  {"/app": "a/M", "/b": "b/M"}))
            time.sleep(0.3)  # an old worker that closes its connections would be gone now
            assert sorted(w.reloads for w in haproxy.workers()) == [0, 1]  # the old one kept
            assert first + b"".join(chunks) == b"tick\n" * LINES
    finally:
        haproxy.stop()
        backend.should_exit = True
