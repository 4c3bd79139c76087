"""``python -m tests.llm_sim --port P --model M --slots N --step-rate-hz R [--fault MODE]``.

Starts the vLLM simulator on loopback; it is what ``VLLMServer``'s configurable command runs
in tests. ``--step-rate-hz 0`` takes engine steps only when told (``POST /sim/step?n=K``), so
a test drives them instead of sleeping for them. Exits on SIGTERM/SIGINT (aiohttp's
``run_app`` handles both).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time

from aiohttp import web

from tests.llm_sim.engine import FAULTS, SimEngine
from tests.llm_sim.server import SimServer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.llm_sim", description="vLLM simulator")
    p.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="sim-model")
    p.add_argument("--slots", type=int, default=4, help="like vLLM's --max-num-seqs")
    p.add_argument("--step-rate-hz", type=float, default=100.0,
                   help="engine steps per second; 0: only when told (POST /sim/step?n=K), and "
                   "a completion that finds a free slot is stepped to its end at once")
    p.add_argument("--prefill-steps", type=int, default=0,
                   help="steps each request spends reading its prompt before any output token")
    p.add_argument("--prefill-tokens-per-step", type=int, default=0,
                   help="token mode: prompt tokens the engine reads a step, shared by the "
                   "running requests (GB10 calibration: 73 at 23.2 steps/s); 0: --prefill-steps")
    p.add_argument("--cache-blocks", type=int, default=4096,
                   help="prefix cache size in 16-token blocks (LRU), token mode")
    p.add_argument("--stream-interval-s", type=float, default=0.0,
                   help="a stream's chunks after the first token at most this often "
                   "(default: every step that made tokens)")
    p.add_argument("--fault", choices=FAULTS, default="none", help="fault mode at start")
    p.add_argument("--no-start-time", action="store_true",
                   help="publish no process_start_time_seconds (vLLM with several API servers)")
    p.add_argument("--startup-delay-s", type=float, default=0.0,
                   help="wait this long before listening (like loading weights)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not _is_loopback(args.host):
        print(f"error: --host {args.host} is not a loopback address", file=sys.stderr)
        return 2
    if args.step_rate_hz < 0:
        print("error: --step-rate-hz must be 0 (steps only when told) or above",
              file=sys.stderr)
        return 2
    if args.startup_delay_s > 0:  # what a loading engine prints, for status to show
        print(f"loading weights (simulated: {args.startup_delay_s:g}s)", flush=True)
        time.sleep(args.startup_delay_s)
    engine = SimEngine(args.model, args.slots, time.time,
                       publish_start_time=not args.no_start_time,
                       prefill_tokens_per_step=args.prefill_tokens_per_step,
                       cache_blocks=args.cache_blocks)
    if args.fault != "dead":
        engine.set_fault(args.fault)
    else:
        print("simulated engine failure at start", file=sys.stderr)
        return 3
    server = SimServer(engine, args.step_rate_hz, args.prefill_steps, args.stream_interval_s)
    web.run_app(server.app(), host=args.host, port=args.port, print=None,
                handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
