"""Ray Serve 2.60 serving one of ``noop_app``'s deployments, for the side-by-side release
tests (``http_bench``, ``retry_after_http``, ``overload_idle``). Runs until SIGINT/SIGTERM;
prints READY when it serves.

``--app`` names an application or a deployment in ``noop_app``; a deployment takes
``--max-ongoing-requests``, ``--max-queued-requests``, ``--num-replicas`` and
``--no-access-log`` through Serve's own ``Deployment.options`` (the documented deployment
settings: ``logging_config={"enable_access_log": False}`` is Serve's switch for the line it
writes per request). Serve's process-wide settings (``RAY_SERVE_ENABLE_HA_PROXY``,
``RAY_SERVE_THROUGHPUT_OPTIMIZED``, ``RAY_worker_niceness``) are environment variables that
the caller sets for this process.
"""

from __future__ import annotations

import argparse
import signal
import threading

import ray
from ray import serve

from release_tests import noop_app
from release_tests.serve_peer import init_local_ray


def application(args: argparse.Namespace) -> serve.Application:
    """The application ``--app`` names, with the options given for a deployment."""
    target = getattr(noop_app, args.app)
    options = {k: v for k, v in (("max_ongoing_requests", args.max_ongoing_requests),
                                 ("max_queued_requests", args.max_queued_requests),
                                 ("num_replicas", args.num_replicas)) if v is not None}
    if args.no_access_log:
        options["logging_config"] = {"enable_access_log": False}
    if isinstance(target, serve.Application):
        if options:
            raise SystemExit(f"--app {args.app} is an application: options need a deployment")
        return target
    return target.options(**options).bind()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--app", default="serve_app",
                        help="an application or a deployment in noop_app")
    parser.add_argument("--max-ongoing-requests", type=int)
    parser.add_argument("--max-queued-requests", type=int)
    parser.add_argument("--num-replicas", type=int)
    parser.add_argument("--no-access-log", action="store_true",
                        help="logging_config={'enable_access_log': False}")
    args = parser.parse_args()
    app = application(args)
    # a Ray of its own: Ray's "auto" joins the last one, where fleetplane may answer Serve's name
    init_local_ray()
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(app, route_prefix="/noop")
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
