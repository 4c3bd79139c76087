"""A local Ray for Ray Serve, the peer some release runs compare with or start beside us.

Serve's controller gives a new proxy ``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S`` (5 s) to
answer its first ready check, then kills it, and ``serve.start`` fails with the proxy's
``ActorDiedError`` ("killed by ray.kill ... never ran"). On this 2-core machine with the
suite's smoke runs side by side, a worker process can take longer than that to start (CI,
2026-12-07). The limit only bounds startup: no timed region includes it, so raising it
changes no figure."""

from __future__ import annotations

import os

import ray

PROXY_READY_CHECK_TIMEOUT_S = "60"


def init_local_ray(**kwargs) -> None:
    """``ray.init`` on a Ray of its own (``address="local"``: never a cluster another run
    started on this machine), with Serve's proxy ready check given time to pass. Set here,
    before the Ray starts: its workers (Serve's controller among them) inherit it."""
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", PROXY_READY_CHECK_TIMEOUT_S)
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **kwargs)
