"""What user code may ask about the replica it runs in (like serve.get_replica_context())."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)


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



# ---- a starting replica's word on its start ------------------------------------------------
_start_reporter: Callable[[str], None] | None = None


def report_start_progress(text: str) -> None:
    """Say what this replica's constructor is doing, for ``status`` to show while it starts
    ("loading the model", say). Cheap: one message to the shard per call, so call it when
    the phase changes, not in a loop. Outside a starting fleetplane replica it does nothing."""
    reporter = _start_reporter
    if reporter is not None:
        try:
            reporter(text)
        except Exception:  # a word on progress must never fail a start
            logger.debug("start progress not sent", exc_info=True)


def set_start_reporter(reporter: Callable[[str], None] | None) -> None:
    global _start_reporter
    _start_reporter = reporter
