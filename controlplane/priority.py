"""Control-plane processes at the raylet's CPU priority, not at a replica's.

Ray starts every worker process at its ``worker_niceness`` (15 by default): the replicas,
and also the actors of this control plane. The Linux scheduler weighs a nice-15 thread at
36 against 1,024 for nice 0, so on a node where anything at the default niceness is busy
(a sidecar, a data loader, a user process) the control plane gets almost no CPU. Measured
(``release_tests.health_push``, 16,384 replicas, batched, two nice-0 CPU-bound processes
on this 2-core machine): the shard got 0.07 cores, took in reports 100+ s after they were
sent, and 56% of freshness deadlines were missed.

``take_control_priority(role)`` moves every thread of this process to
``CONTROL_NICENESS`` (0, the raylet's and the GCS's) when the process may (root,
``CAP_SYS_NICE``, or a high enough ``RLIMIT_NICE``); when it may not, it logs once what
it runs at and how to allow it. Replicas keep Ray's niceness: under contention, the
processes that keep them healthy and route to them are served first, as the raylet is.

A Ray this process starts itself (``fleetplane run``'s embedded one) where it may not
(a laptop user, say): ``embedded_worker_niceness`` starts Ray's workers at niceness 0
(``RAY_worker_niceness``), replicas included, instead of six control processes each
logging that warning at nice 15; a value the user set is kept.

Linux: niceness is per thread, and Ray's threads (gRPC, the core worker's I/O) exist
before an actor's ``__init__`` runs, so each thread in ``/proc/self/task`` is moved;
threads started later inherit it. Elsewhere the process's own niceness is set.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Callable, MutableMapping

logger = logging.getLogger(__name__)

CONTROL_NICENESS = 0
WORKER_NICENESS_ENV = "RAY_worker_niceness"  # Ray's worker_niceness, read by the raylet
_TASKS = "/proc/self/task"
_STATUS = "/proc/self/status"
_CAP_SYS_NICE = 23  # its bit in CapEff
FIX = ("give the container CAP_SYS_NICE (Kubernetes: securityContext.capabilities.add: "
       "[SYS_NICE]), or start Ray with RAY_worker_niceness=0")


def _threads() -> list[int]:
    """This process's thread ids (Linux), or [0]: "this process" elsewhere."""
    try:
        return [int(tid) for tid in os.listdir(_TASKS)]
    except OSError:
        return [0]


def take_control_priority(role: str, *, threads: Callable[[], list[int]] = _threads,
                          getpriority: Callable[[int, int], int] = os.getpriority,
                          setpriority: Callable[[int, int, int], None] = os.setpriority
                          ) -> int:
    """Run this process's threads at ``CONTROL_NICENESS``; return the niceness it runs at.
    Never raises: a process that may not is left as it is, with one warning."""
    try:
        current = getpriority(os.PRIO_PROCESS, 0)
    except OSError:
        return CONTROL_NICENESS  # no priorities here (not a Unix): nothing to fix
    if current <= CONTROL_NICENESS:
        return current
    try:
        for tid in threads():
            try:
                setpriority(os.PRIO_PROCESS, tid, CONTROL_NICENESS)
            except ProcessLookupError:
                continue  # the thread ended meanwhile
    except OSError as e:
        logger.warning("%s runs at niceness %d (Ray's worker niceness), as the replicas "
                       "do: on a busy node they and other processes can starve it (%s). "
                       "To let it run at niceness %d: %s.", role, current,
                       e.strerror or e, CONTROL_NICENESS, FIX)
        return current
    logger.info("%s: niceness %d -> %d (the raylet's), above the replicas' %d",
                role, current, CONTROL_NICENESS, current)
    return CONTROL_NICENESS


def may_take_control_priority(euid: Callable[[], int] = os.geteuid,
                              nice_limit: Callable[[], int] | None = None,
                              status: Callable[[], str] | None = None) -> bool:
    """Whether a process of this user may move to ``CONTROL_NICENESS``: root, a
    ``RLIMIT_NICE`` that reaches it (the limit is 20 - niceness), or ``CAP_SYS_NICE``."""
    if euid() == 0:
        return True
    limit = (nice_limit or _nice_limit)()
    if limit == resource.RLIM_INFINITY or limit >= 20 - CONTROL_NICENESS:
        return True
    for line in (status or _status)().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    return False


def embedded_worker_niceness(environ: MutableMapping[str, str],
                             may: Callable[[], bool] = may_take_control_priority
                             ) -> str | None:
    """Before this process starts its own Ray: where its control processes could not
    leave Ray's worker niceness, have Ray start every worker at ``CONTROL_NICENESS``
    (``environ[WORKER_NICENESS_ENV]``) and return the line that says so; None when they
    can, or when the user chose a niceness."""
    if WORKER_NICENESS_ENV in environ or may():
        return None
    environ[WORKER_NICENESS_ENV] = str(CONTROL_NICENESS)
    return (f"CPU priority: this user may not raise the control plane's (root or "
            f"CAP_SYS_NICE may), so Ray's workers start at niceness {CONTROL_NICENESS}, "
            f"replicas included ({WORKER_NICENESS_ENV}={CONTROL_NICENESS}; set it to choose)")


def _nice_limit() -> int:
    try:
        return resource.getrlimit(resource.RLIMIT_NICE)[0]
    except (AttributeError, ValueError, OSError):  # not Linux
        return 0


def _status() -> str:
    try:
        with open(_STATUS) as f:
            return f.read()
    except OSError:
        return ""
