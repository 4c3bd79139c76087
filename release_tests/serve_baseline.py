"""Ray Serve 2.60 serving the same no-op deployment, for the side-by-side benchmark.
Runs until SIGINT/SIGTERM; prints READY when it serves."""

from __future__ import annotations

import argparse
import signal
import threading

import ray
from ray import serve

from release_tests import noop_app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--app", default="serve_app", help="an application in noop_app")
    args = parser.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(getattr(noop_app, args.app), route_prefix="/noop")
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
