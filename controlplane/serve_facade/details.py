"""fleetplane's status in Serve's shapes: ``ServeInstanceDetails`` (what ``serve status``,
``serve config``, ``serve.status()``, Ray's dashboard and KubeRay read) and the
``StatusOverview`` protobufs ``serve.delete`` polls. Built with Serve's own models, so a
field Serve requires cannot be left out silently: a shape Serve would refuse raises here.

Pure: fleetplane's status and config in, Serve's objects out.
"""

from __future__ import annotations

from typing import Any

from ray.serve._private.application_state import ApplicationStatusInfo, StatusOverview
from ray.serve._private.common import (
    DeploymentStatus,
    DeploymentStatusInfo,
    DeploymentStatusTrigger,
)
from ray.serve.schema import (
    APIType,
    ApplicationStatus,
    DeploymentSchema,
    ServeApplicationSchema,
    ServeInstanceDetails,
)

# fleetplane's deployment status -> (Serve's status, why)
_DEPLOYMENT_STATUS = {
    "HEALTHY": (DeploymentStatus.HEALTHY, DeploymentStatusTrigger.CONFIG_UPDATE_COMPLETED),
    "UPDATING": (DeploymentStatus.UPDATING, DeploymentStatusTrigger.CONFIG_UPDATE_STARTED),
    "UPSCALING": (DeploymentStatus.UPSCALING, DeploymentStatusTrigger.CONFIG_UPDATE_STARTED),
    "DOWNSCALING": (DeploymentStatus.DOWNSCALING,
                    DeploymentStatusTrigger.CONFIG_UPDATE_STARTED),
    "UNHEALTHY": (DeploymentStatus.UNHEALTHY, DeploymentStatusTrigger.HEALTH_CHECK_FAILED),
    "DEPLOY_FAILED": (DeploymentStatus.DEPLOY_FAILED,
                      DeploymentStatusTrigger.REPLICA_STARTUP_FAILED),
    "DELETING": (DeploymentStatus.UPDATING, DeploymentStatusTrigger.DELETING),
}
# fleetplane's replica states are Serve's names; the terminal ones Serve calls STOPPED
_REPLICA_STATES = {"STARTING", "RUNNING", "UPDATING", "STOPPING"}


def deployment_status(status: str, autoscaling: bool = False) -> tuple[DeploymentStatus,
                                                                        DeploymentStatusTrigger]:
    serve_status, trigger = _DEPLOYMENT_STATUS.get(
        status, (DeploymentStatus.UPDATING, DeploymentStatusTrigger.UNSPECIFIED))
    if autoscaling and serve_status in (DeploymentStatus.UPSCALING,
                                        DeploymentStatus.DOWNSCALING):
        trigger = DeploymentStatusTrigger.AUTOSCALING
    return serve_status, trigger


def instance_details(status: dict, config: dict | None, *, deployed_at: dict[str, float],
                     controller: dict[str, Any], source: APIType | None = None) -> dict:
    """``ServeInstanceDetails`` as the dict Serve's controller returns. Every fleetplane
    application comes from a deploy config: it is declarative (``source``: an imperative
    filter lists none)."""
    http = (config or {}).get("http_options", {})
    apps = {} if source == APIType.IMPERATIVE else {
        name: _application(name, app, _app_config(config, name), deployed_at.get(name, 0.0))
        for name, app in status.get("applications", {}).items()}
    details = ServeInstanceDetails(
        controller_info=controller,
        proxy_location="EveryNode",
        http_options={k: http[k] for k in ("host", "port", "root_path") if k in http},
        proxies=_proxies(status.get("nodes", [])),
        applications=apps,
    )
    return details.model_dump(exclude_unset=True, mode="json")


def _application(name: str, app: dict, app_config: dict | None, deployed_at: float) -> dict:
    deployments = {dep_name: _deployment(dep_name, dep, _deployment_config(app_config, dep_name))
                   for dep_name, dep in app.get("deployments", {}).items()}
    failed = [f"{n}: {d['message']}" for n, d in app.get("deployments", {}).items()
              if d.get("status") == "DEPLOY_FAILED" and d.get("message")]
    return {
        "name": name, "route_prefix": app.get("route_prefix"), "docs_path": None,
        "status": app.get("status", ApplicationStatus.DEPLOYING.value),
        "message": "; ".join(failed), "last_deployed_time_s": deployed_at,
        "deployed_app_config": serve_app_config(app_config),
        "source": APIType.DECLARATIVE, "deployments": deployments,
        "external_scaler_enabled": False,
    }


