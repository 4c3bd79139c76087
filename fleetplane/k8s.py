"""``fleetplane k8s render``: a KubeRay ``RayCluster`` (ray.io/v1) that runs a deploy config,
or with ``--rayservice`` a KubeRay ``RayService`` whose ``serveConfigV2`` is its applications.

What it renders (one YAML stream): a ConfigMap holding the deploy config; the RayCluster
with a head group (Ray's head, plus a ``fleetplane`` container that runs the config
against it) and worker groups (CPU workers, and GB10 workers with ``resources: {"GB10":
1}`` and a GPU limit); a Service over every pod's HTTP port. A RayService carries the same
cluster (``rayClusterConfig``): its fleetplane container starts with the instance's
options and no application, KubeRay PUTs ``serveConfigV2`` to the head's dashboard, and
fleetplane answers that Serve API (``controlplane.serve_facade``). KubeRay calls the
dashboard only once the head pod is ready; the head's readiness then also waits for
fleetplane to answer Serve's API (``probe --serve-api``), so KubeRay's first PUT can never
start a real Serve controller.

Probes, seed 004: each node's serving health is decided by a probe on that node.
Workers: liveness is the raylet (``fleetplane probe liveness``), readiness is the raylet
and the node's listener (``fleetplane probe readiness``), which fails at once when the
node drains, so the Service stops sending to a pod before it dies. The head's readiness is
the raylet alone (the head must be ready before any application exists). A preStop hook
drains the node (``ray drain-node``, reason preemption, with a deadline inside the pod's
grace period) and keeps the pod up while fleetplane moves its replicas.

Pure: the config in, dicts out; ``render_yaml`` joins them.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

RAY_IMAGE = "rayproject/ray:2.60.0-py311"
GRACE_S = 120  # terminationGracePeriodSeconds of every Ray pod
DRAIN_DEADLINE_S = 100  # the deadline the preStop hook gives Ray, inside the grace period
CONFIG_PATH = "/etc/fleetplane/deploy.yaml"
DASHBOARD_PORT = 8265  # Ray's dashboard on the head: where KubeRay sends Serve's REST calls


def render(config: dict, name: str, image: str, workers: int, gb10_workers: int,
           gcs_ft: dict | None = None) -> list[dict]:
    """A ConfigMap with the deploy config, the RayCluster that runs it, a Service."""
    port = _port(config)
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
               "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
               "spec": _cluster_spec(name, image, port, workers, gb10_workers,
                                     gcs_ft=gcs_ft)}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-serve"},
               "spec": {"selector": _labels(name),
                        "ports": [{"name": "http", "port": port, "targetPort": port}]}}
    return [_config_map(name, _serving_config(config)), cluster, service]


def render_rayservice(config: dict, name: str, image: str, workers: int,
                      gb10_workers: int, gcs_ft: dict | None = None) -> list[dict]:
    """A KubeRay RayService: ``serveConfigV2`` holds the applications (KubeRay PUTs them
    to the head's dashboard, whose Serve API fleetplane answers); the ConfigMap holds the
    instance's own options, with which the head's fleetplane container starts, empty.
    KubeRay makes the Serve Service (``NAME-serve-svc``) from the pods whose listener
    answers ``/-/healthz``. Raises ``ValueError`` naming the fields KubeRay's dashboard
    would refuse (``ServeDeploySchema``): fleetplane's own fields need the RayCluster."""
    port = _port(config)
    serve_config = serve_config_v2(config)
    instance = {**_serving_config(config), "applications": []}
    service = {"apiVersion": "ray.io/v1", "kind": "RayService",
               "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
               "spec": {"serveConfigV2": yaml.safe_dump(serve_config, sort_keys=False),
                        "rayClusterConfig": _cluster_spec(name, image, port, workers,
                                                          gb10_workers, rayservice=True,
                                                          gcs_ft=gcs_ft)}}
    return [_config_map(name, instance), service]


def serve_config_v2(config: dict) -> dict:
    """The applications as a Serve config, checked with Serve's own schema (what Ray's
    dashboard checks a RayService's PUT with)."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    serve_config = {"applications": config.get("applications", [])}
    try:
        kept = ServeDeploySchema.model_validate(serve_config).model_dump(exclude_unset=True)
        fields = _dropped(serve_config, kept)  # Serve's schema ignores some unknown fields
    except ValidationError as e:
        fields = sorted({".".join(str(p) for p in err["loc"]) for err in e.errors()})
    if fields:
        raise ValueError(
            "--rayservice: KubeRay sends serveConfigV2 to Ray's dashboard, which keeps "
            "Serve's fields only; these are not Serve's: " + ", ".join(fields) +
            ". Render without --rayservice (a RayCluster running the whole config) to "
            "keep them")
    return serve_config


def _dropped(given: Any, kept: Any, path: str = "") -> list[str]:
    """The keys of ``given`` that Serve's schema left out of ``kept``, as dotted paths."""
    if isinstance(given, dict) and isinstance(kept, dict):
        return [p for k, v in given.items() for p in
                (_dropped(v, kept[k], f"{path}{k}.") if k in kept else [f"{path}{k}"])]
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [p for i, (g, k) in enumerate(zip(given, kept))
                for p in _dropped(g, k, f"{path}{i}.")]
    return []


def _port(config: dict) -> int:
    return int(config.get("http_options", {}).get("port", 8000))


def _config_map(name: str, config: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"},
            "data": {"deploy.yaml": yaml.safe_dump(config, sort_keys=False)}}


def gcs_fault_tolerance(redis_address: str, password_secret: str | None,
                        namespace: str) -> dict:
    """KubeRay's ``gcsFaultToleranceOptions``: the GCS keeps its tables in the Redis at
    ``redis_address``, under ``namespace``; the password, if any, from a Secret
    (``NAME/KEY``), never inline."""
    options: dict[str, Any] = {"redisAddress": redis_address,
                               "externalStorageNamespace": namespace}
    if password_secret:
        secret, _, key = password_secret.partition("/")
        if not secret or not key:
            raise ValueError(f"--redis-password-secret {password_secret!r}: expected "
                             "SECRET/KEY, the Kubernetes Secret and its key holding the "
                             "password")
        options["redisPassword"] = {"valueFrom": {"secretKeyRef": {"name": secret,
                                                                    "key": key}}}
    return options


def _cluster_spec(name: str, image: str, port: int, workers: int, gb10_workers: int,
                  rayservice: bool = False, gcs_ft: dict | None = None) -> dict:
    head = _pod(image, port, head=True, rayservice=rayservice)
    head["containers"].append(_driver(image))
    head["volumes"] = [{"name": "deploy-config", "configMap": {"name": f"{name}-config"}}]
    groups = [_group("cpu", workers, _pod(image, port, rayservice=rayservice), {})]
    if gb10_workers:
        groups.append(_group("gb10", gb10_workers,
                             _pod(image, port, gpus=1, rayservice=rayservice), {"GB10": 1}))
    return {"rayVersion": "2.60.0",
            **({"gcsFaultToleranceOptions": gcs_ft} if gcs_ft else {}),
            "headGroupSpec": {"rayStartParams": {"num-cpus": "0"},
                              "template": {"metadata": {"labels": _labels(name)},
                                           "spec": head}},
            "workerGroupSpecs": [{**g, "template": {"metadata": {"labels": _labels(name)},
                                                    "spec": g["template"]["spec"]}}
                                 for g in groups]}


def render_yaml(manifests: list[dict]) -> str:
    return yaml.safe_dump_all(manifests, sort_keys=False)


def _labels(name: str) -> dict:
    return {"app.kubernetes.io/name": name, "fleetplane.io/serves": "true"}


def _serving_config(config: dict) -> dict:
    """In a pod each node's listener binds every interface of its own pod."""
    http = {**config.get("http_options", {}), "host": "0.0.0.0"}
    return {**config, "http_options": http}


def _exec(*command: str) -> dict:
    return {"exec": {"command": list(command)}}


def _pod(image: str, port: int, head: bool = False, gpus: int = 0,
         rayservice: bool = False) -> dict:
    readiness = ["fleetplane", "probe", "readiness", "--port", str(port)]
    if head and rayservice:  # ready once fleetplane answers Serve's API (see cli_probe)
        readiness += ["--serve-api", f"http://127.0.0.1:{DASHBOARD_PORT}"]
    container: dict[str, Any] = {
        "name": "ray-head" if head else "ray-worker", "image": image,
        # KubeRay's Serve Service targets the port named "serve"
        "ports": [{"name": "serve" if rayservice else "http", "containerPort": port}],
        "livenessProbe": {**_exec("fleetplane", "probe", "liveness"), "initialDelaySeconds": 30,
                          "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 120},
        "readinessProbe": {**_exec(*readiness, *(["--head"] if head else [])),
                           "initialDelaySeconds": 10, "periodSeconds": 5, "timeoutSeconds": 3,
                           "failureThreshold": 1 if not head else 10},
        "lifecycle": {"preStop": _exec(
            "/bin/sh", "-c",
            "ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --reason-message "
            f"'pod deletion' --deadline-remaining-seconds {DRAIN_DEADLINE_S} && "
            f"sleep {DRAIN_DEADLINE_S - 10}")},
        "resources": {"limits": {"cpu": "4", "memory": "16Gi",
                                 **({"nvidia.com/gpu": gpus} if gpus else {})},
                      "requests": {"cpu": "4", "memory": "16Gi"}},
    }
    if head:
        del container["lifecycle"]  # the head is not drained: the cluster ends with it
    return {"terminationGracePeriodSeconds": GRACE_S, "containers": [container]}


def _driver(image: str) -> dict:
    """The head pod's second container: ``fleetplane run`` against the local head."""
    return {"name": "fleetplane", "image": image,
            "command": ["/bin/sh", "-c", "until ray status >/dev/null 2>&1; do sleep 2; done; "
                        f"exec fleetplane run {CONFIG_PATH} --address 127.0.0.1:6379"],
            "env": [{"name": "RAY_AUTH_MODE", "value": "token"}],
            "volumeMounts": [{"name": "deploy-config", "mountPath": "/etc/fleetplane"}]}


def _group(name: str, replicas: int, pod: dict, resources: dict) -> dict:
    params: dict[str, str] = {}
    if resources:
        # KubeRay takes rayStartParams as strings; resources as Ray's JSON, single-quoted
        params["resources"] = f"'{json.dumps(resources)}'"
    return {"groupName": name, "replicas": replicas, "minReplicas": 0,
            "maxReplicas": max(replicas, 1) * 4, "rayStartParams": params,
            "template": {"spec": pod}}
