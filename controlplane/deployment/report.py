"""A deployment's status entry (``fleetplane status --json``), read from its state.

Two shapes: the summary (``deployment_summary``) and the full entry, which is the summary
plus one row per replica (``deployment_report``).

Invariant: the summary never walks the replicas. Its counts come from the counters the
shell keeps (``ReplicaSet`` buckets and version counts, the config-version ``CountedMap``,
``DeploymentState.failing``) and its status word from ``status_from_counts``, the O(1)
twin of the snapshot-based ``deployment_status`` the full entry uses (they agree: tested).
The one exception is bounded by what is in flight, not by the fleet: while some replica
runs other code or config than the target (a rollout), the replicas not RUNNING are
looked at to tell how many RUNNING ones are off target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.deployment.lifecycle import ACTIVE_STATES, SERVING_STATES, ReplicaState
from controlplane.deployment.reconcile import StatusCounts, deployment_status, status_from_counts
from controlplane.deployment.replica_set import ReplicaRecord

if TYPE_CHECKING:
    from controlplane.deployment.state import DeploymentState

_NOT_RUNNING = tuple(s for s in ReplicaState if s is not ReplicaState.RUNNING)


def deployment_report(d: DeploymentState, now: float) -> dict:
    """The full entry: the summary's fields and every replica's row (O(replicas))."""
    status = deployment_status(d.snapshot(now), _deploy_failed(d), d.health.unhealthy)
    return {**_entry(d, status), "replicas": _replicas(d, now)}


def deployment_summary(d: DeploymentState, now: float) -> dict:
    """The entry without replica rows, in O(1) in steady state."""
    return _entry(d, status_from_counts(status_counts(d), _deploy_failed(d), d.health.unhealthy))


def status_counts(d: DeploymentState) -> StatusCounts:
    """``StatusCounts`` from the shell's counters (see the module's invariant)."""
    replicas, configs = d.replicas, d.config_versions
    version, config = d.rollout.serving.code_version, d.config.serving[1]
    n = len(replicas)
    off_version = n - replicas.count_version(version)
    # a replica without a config entry reads as "" (as the snapshot does)
    off_config = n - configs.count(config) - (n - len(configs) if config == "" else 0)
    if off_version or off_config:  # subtract the off-target replicas that are not RUNNING
        for replica_id in replicas.ids_in(*_NOT_RUNNING):
            off_version -= replicas.get(replica_id).version != version
            off_config -= configs.get(replica_id, "") != config
    return StatusCounts(d.target_replicas, replicas.count(*ACTIVE_STATES),
                        replicas.count(ReplicaState.RUNNING), off_version, off_config,
                        d.deleting)


def _deploy_failed(d: DeploymentState) -> bool:
    return d.backoff.deploy_failed or bool(d.config.failed or d.rollout.failed)


def _entry(d: DeploymentState, status: str) -> dict:
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
        "replica_counts": {s.value: d.replicas.count(s) for s in ReplicaState
                           if s in ACTIVE_STATES or s is ReplicaState.STOPPING},
        # serving (RUNNING, UPDATING) and passing their health checks
        "healthy_replicas": d.replicas.count(*SERVING_STATES) - len(d.failing),
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