def _deployment(name: str, dep: dict, config: dict) -> dict:
    serve_status, trigger = deployment_status(dep.get("status", ""), dep.get("autoscaling", False))
    return {
        "name": name, "status": serve_status, "status_trigger": trigger,
        "message": dep.get("message") or "", "deployment_config": config,
        "target_num_replicas": int(dep.get("target_replicas", 0)),
        "required_resources": (config.get("ray_actor_options") or {}),
        "replicas": [_replica(r) for r in dep.get("replicas", [])],
    }


def _replica(row: dict) -> dict:
    state = row.get("state", "")
    return {"replica_id": row["replica_id"],
            "state": state if state in _REPLICA_STATES else "STOPPED",
            "start_time_s": float(row.get("started_at_s", 0.0)),
            "node_id": row.get("node_id"), "actor_name": row.get("actor_name")}


def _proxies(nodes: list[dict]) -> dict:
    proxies = {}
    for node in nodes:
        proxy = node.get("proxy")
        if proxy is None or not node.get("alive", True):
            continue
        state = ("HEALTHY" if proxy.get("ready")
                 else "DRAINING" if node.get("draining") else "UNHEALTHY")
        address = proxy.get("address") or ""
        proxies[node["node_id"]] = {"node_id": node["node_id"], "status": state,
                                    "node_ip": address.rsplit(":", 1)[0] or None}
    return proxies


def _app_config(config: dict | None, name: str) -> dict | None:
    return next((a for a in (config or {}).get("applications", []) if a.get("name") == name),
                None)


def _deployment_config(app_config: dict | None, name: str) -> dict:
    """The deployment's entry in the app's config, in ``DeploymentSchema``'s fields."""
    entry = next((d for d in (app_config or {}).get("deployments", [])
                  if d.get("name") == name), {"name": name})
    return _known_fields(DeploymentSchema, {**entry, "name": name})


def serve_app_config(app_config: dict | None) -> dict | None:
    """The application's config as ``serve config`` shows it: the fields Serve's schema
    knows (fleetplane's own additions left out), or None if it does not fit Serve's."""
    if app_config is None:
        return None
    fields = _without_nones(app_config)
    fields["deployments"] = [_known_fields(DeploymentSchema, d)
                             for d in app_config.get("deployments", [])]
    return _known_fields(ServeApplicationSchema, fields)


def _without_nones(value: Any) -> Any:
    """A normalized config's unset (None) options left out, at every depth."""
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nones(v) for v in value]
    return value


def _known_fields(model: Any, data: dict) -> dict:
    """``data`` restricted to ``model``'s fields and validated by it; the fields it
    refuses are dropped one by one (a fleetplane value Serve's schema does not take)."""
    data = {k: v for k, v in data.items() if k in model.model_fields and v is not None}
    for _ in range(len(data) + 1):
        try:
            return model.model_validate(data).model_dump(exclude_unset=True, mode="json")
        except ValueError as e:
            bad = {str(err["loc"][0]) for err in e.errors() if err.get("loc")}
            if not bad & set(data) - {"name"}:
                break
            data = {k: v for k, v in data.items() if k not in bad or k == "name"}
    return {"name": data["name"]} if "name" in data else {}


def status_overview(name: str, app: dict | None) -> bytes:
    """One application's ``StatusOverview`` protobuf (``get_serve_status``): NOT_STARTED
    for an application that does not exist, as Serve answers."""
    if app is None:
        return StatusOverview(ApplicationStatusInfo(ApplicationStatus.NOT_STARTED),
                              name=name).to_proto().SerializeToString()
    deployments = [
        DeploymentStatusInfo(dep_name, *deployment_status(d.get("status", ""),
                                                          d.get("autoscaling", False)),
                             message=d.get("message") or "")
        for dep_name, d in app.get("deployments", {}).items()]
    info = ApplicationStatusInfo(ApplicationStatus(app.get("status", "DEPLOYING")))
    return StatusOverview(info, name=name,
                          deployment_statuses=deployments).to_proto().SerializeToString()
