"""Assembles ``fleetplane status --json`` (its fields: ARCHITECTURE.md, "The status JSON,
field by field") from shard reports.

Application status folds its deployments' statuses: DEPLOY_FAILED if any failed,
RUNNING when all are HEALTHY, DELETING while a removed application drains, UNHEALTHY if
any deployment is, else DEPLOYING. ``controller.health`` merges the shards' push-health
statistics (counters and self-check intervals).

Filters (``app``, ``deployment``) are applied by the shards, which build no entry for the
other deployments; here they only decide which applications are listed. With a
``deployment`` filter an application's status folds only the deployments shown. A name
that matches nothing the instance knows is ``UnknownName`` (the CLI's exit 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controlplane.health.stats import merge_all


def app_status(dep_statuses: list[str]) -> str:
    if not dep_statuses:
        return "DEPLOYING"
    for status in ("DEPLOY_FAILED", "DELETING", "UNHEALTHY"):
        if status in dep_statuses:
            return status
    return "RUNNING" if all(s == "HEALTHY" for s in dep_statuses) else "DEPLOYING"


class UnknownName(LookupError):
    """A status filter names no application or deployment of this instance (terminal)."""

    def __init__(self, kind: str, name: str, known: list[str], app: str | None = None) -> None:
        super().__init__(kind, name, known, app)  # all fields: it pickles across actors
        self.kind, self.name, self.known, self.app = kind, name, list(known), app

    def __str__(self) -> str:
        where = f" in application {self.app!r}" if self.app is not None else ""
        known = ", ".join(self.known) if self.known else "none"
        return f"no {self.kind} named {self.name!r}{where} (known: {known})"


def check_names(app: str | None, deployment: str | None, known: Iterable[tuple[str, str]],
                apps: Iterable[str] = ()) -> None:
    """Raise ``UnknownName`` unless the filters name something in ``known`` ((app,
    deployment) pairs) or ``apps`` (applications that may have no deployment yet)."""
    pairs = set(known)
    app_names = {a for a, _ in pairs} | set(apps)
    if app is not None and app not in app_names:
        raise UnknownName("application", app, sorted(app_names))
    names = {n for a, n in pairs if app in (None, a)}
    if deployment is not None and deployment not in names:
        raise UnknownName("deployment", deployment, sorted(names), app)


def assemble_status(config: dict | None, shards: list[dict], generation: int,
                    app: str | None = None, deployment: str | None = None) -> dict[str, Any]:
    """The status of ``shards``' answers, asked with the same ``app``/``deployment``
    filters (None: all)."""
    deployments: dict[str, dict[str, dict]] = {}
    for shard in shards:
        for key, dep in shard["deployments"].items():
            app_name, name = key.split("/", 1)
            deployments.setdefault(app_name, {})[name] = dep
    apps_in_config = {a["name"]: a for a in (config or {}).get("applications", [])}
    listed = list(apps_in_config) + sorted(set(deployments) - set(apps_in_config))
    if app is not None:
        listed = [a for a in listed if a == app]
    elif deployment is not None:  # only the applications that have it
        listed = [a for a in listed if a in deployments]
    applications = {}
    for app_name in listed:
        deps = deployments.get(app_name, {})
        applications[app_name] = {
            "status": app_status([d["status"] for d in deps.values()]),
            "route_prefix": apps_in_config.get(app_name, {}).get("route_prefix"),
            "deployments": dict(sorted(deps.items())),
        }
    return {
        "applications": applications,
        "controller": {
            "num_shards": len(shards),
            "generation": generation,
            "shards": [{"index": s["index"],
                        "deployments": s.get("deployments_owned", len(s["deployments"])),
                        "ticks": s["ticks"], "tick_errors_total": s["tick_errors_total"],
                        "last_tick_ms": s["last_tick_ms"],
                        **({"work": s["work"]} if "work" in s else {}),
                        **({"unavailable": s["unavailable"]} if "unavailable" in s else {})}
                       for s in shards],
            # Push health across shards (exact merge: counters add, histograms add).
            "health": merge_all(s["health"] for s in shards if "health" in s).as_json(),
        },
    }
