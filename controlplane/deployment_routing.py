"""What routers learn of one deployment: its serving replicas (with the multiplexed models
each holds) and its limits, published only when they changed.

Owned by ``DeploymentState``; the shard publishes ``update(...)`` each tick, which costs
O(1) unless the serving set, limits or a replica's models changed (then O(replicas), once).
"""

from __future__ import annotations

from controlplane.replica_set import ReplicaSet
from controlplane.specs import DeploymentSpec
from controlplane.wire import ReplicaInfo, RoutingUpdate


class DeploymentRouting:
    def __init__(self) -> None:
        self._key: tuple | None = None
        self._model_ids: dict[str, tuple[str, ...]] = {}  # multiplexed models, by replica
        self._models_version = 0

    def model_ids(self, replica_id: str) -> tuple[str, ...]:
        """The multiplexed models a replica reported holding (status shows them)."""
        return self._model_ids.get(replica_id, ())

    def record_model_ids(self, replicas: ReplicaSet, replica_id: str,
                         ids: tuple[str, ...]) -> None:
        """A replica's multiplexed models changed (a load or an eviction, rare): routers
        learn at the next tick."""
        if replica_id in replicas and self._model_ids.get(replica_id, ()) != ids:
            self._model_ids[replica_id] = tuple(ids)
            self._models_version += 1

    def update(self, spec: DeploymentSpec, replicas: ReplicaSet) -> RoutingUpdate | None:
        """What routers need, if it changed since the last call; else None, in O(1)
        (keyed on the serving set's fingerprint, so starts and stops in flight cost
        nothing here; limits on the spec)."""
        key = (replicas.serving_fingerprint, spec.max_ongoing_requests, spec.max_queued_requests,
               tuple(sorted(spec.backpressure_config.items())), self._models_version)
        if key == self._key:
            return None
        self._key = key
        serving = [replicas.get(i) for i in sorted(replicas.running_ids())]
        if self._model_ids:  # forget replicas that left
            self._model_ids = {i: m for i, m in self._model_ids.items() if i in replicas}
        backpressure = spec.backpressure_config
        return RoutingUpdate(
            replicas=tuple(ReplicaInfo(r.replica_id, r.actor_name, r.node_id, r.http_address,
                                       self._model_ids.get(r.replica_id, ()))
                           for r in serving),
            max_ongoing_requests=spec.max_ongoing_requests,
            max_queued_requests=spec.max_queued_requests,
            status_code=int(backpressure.get("status_code", 503)),
            retry_after_s=backpressure.get("retry_after_s"),
            retry_after_policy=backpressure.get("retry_after_policy") or "static")
