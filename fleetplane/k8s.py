"""``fleetplane k8s render``: a KubeRay ``RayCluster`` (ray.io/v1) that runs a deploy config.

What it renders (one YAML stream): a ConfigMap holding the deploy config; the RayCluster
with a head group (Ray's head, plus a ``fleetplane`` container that runs the config
against it) and worker groups (CPU workers, and GB10 workers with ``resources: {"GB10":
1}`` and a GPU limit); a Service over every pod's HTTP port.

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


def render(config: dict, name: str, image: str, workers: int, gb10_workers: int) -> list[dict]:
    port = int(config.get("http_options", {}).get("port", 8000))
    head = _pod(image, port, head=True)
    head["containers"].append(_driver(image))
    head["volumes"] = [{"name": "deploy-config", "configMap": {"name": f"{name}-config"}}]
    groups = [_group("cpu", workers, _pod(image, port), {})]
    if gb10_workers:
        groups.append(_group("gb10", gb10_workers, _pod(image, port, gpus=1), {"GB10": 1}))
    cluster = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
        "spec": {"rayVersion": "2.60.0",
                 "headGroupSpec": {"rayStartParams": {"num-cpus": "0"},
                                   "template": {"metadata": {"labels": _labels(name)},
                                                "spec": head}},
                 "workerGroupSpecs": [{**g, "template": {"metadata": {"labels": _labels(name)},
                                                         "spec": g["template"]["spec"]}}
                                      for g in groups]},
    }
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-config"},
                  "data": {"deploy.yaml": yaml.safe_dump(_serving_config(config),
                                                         sort_keys=False)}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-serve"},
               "spec": {"selector": _labels(name),
                        "ports": [{"name": "http", "port": port, "targetPort": port}]}}
    return [config_map, cluster, service]


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


def _pod(image: str, port: int, head: bool = False, gpus: int = 0) -> dict:
    readiness = ["fleetplane", "probe", "readiness", "--port", str(port)]
    container: dict[str, Any] = {
        "name": "ray-head" if head else "ray-worker", "image": image,
        "ports": [{"name": "http", "containerPort": port}],
        "livenessProbe": {**_exec("fleetplane", "probe", "liveness"), "initialDelaySeconds": 30,
                          "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 120},
        "readinessProbe": {**_exec(*readiness, *(["--head"] if head else [])),
                           "initialDelaySeconds": 10, "periodSeconds": 5, "timeoutSeconds": 2,
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
