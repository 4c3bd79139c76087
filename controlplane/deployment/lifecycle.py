"""The replica lifecycle, as one transition table.

Owns: the replica states, the events that move a replica between them, and the single
table that says which moves are legal.

Invariants:
- Every state change of a replica goes through ``next_state``; a (state, event) pair
  missing from ``TRANSITIONS`` is a bug in the caller and raises ``IllegalTransition``
  instead of being silently ignored (h11's rule for state machines).
- FAILED and STOPPED are terminal: nothing leaves them, and the replica's record is
  removed from its ``ReplicaSet`` as soon as it reaches one.
- STOP is idempotent while STOPPING, because a drain may be requested again (a second
  scale-down, a redeploy) while the first one is still running.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType

from controlplane.errors import IllegalTransition


class ReplicaState(str, Enum):
    STARTING = "STARTING"  # actor created, constructor / first health check running
    RUNNING = "RUNNING"  # serving
    UPDATING = "UPDATING"  # reconfigure(user_config) running in place
    STOPPING = "STOPPING"  # draining, then the actor is killed
    FAILED = "FAILED"  # start failed (terminal; record removed)
    STOPPED = "STOPPED"  # gone (terminal; record removed)


class ReplicaEvent(str, Enum):
    STARTED = "STARTED"  # constructor returned and the first health check passed
    START_FAILED = "START_FAILED"  # constructor raised or the first check failed
    RECONFIGURE = "RECONFIGURE"  # controller asked for reconfigure(user_config)
    RECONFIGURED = "RECONFIGURED"  # reconfigure returned
    RECONFIGURE_FAILED = "RECONFIGURE_FAILED"  # reconfigure raised or timed out
    STOP = "STOP"  # controller asked the replica to drain and stop
    UNHEALTHY = "UNHEALTHY"  # health verdict crossed the failure threshold
    DIED = "DIED"  # the actor is gone (GCS reported its death)
    STOPPED = "STOPPED"  # drain finished and the actor was killed


_S = ReplicaState
_E = ReplicaEvent

TRANSITIONS: Mapping[tuple[ReplicaState, ReplicaEvent], ReplicaState] = MappingProxyType(
    {
        # A replica that dies or turns unhealthy before it ever served is a failed
        # start, not a stop: the start path, not the drain path, owns its cleanup.
        (_S.STARTING, _E.STARTED): _S.RUNNING,
        (_S.STARTING, _E.START_FAILED): _S.FAILED,
        (_S.STARTING, _E.STOP): _S.STOPPING,
        (_S.STARTING, _E.DIED): _S.FAILED,
        (_S.STARTING, _E.UNHEALTHY): _S.FAILED,
        (_S.RUNNING, _E.RECONFIGURE): _S.UPDATING,
        (_S.RUNNING, _E.STOP): _S.STOPPING,
        (_S.RUNNING, _E.UNHEALTHY): _S.STOPPING,
        (_S.RUNNING, _E.DIED): _S.STOPPED,
        (_S.UPDATING, _E.RECONFIGURED): _S.RUNNING,
        # A failed reconfigure keeps the replica serving: the rollout stops and the
        # previous config is sent again (or the replica is then stopped).
        (_S.UPDATING, _E.RECONFIGURE_FAILED): _S.RUNNING,
        (_S.UPDATING, _E.STOP): _S.STOPPING,
        (_S.UPDATING, _E.UNHEALTHY): _S.STOPPING,
        (_S.UPDATING, _E.DIED): _S.STOPPED,
        (_S.STOPPING, _E.STOPPED): _S.STOPPED,
        (_S.STOPPING, _E.DIED): _S.STOPPED,
        (_S.STOPPING, _E.STOP): _S.STOPPING,
    }
)

TERMINAL_STATES = frozenset({ReplicaState.FAILED, ReplicaState.STOPPED})
# Counted toward the deployment's target number of replicas.
ACTIVE_STATES = frozenset({ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.UPDATING})
# Able to take requests (an UPDATING replica keeps serving while it reconfigures).
SERVING_STATES = frozenset({ReplicaState.RUNNING, ReplicaState.UPDATING})


def next_state(state: ReplicaState, event: ReplicaEvent) -> ReplicaState:
    """The state ``event`` moves a replica in ``state`` to; raises ``IllegalTransition``."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition("replica", state, event) from None


def is_terminal(state: ReplicaState) -> bool:
    """True for states nothing leaves; a replica set drops records that reach one."""
    return state in TERMINAL_STATES
