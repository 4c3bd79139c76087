"""The same Ray Serve applications under Ray Serve 2.60 and under fleetplane, on one local
Ray, asked the same requests: status, content type and body must be identical (issue 12).

The apps are ``tests.integration.serve_compat_apps`` (Serve's API only). Fields that name
a replica (its tag) differ by nature and are left out of the comparison. Prints one row
per request, records them with ``release_tests.results.record`` (the rows as Parquet
beside the summary), ends with a JSON line, exits 1 on any difference not by design.
``--smoke``: the same on one app (compat-api, 6 requests).

    .venv/bin/python -m release_tests.serve_compat_diff [--apps compat-api,...] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import ray
import requests
from ray import serve

from controlplane.config.schema import parse_deploy_config
from controlplane.instance import Client
from release_tests.machine import describe_line
from release_tests.results import parse_args, record
from release_tests.serve_peer import init_local_ray
from tests.integration import serve_compat_apps as apps

MODULE = "tests.integration.serve_compat_apps"
# (application, import attribute, Serve's app object, deployments for fleetplane, a path
# it answers 200 once ready (with a model id for Multi))
APPS = [
    ("compat-api", "api_app", apps.api_app, ["Api"], "/compat-api/hi"),
    ("compat-standalone", "standalone_app", apps.standalone_app, ["ASGIIngressDeployment"],
     "/compat-standalone/square/1"),
    ("compat-factory", "factory_app", apps.factory_app, ["ASGIIngressDeployment", "Adder"],
     "/compat-factory/add/1"),
    ("compat-batch", "batch_app", apps.batch_app, ["Batcher"], "/compat-batch?x=1"),
    ("compat-multi", "multi_app", apps.multi_app, ["Multi"], "/compat-multi"),
    ("compat-noreq", "no_request", apps.no_request.bind(), ["no_request"], "/compat-noreq"),
    ("compat-shop", "shop_app", apps.shop_app, ["Shop"], "/compat-shop"),
]
SMOKE_APPS = "compat-api"  # FastAPI ingress: 6 of the 13 requests
REQUESTS = [  # (method, path, json body, headers)
    ("GET", "/compat-api/hi?name=ray", None, {}),
    ("POST", "/compat-api/items/7", {"name": "pen", "price": 1.5}, {}),
    ("POST", "/compat-api/items/x", {"name": "pen"}, {}),
    ("GET", "/compat-api/nope", None, {}),
    ("GET", "/compat-api/openapi.json", None, {}),
    ("GET", "/compat-api/whoami", None, {}),
    ("GET", "/compat-standalone/square/9", None, {}),
    ("GET", "/compat-factory/add/5", None, {}),
    ("GET", "/compat-batch?x=3", None, {}),
    ("GET", "/compat-multi", None, {"serve_multiplexed_model_id": "m1"}),
    ("GET", "/compat-multi", None, {}),  # no model id: the multiplexer raises
    ("GET", "/compat-noreq", None, {}),
    ("GET", "/compat-shop?item=cake", None, {}),
]
_PER_REPLICA = ("replica", "tag")  # differ by nature: left out
# Differences by design, with the reason (README: a user exception is a 500 whose body names
# a request id, to find its traceback in the logs; Serve answers a bare "Internal Server Error").
BY_DESIGN = {"GET /compat-multi": "a user exception: 500 naming a request id"}


def _comparable(response: requests.Response) -> tuple:
    body = response.text
    if response.headers.get("content-type", "").startswith("application/json"):
        value = response.json()
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _PER_REPLICA}
        body = json.dumps(value, sort_keys=True)
    return response.status_code, response.headers.get("content-type", ""), body


def start_serve(port: int, chosen: list[tuple]) -> None:
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for name, _, app, _, _ in chosen:
        serve.run(app, name=name, route_prefix=f"/{name}")


def start_fleetplane(port: int, chosen: list[tuple]) -> Client:
    client = Client()
    client.start_controller()
    client.deploy(parse_deploy_config({
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": name, "route_prefix": f"/{name}",
                          "import_path": f"{MODULE}:{attr}",
                          "deployments": [{"name": d, "ray_actor_options": {"num_cpus": 0}}
                                          for d in deps]}
                         for name, attr, _, deps, _ in chosen]}))
    return client


def _wait(base: str, chosen: list[tuple], timeout_s: float = 180) -> None:
    """Until every app answers one of its requests with 200 (a model id for Multi)."""
    ready = [path for *_, path in chosen]
    deadline = time.monotonic() + timeout_s
    while ready and time.monotonic() < deadline:
        try:
            if requests.get(base + ready[0], timeout=5,
                            headers={"serve_multiplexed_model_id": "m0"}).status_code == 200:
                ready.pop(0)
                continue
        except requests.RequestException:
            pass
        time.sleep(0.5)
    if ready:
        raise TimeoutError(f"{base}{ready[0]} did not answer 200 within {timeout_s}s")


def _requests_to(chosen: list[tuple]) -> list[tuple]:
    names = {name for name, *_ in chosen}
    return [r for r in REQUESTS if r[1].split("?")[0].split("/")[1] in names]


def compare(serve_base: str, fleet_base: str, requests_: list[tuple]) -> list[dict]:
    rows = []
    for method, path, body, headers in requests_:
        answers = [_comparable(requests.request(method, base + path, json=body,
                                                headers=headers, timeout=30))
                   for base in (serve_base, fleet_base)]
        name = f"{method} {path}" + (f" {json.dumps(headers)}" if headers else "")
        rows.append({"request": name, "serve": repr(answers[0])[:200],
                     "fleetplane": repr(answers[1])[:200], "same": answers[0] == answers[1],
                     "by_design": BY_DESIGN.get(name, "")})
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-port", type=int, default=8101)
    parser.add_argument("--fleetplane-port", type=int, default=8102)
    parser.add_argument("--apps", default=",".join(a[0] for a in APPS),
                        help="comma-separated, from: " + ", ".join(a[0] for a in APPS))
    parser.add_argument("--smoke", action="store_true",
                        help=f"the same on one app (--apps {SMOKE_APPS} unless given)")
    return parser


def main() -> int:
    parser = _parser()
    args = parse_args(parser, {"apps": SMOKE_APPS})
    names = args.apps.split(",")
    if set(names) - {a[0] for a in APPS}:
        parser.error(f"--apps: unknown {sorted(set(names) - {a[0] for a in APPS})}")
    chosen = [a for a in APPS if a[0] in names]
    started = time.monotonic()
    # a Ray of its own, never a cluster a `ray start` on this machine recorded (which
    # would refuse num_cpus)
    init_local_ray(num_cpus=16)
    try:
        start_serve(args.serve_port, chosen)
        client = start_fleetplane(args.fleetplane_port, chosen)
        serve_base = f"http://127.0.0.1:{args.serve_port}"
        fleet_base = f"http://127.0.0.1:{args.fleetplane_port}"
        _wait(serve_base, chosen), _wait(fleet_base, chosen)
        rows = compare(serve_base, fleet_base, _requests_to(chosen))
        client.shutdown(timeout_s=30)
        serve.shutdown()
    finally:
        ray.shutdown()
    print(f"machine: {describe_line()}")
    for row in rows:
        verdict = "same" if row["same"] else "by design" if row["by_design"] else "DIFFERENT"
        print(f"{verdict:9s} {row['request']}" + (f"  ({row['by_design']})"
                                                   if not row["same"] else ""))
        if not row["same"]:
            print(f"    serve:      {row['serve']}\n    fleetplane: {row['fleetplane']}")
    same = sum(r["same"] for r in rows)
    unexpected = sum(not r["same"] and not r["by_design"] for r in rows)
    line = {"requests": len(rows), "identical": same, "unexpected": unexpected}
    path = record("serve_compat_diff", {**line, "apps": names, "rows": rows,
                                        "wall_s": round(time.monotonic() - started, 1)},
                  rows, smoke=args.smoke)
    print(f"results: {path}")
    print(json.dumps(line))
    return 0 if unexpected == 0 and rows else 1


if __name__ == "__main__":
    sys.exit(main())
