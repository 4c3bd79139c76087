"""``fleetplane probe readiness|liveness``: a node's own Kubernetes probes (seed 004).

Each node's serving health is decided by a probe on that node, not by a central checker
walking every pod. Run inside a node's pod:

- ``liveness``: the local raylet is healthy (Ray's dashboard agent on the node answers
  ``/api/local_raylet_healthz``). A node that is not ready is not restarted for that.
- ``readiness``: liveness, and this node's listener answers ``/-/healthz`` "success": it
  holds a route table and its node is not draining (a draining node's listener answers
  503 at once and keeps serving what it is sent). With ``--head``, readiness is liveness
  alone: the head must become ready before any application exists (the seed's circular
  dependency); its HTTP health stays with the controller. ``--serve-api URL`` (a
  RayService's head): also a Serve controller answers Serve's REST API at URL
  (fleetplane's, ``controlplane.serve_facade``), with Ray's token from
  ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH``/``~/.ray/auth_token`` when there is one.

Exit 0 (ok) or 1 (not), one line of why. The raylet check gives up after
``--raylet-timeout-s`` (1.5 s): while the head node's GCS does not answer, Ray's agent
answers it "success" (a silent GCS is not the raylet's failure) but only after its own GCS
call fails, about 1 s later (measured here); a shorter wait would fail every worker's
probes through a head restart, and Kubernetes would take every worker out of its Service,
then restart them. The listener's check gives up after ``--timeout-s`` (0.4 s): both
answer within 2 s. Needs no Ray import and no driver.
"""

from __future__ import annotations

import argparse
import urllib.error
import urllib.request

EXIT_OK, EXIT_NOT = 0, 1
AGENT_PORT = 52365  # Ray's default dashboard agent port (ray start --dashboard-agent-listen-port)
RAYLET_TIMEOUT_S = 1.5


def add_probe_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("probe", help="this node's readiness or liveness, for Kubernetes "
                       "probes: exit 0 or 1 with one line of why")
    p.add_argument("kind", choices=["readiness", "liveness"])
    p.add_argument("--host", default="127.0.0.1",
                   help="the node's address its listener and Ray's agent serve on "
                   "(default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="readiness: the HTTP port, http_options.port (default 8000)")
    p.add_argument("--agent-port", type=int, default=AGENT_PORT,
                   help=f"Ray's dashboard agent port on this node (default {AGENT_PORT})")
    p.add_argument("--head", action="store_true",
                   help="this is the head node: readiness is liveness alone")
    p.add_argument("--serve-api", metavar="URL", help="readiness: also require Serve's "
                   "REST API at URL to answer with a controller (a RayService's head)")
    p.add_argument("--timeout-s", type=float, default=0.4,
                   help="the listener's and Serve API's check (default 0.4)")
    p.add_argument("--raylet-timeout-s", type=float, default=RAYLET_TIMEOUT_S,
                   help=f"the raylet's check (default {RAYLET_TIMEOUT_S:g}: Ray's agent "
                   "answers it in about 1 s while the head's GCS is down)")
    return p


def check_url(url: str, timeout_s: float) -> str:
    """"" when ``url`` answers 200 "success", else why not, in a few words."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(200).decode(errors="replace").strip()
            return "" if body == "success" else f"{url} answered {body!r}"
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code} {e.read(200).decode(errors='replace').strip()!r}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"{url} did not answer ({reason})"


def check_serve_api(base: str, timeout_s: float) -> str:
    """"" when a Serve controller answers ``GET base/api/serve/applications/``."""
    import json

    from controlplane.admin_surface import read_token

    token = read_token()
    url = f"{base.rstrip('/')}/api/serve/applications/"
    request = urllib.request.Request(
        url, headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            details = json.loads(response.read())
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"{url} did not answer ({getattr(e, 'reason', e)})"
    if not (details.get("controller_info") or {}).get("node_id"):
        return f"{url}: no Serve controller answers yet (fleetplane is starting)"
    return ""


def cmd_probe(args: argparse.Namespace) -> int:
    raylet = check_url(f"http://{args.host}:{args.agent_port}/api/local_raylet_healthz",
                       args.raylet_timeout_s)
    if raylet:
        print(f"not {'alive' if args.kind == 'liveness' else 'ready'}: raylet: {raylet}")
        return EXIT_NOT
    if args.kind == "readiness" and args.serve_api:
        serve_api = check_serve_api(args.serve_api, args.timeout_s * 5)
        if serve_api:
            print(f"not ready: serve api: {serve_api}")
            return EXIT_NOT
    if args.kind == "liveness" or args.head:
        print(f"{'alive' if args.kind == 'liveness' else 'ready'}: the raylet is healthy"
              + (" and fleetplane answers Serve's API" if args.serve_api else ""))
        return EXIT_OK
    listener = check_url(f"http://{args.host}:{args.port}/-/healthz", args.timeout_s)
    if listener:
        print(f"not ready: listener: {listener}")
        return EXIT_NOT
    print(f"ready: the raylet is healthy and {args.host}:{args.port} routes")
    return EXIT_OK
