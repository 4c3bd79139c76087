"""Assembles ``fleetplane status --json`` (contract in DESIGN.md) from shard reports.

Application status folds its deployments' statuses: DEPLOY_FAILED if any failed,
RUNNING when all are HEALTHY, DELETING while a removed application drains, UNHEALTHY if
any deployment is, else DEPLOYING. ``controller.health`` merges the shards' push-health
statistics (counters and self-check intervals).
"""

from __future__ import annotations

from typing import Any

from controlplane.health.health_stats import merge_all


def app_status(dep_statuses: list[str]) -> str:
    if not dep_statuses:
        return "DEPLOYING"
    for status in ("DEPLOY_FAILED", "DELETING", "UNHEALTHY"):
        if status in dep_statuses:
            return status
    return "RUNNING" if all(s == "HEALTHY" for s in dep_statuses) else "DEPLOYING"


def assemble_status(config: dict | None, shards: list[dict], generation: int) -> dict[str, Any]:
    deployments: dict[str, dict[str, dict]] = {}
    for shard in shards:
        for key, dep in shard["deployments"].items():
            app, name = key.split("/", 1)
            deployments.setdefault(app, {})[name] = dep
    apps_in_config = {a["name"]: a for a in (config or {}).get("applications", [])}
    applications = {}
    for app in list(apps_in_config) + sorted(set(deployments) - set(apps_in_config)):
        deps = deployments.get(app, {})
        applications[app] = {
            "status": app_status([d["status"] for d in deps.values()]),
            "route_prefix": apps_in_config.get(app, {}).get("route_prefix"),
            "deployments": dict(sorted(deps.items())),
        }
    return {
        "applications": applications,
        "controller": {
            "num_shards": len(shards),
            "generation": generation,
            "shards": [{"index": s["index"], "deployments": len(s["deployments"]),
                        "ticks": s["ticks"], "tick_errors_total": s["tick_errors_total"],
                        "last_tick_ms": s["last_tick_ms"],
                        **({"unavailable": s["unavailable"]} if "unavailable" in s else {})}
                       for s in shards],
            # Push health across shards (exact merge: counters add, histograms add).
            "health": merge_all(s["health"] for s in shards if "health" in s).as_json(),
        },
    }
