"""Internal, validated description of one deployment: what the shards reconcile toward.

Built once at the edge (``usercode.build.build_application``) from the user's code and
deploy config; inside the control plane it is a frozen dataclass shipped between actors.
Invariants: ``code_version`` changes exactly when a running replica must be replaced
(code, import path, constructor args, actor options or runtime env changed); fields that
can change in place (num_replicas, user_config, limits, health timings) are not part of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from controlplane.config.options import HTTPOptions
from controlplane.wire import DirectIngressInit

# Built-in defaults, the same as Ray Serve 2.60's where Serve has the field.
DEPLOYMENT_DEFAULTS: Mapping[str, Any] = {
    "num_replicas": 1,
    "max_ongoing_requests": 5,
    "max_queued_requests": -1,
    "user_config": None,
    "autoscaling_config": None,
    "health_check_period_s": 10.0,
    "health_check_timeout_s": 30.0,
    "graceful_shutdown_timeout_s": 20.0,
    "replica_start_timeout_s": None,  # fleetplane's own: the shard's default (300 s)
    "backpressure_config": {"status_code": 503, "retry_after_s": None,
                            "retry_after_policy": "static"},
    "request_router_config": None,  # power of two choices
    "ray_actor_options": {"num_cpus": 1.0},
}


@dataclass(frozen=True, order=True)
class DeploymentId:
    app: str
    name: str

    def __str__(self) -> str:
        return f"{self.app}/{self.name}"


@dataclass(frozen=True)
class DeploymentSpec:
    id: DeploymentId
    ingress: bool
    code_version: str
    # cloudpickled (callable, init_args, init_kwargs); classes importable by the replica
    # travel by reference, so the replica imports the user's module itself.
    serialized_def: bytes
    num_replicas: int
    max_ongoing_requests: int
    max_queued_requests: int
    user_config: Any
    autoscaling_config: Mapping[str, Any] | None
    health_check_period_s: float
    health_check_timeout_s: float
    graceful_shutdown_timeout_s: float
    backpressure_config: Mapping[str, Any]
    ray_actor_options: Mapping[str, Any]
    route_prefix: str | None = None
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    # haproxy mode, ingress deployments: serve HTTP on the replica (set at commit)
    direct_ingress: DirectIngressInit | None = None
    # request_router_config as routers take it (routing.policies.RoutingPolicy's fields)
    request_router: Mapping[str, Any] = field(default_factory=dict)
    # a start's deadline (placement, constructor, first check); None: the shard's default
    replica_start_timeout_s: float | None = None

    @property
    def user_config_version(self) -> str:
        return stable_hash(self.user_config)


def stable_hash(value: Any, strict: bool = False) -> str:
    """A short digest of JSON-able data that is the same in every process. With
    strict=True, non-JSON values raise TypeError instead of hashing their repr."""
    text = json.dumps(value, sort_keys=True, default=None if strict else repr)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def shard_of(dep_id: DeploymentId, num_shards: int) -> int:
    """Stable owner shard of a deployment (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(str(dep_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def with_direct_ingress(specs: list[DeploymentSpec], http: HTTPOptions) -> list[DeploymentSpec]:
    """In haproxy mode, each application's ingress deployment serves HTTP on its replicas
    (``DirectIngressInit``), admitting and rejecting as its routers would; in proxy mode,
    none does. Idempotent."""
    haproxy = http.ingress == "haproxy"
    out = []
    for spec in specs:
        direct = None
        if haproxy and spec.ingress and spec.route_prefix is not None:
            bp = spec.backpressure_config
            direct = DirectIngressInit(
                host=http.host, route_prefix=spec.route_prefix,
                max_queued_requests=spec.max_queued_requests,
                status_code=int(bp.get("status_code", 503)),
                retry_after_s=bp.get("retry_after_s"),
                retry_after_policy=bp.get("retry_after_policy") or "static",
                deployment=str(spec.id),
                deregistration_window_s=http.deregistration_window_s, limits=http.limits(),
                show_error_messages=http.show_error_messages)
        out.append(dataclasses.replace(spec, direct_ingress=direct))
    return out
