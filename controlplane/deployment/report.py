"""A deployment's status entry (``fleetplane status --json``), built from what each of its
owners shows of itself.

Two shapes: the summary (``deployment_summary``) and the full entry, which is the summary
plus one row per replica (``deployment_report``).

Invariant: the summary never walks the replicas. Its counts come from the book's counters
(``ReplicaBook``: buckets, version and config counts), the health's view and the
rollout's verdict, and its status word from ``status_from_counts``, the O(1) twin of the
snapshot-based ``deployment_status`` the full entry uses (they agree: tested).
"""

from __future__ import annotations

from typing import Any, Protocol

from controlplane.deployment.lifecycle import ACTIVE_STATES, SERVING_STATES, ReplicaState
from controlplane.deployment.reconcile import (DeploymentSnapshot, StatusCounts,
                                               deployment_status, status_from_counts)
from controlplane.deployment.replica_book import ReplicaBook
from controlplane.deployment.replica_set import ReplicaRecord
from controlplane.deployment.rollout import Rollout
from controlplane.deployment.routing import DeploymentRouting
from controlplane.health.push_health import DeploymentHealth
from controlplane.specs import DeploymentSpec

_SHOWN_STATES = tuple(s for s in ReplicaState if s in ACTIVE_STATES or s is ReplicaState.STOPPING)
_EXPLAINED_STARTS = 20  # starting replicas whose phase one status call asks Ray for


class Reported(Protocol):
    """What a status entry reads of a deployment: its desired state and its owners."""

    spec: DeploymentSpec
    target_replicas: int
    deleting: bool
    adopting: bool
    book: ReplicaBook
    health: DeploymentHealth
    rollout: Rollout
    routing: DeploymentRouting
    ops: Any  # ReplicaOps: start_phase, start_progress, start_timeout_s
    autoscaler: Any  # Autoscaler: active

    def snapshot(self, now: float) -> DeploymentSnapshot: ...


def deployment_report(d: Reported, now: float) -> dict:
    """The full entry: the summary's fields and every replica's row (O(replicas))."""
    status = deployment_status(d.snapshot(now), d.rollout.deploy_failed, d.health.unhealthy)
    return {**_entry(d, status), "replicas": _replicas(d, now)}


def deployment_summary(d: Reported, now: float) -> dict:
    """The entry without replica rows, in O(1) in steady state."""
    return _entry(d, status_from_counts(status_counts(d), d.rollout.deploy_failed,
                                        d.health.unhealthy))


def status_counts(d: Reported) -> StatusCounts:
    replicas, rollout = d.book.replicas, d.rollout
    off_version, off_config = d.book.off_target(rollout.serving.code_version,
                                                rollout.serving_config[1])
    return StatusCounts(d.target_replicas, replicas.count(*ACTIVE_STATES),
                        replicas.count(ReplicaState.RUNNING), off_version, off_config,
                        d.deleting)


def _entry(d: Reported, status: str) -> dict:
    message = d.rollout.message(status)
    if d.adopting:
        status, message = "UPDATING", "re-adopting the running replicas (shard restarted)"
    health, replicas = d.health.view(), d.book.replicas
    return {
        "status": status,
        "message": message,
        "target_replicas": d.target_replicas,
        "version": d.spec.code_version,
        "serving_version": d.rollout.serving.code_version,  # differs after a rollback
        "autoscaling": d.autoscaler.active,
        # request_router_config's policy (routing/policies.py); p2c for a spec without
        "routing_policy": (getattr(d.spec, "request_router", None) or {}).get("name", "p2c"),
        "push_health": {"tracked": health.tracked, "stall_state": health.stall_state,
                        "stall_held": health.stall_held},
        "replica_counts": {s.value: replicas.count(s) for s in _SHOWN_STATES},
        # serving (RUNNING, UPDATING) and passing their health checks
        "healthy_replicas": replicas.count(*SERVING_STATES) - health.failing,
        **({"request_errors": errors} if (errors := d.routing.errors.view()) else {}),
    }


def _replicas(d: Reported, now: float) -> list[dict]:
    records = sorted(d.book.replicas.records(),
                     key=lambda r: (r.rank is None, r.rank, r.replica_id))
    explained, rows = 0, []
    for r in records:
        row = _replica(d, r)
        if r.state == ReplicaState.STARTING and not r.message:
            row["message"] = _starting(d, r, now, explained < _EXPLAINED_STARTS)
            explained += 1
        rows.append(row)
    return rows


def _starting(d: Reported, r: ReplicaRecord, now: float, ask_ray: bool) -> str:
    """What a starting replica is doing: its own word where it gave one (an LLM engine
    loading its weights), else Ray's actor state (``ask_ray``: one call), for how long."""
    deadline = f"gives up after {d.ops.start_timeout_s:g}s and retries"
    said = d.ops.start_progress(r.replica_id)
    if said is not None:
        text, since = said
        return (f"{text} for {now - since:.0f}s "
                f"(starting for {now - r.started_at:.0f}s; {deadline})")
    phase = d.ops.start_phase(r.replica_id) if ask_ray else ""
    return f"{phase or 'starting'} for {now - r.started_at:.0f}s ({deadline})"


def _replica(d: Reported, r: ReplicaRecord) -> dict:
    healthy = r.state in SERVING_STATES and d.health.failures(r.replica_id) == 0
    return {"replica_id": r.replica_id, "state": r.state.value, "rank": r.rank,
            "healthy": healthy, "node_id": r.node_id, "actor_name": r.actor_name,
            "version": r.version, "message": r.message,
            **({"model_ids": list(ids)} if (ids := d.routing.model_ids(r.replica_id)) else {})}
