"""A deployment's status entry (``fleetplane status --json``), read from its state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.lifecycle import SERVING_STATES, ReplicaState
from controlplane.reconcile import deployment_status
from controlplane.replica_set import ReplicaRecord

if TYPE_CHECKING:
    from controlplane.deployment_state import DeploymentState


def deployment_report(d: DeploymentState, now: float) -> dict:
    failed = d.backoff.deploy_failed or bool(d.config.failed or d.rollout.failed)
    status = deployment_status(d.snapshot(now), failed, d.health.unhealthy)
    message = d.rollout.failed or d.config.failed or (
        d.backoff.last_error if status in ("DEPLOY_FAILED", "UPDATING") else "")
    if d.adopting:
        status, message = "UPDATING", "re-adopting the running replicas (shard restarted)"
    stall = d.health.guard.statistics()
    return {
        "status": status,
        "message": message,
        "target_replicas": d.target_replicas,
        "version": d.spec.code_version,
        "serving_version": d.rollout.serving.code_version,  # differs after a rollback
        "autoscaling": d.autoscaled,
        "push_health": {"tracked": d.health.registry.tracked, "stall_state": stall.state.value,
                        "stall_held": stall.held},
        "replicas": [_replica(d, r, now) for r in sorted(
            d.replicas.records(), key=lambda r: (r.rank is None, r.rank, r.replica_id))],
    }


def _replica(d: DeploymentState, r: ReplicaRecord, now: float) -> dict:
    healthy = r.state in SERVING_STATES and d.health.failures(r.replica_id) == 0
    message = r.message
    if r.state == ReplicaState.STARTING and not message:
        message = (f"starting for {now - r.started_at:.0f}s (placement, constructor, first "
                   f"health check; gives up after {d.settings.replica_start_timeout_s:g}s "
                   f"and retries)")
    return {"replica_id": r.replica_id, "state": r.state.value, "rank": r.rank,
            "healthy": healthy, "node_id": r.node_id, "actor_name": r.actor_name,
            "version": r.version, "message": message}
