"""What user code may ask about the replica it runs in (like serve.get_replica_context())."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReplicaContext:
    app_name: str
    deployment: str
    replica_id: str
    rank: int | None
    world_size: int = 1


_current: ReplicaContext | None = None


def get_replica_context() -> ReplicaContext:
    if _current is None:
        raise RuntimeError("get_replica_context() works only inside a fleetplane replica")
    return _current


def set_replica_context(context: ReplicaContext) -> None:
    global _current
    _current = context

