"""A Serve config applied to a running fleetplane instance, as Serve applies one to a
running Serve: the applications are the whole desired set (those not named are deleted),
and the instance-level options (``http_options``, ``grpc_options``, ``proxy_location``,
``controller_options``) of the running instance stay as they are, since neither Serve nor
fleetplane can change them without a restart. Serve logs a warning when a config tries to;
so does fleetplane (``ignored_options``).

Pure: configs in, the config to deploy out.
"""

from __future__ import annotations

from typing import Any

# Serve's instance-level fields that a running instance keeps (Serve: "HTTP options are
# ignored if Serve was already running"); fleetplane's own instance fields likewise.
_INSTANCE_FIELDS = ("http_options", "grpc_options", "proxy_location", "controller_options",
                    "logging_config")


def merged_config(running: dict | None, serve_config: dict) -> dict:
    """The config to deploy: ``serve_config``'s applications (and target_capacity, as
    given) on the running instance's own options."""
    base = {k: v for k, v in (running or {}).items() if k in _INSTANCE_FIELDS}
    if running is None:  # nothing runs yet: the config's own options, as Serve would start
        base = {k: v for k, v in serve_config.items() if k in _INSTANCE_FIELDS}
    merged = {**base, "applications": list(serve_config.get("applications", []))}
    if serve_config.get("target_capacity") is not None:
        merged["target_capacity"] = serve_config["target_capacity"]
    return merged


def ignored_options(running: dict | None, serve_config: dict) -> list[str]:
    """The instance-level options ``serve_config`` sets to something other than what
    runs: kept as they run, and named in a warning."""
    if running is None:
        return []
    ignored = []
    for key in ("http_options", "grpc_options"):
        given, now = serve_config.get(key) or {}, running.get(key) or {}
        ignored += [f"{key}.{k}" for k, v in given.items() if k in now and now[k] != v]
    return ignored


def without_apps(running: dict | None, names: list[str]) -> dict:
    """The running config with the applications ``names`` removed (``serve.delete``,
    ``serve shutdown``: the instance stays, the applications go)."""
    running = running or {}
    drop = set(names)
    return {**running, "applications": [a for a in running.get("applications", [])
                                         if a.get("name") not in drop]}


def app_names(config: dict | None) -> list[str]:
    return [a["name"] for a in (config or {}).get("applications", [])]


def as_dict(config: Any) -> dict:
    """A ``ServeDeploySchema`` (what Ray's dashboard passes) or a dict, as the fields the
    user set (Serve's own ``exclude_unset`` view: defaults stay fleetplane's)."""
    if hasattr(config, "model_dump"):
        return config.model_dump(exclude_unset=True, mode="json")
    return dict(config)
