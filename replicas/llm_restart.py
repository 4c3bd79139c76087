"""Who may restart an LLM server, and on what evidence: one pure policy object.

Seed 001 lost a healthy server eight times in a day because four watchdogs could each
restart it, and one of them counted the 500s that a restart itself causes ("cannot schedule
new futures after shutdown") as evidence for the next restart. The rules kept here:

- one owner: the policy's ``decide`` is the only place a restart is asked for (in fleetplane
  the replica's ``check_health`` raises on it and the shard, the controller's owner of the
  replica, replaces it);
- the only evidence is a verdict of the metrics-based check, and only STUCK or DEAD count.
  Request errors are not an input at all, so the 5xx of a restart cannot feed the next one;
- once a restart is issued, every verdict is ignored: what a server says while it
  restarts is not evidence. The restart replaces the replica, and the new process is
  judged by a fresh policy of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from replicas.llm_verdict import RESTART_VERDICTS, Verdict


class Decision(str, Enum):
    KEEP = "keep"          # healthy, or not shown stuck: leave the server alone
    RESTART = "restart"    # shown stuck or dead: restart it (once)
    WAITING = "waiting"    # a restart was issued; ignore evidence until the new process is up


@dataclass(frozen=True)
class RestartPolicy:
    restart_issued_at_s: float | None = None  # set from RESTART until the new process is up
    restarts: int = 0                         # restarts issued over the policy's life
    reason: str = ""                          # why the last restart was issued

    @property
    def restarting(self) -> bool:
        return self.restart_issued_at_s is not None

    def decide(self, verdict: Verdict | None, now: float,
               reason: str = "") -> tuple["RestartPolicy", Decision]:
        """Fold one verdict in (``None``: the check has no verdict yet)."""
        if self.restarting:
            return self, Decision.WAITING
        if verdict not in RESTART_VERDICTS:
            return self, Decision.KEEP
        why = f"{verdict.value}: {reason}" if reason else verdict.value
        return replace(self, restart_issued_at_s=now, restarts=self.restarts + 1,
                       reason=why), Decision.RESTART
