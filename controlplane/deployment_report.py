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
        "replicas": _replicas(d, now),
    }


_EXPLAINED_STARTS = 20  # starting replicas whose phase one status call asks Ray for


def _replicas(d: DeploymentState, now: float) -> list[dict]:
    records = sorted(d.replicas.records(),
                     key=lambda r: (r.rank is None, r.rank, r.replica_id))
    explained, rows = 0, []
    for r in records:
        row = _replica(d, r, now)
        if r.state == ReplicaState.STARTING and not r.message:
            phase = d.ops.start_phase(r.replica_id) if explained < _EXPLAINED_STARTS else ""
            explained += 1
            row["message"] = (f"{phase or 'starting'} for {now - r.started_at:.0f}s "
                              f"(gives up after {d.settings.replica_start_timeout_s:g}s and "
                              f"retries)")
        rows.append(row)
    return rows


def _replica(d: DeploymentState, r: ReplicaRecord, now: float) -> dict:
    healthy = r.state in SERVING_STATES and d.health.failures(r.replica_id) == 0
    return {"replica_id": r.replica_id, "state": r.state.value, "rank": r.rank,
            "healthy": healthy, "node_id": r.node_id, "actor_name": r.actor_name,
            "version": r.version, "message": r.message,
            **({"model_ids": list(ids)} if (ids := d.model_ids(r.replica_id)) else {})}
