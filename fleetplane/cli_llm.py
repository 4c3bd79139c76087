"""``fleetplane llm-health``: seed 001's check of vLLM servers, standalone.

``fleetplane llm-health [--interval-s S] [--json] URL... [--proxy URL]...``: each URL is a
backend (an OpenAI-compatible vLLM server, checked through /metrics; a tiny completion only
when it holds no request or publishes no metrics); each ``--proxy`` is a least-connection
proxy, checked only through /v1/models. All URLs are checked at once; a backend takes one
read when idle, two when busy, three when it has to be shown stuck (two intervals).

Exit codes: 0 every URL healthy; 1 any is not (stuck, dead, or a no-metrics server whose
tiny answer failed); 2 bad arguments. Needs no Ray and no running fleetplane.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 2


def add_llm_health_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from replicas.llm_health import DEFAULT_INTERVAL_S

    p = sub.add_parser("llm-health", help="check vLLM servers through /metrics without taking "
                       "a request slot (seed 001); exit 1 if any is stuck or dead")
    p.add_argument("urls", nargs="*", metavar="URL", help="a backend: an OpenAI-compatible "
                   "vLLM server, e.g. http://10.0.0.5:8000 (a trailing /v1 is fine)")
    p.add_argument("--proxy", action="append", default=[], metavar="URL",
                   help="a least-connection proxy in front of backends: checked only through "
                   "/v1/models (repeatable)")
    p.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S,
                   help="seconds between two reads of /metrics; two intervals must outlast "
                   f"the longest engine step (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--answer-timeout-s", type=float, default=10.0,
                   help="timeout of the tiny completion sent to an idle server (default 10)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help="the servers' --max-num-seqs: a server that restarted between two "
                   "reads is asked for the tiny answer while one of its N slots is free")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per URL")
    return p


def cmd_llm_health(args: argparse.Namespace) -> int:
    from controlplane.clock import SystemClock
    from replicas.llm_health import CheckSettings, check_all
    from replicas.llm_http import UrllibFetcher

    if not args.urls and not args.proxy:
        print("error: give at least one backend URL or --proxy URL", file=sys.stderr)
        return EXIT_USAGE
    bad = [u for u in [*args.urls, *args.proxy] if not u.startswith(("http://", "https://"))]
    if bad:
        print(f"error: not an http(s) URL: {', '.join(bad)}; write e.g. http://HOST:8000",
              file=sys.stderr)
        return EXIT_USAGE
    if args.interval_s <= 0 or args.answer_timeout_s <= 0:
        print("error: --interval-s and --answer-timeout-s must be above 0", file=sys.stderr)
        return EXIT_USAGE
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        print("error: --max-num-seqs must be 1 or more", file=sys.stderr)
        return EXIT_USAGE
    settings = CheckSettings(interval_s=args.interval_s, answer_timeout_s=args.answer_timeout_s,
                             slots=args.max_num_seqs)
    reports = check_all(args.urls, args.proxy, UrllibFetcher(), SystemClock(), settings,
                        time.sleep)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        print(render_reports(reports))
    return EXIT_HEALTHY if all(r.healthy for r in reports) else EXIT_UNHEALTHY


def render_reports(reports: list) -> str:
    lines = []
    for r in reports:
        load = "" if r.running is None else f" running={r.running:g} waiting={r.waiting:g}"
        rate = "" if r.steps_per_s is None else f" steps/s={r.steps_per_s:.1f}"
        flags = (" test-request" if r.sent_test_request else "") + (
            " restarted" if r.restarted else "")
        state = "healthy" if r.healthy else "UNHEALTHY"
        lines.append(f"{r.url} [{r.kind}] {r.verdict.value} {state}{load}{rate}{flags}: "
                     f"{r.detail}")
    return "\n".join(lines)
