"""The verdict of the LLM health check: one transition table over reads of ``/metrics``.

Owns the decision, never the I/O. The shell (``llm_health.py``) reads ``/metrics``, calls
``judge_read``, and does what the returned ``Action`` says: report, read again after one
interval, or (only when the server holds no request at all) send a tiny answer and call
``judge_answer``. Seed 001's rule: a health check must not use what it protects, so a test
request is asked for only when running and waiting are both 0, or when the server publishes
no metrics at all; a server is called stuck only when requests were present and no engine
step happened across two consecutive intervals. One more case, the seed's: a restart between
two reads is followed by asking for an answer instead of comparing counters; with requests
already in the new process, only while a slot is free (fewer running than the engine's
``max_num_seqs``, none waiting), so the answer never waits for a slot or takes a busy one.

Invariants:
- progress is compared only between two reads of the same process (``same_process_as``);
  a restart between reads resets the baseline and is reported as ``restarted``;
- an interval counts against the server only when requests were present at both of its
  ends; a burst that just arrived is a new baseline, not a stall.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from replicas.llm_metrics import MetricsSnapshot


class Verdict(str, Enum):
    IDLE = "idle"              # nothing running or waiting; a tiny answer came back
    BUSY = "busy"              # requests present and engine steps advancing
    STUCK = "stuck"            # requests present, no engine step for two intervals
    DEAD = "dead"              # neither /metrics nor /v1/models answers
    NO_METRICS = "no-metrics"  # no usable /metrics: judged by /v1/models and a tiny answer


RESTART_VERDICTS = frozenset({Verdict.STUCK, Verdict.DEAD})  # the only grounds to restart


class Phase(str, Enum):
    UNKNOWN = "unknown"        # nothing to compare with: first read, new burst, or a restart
    IDLE = "idle"              # last read held no request and the tiny answer came back
    BUSY = "busy"              # requests present at both reads and steps advanced
    STALLING = "stalling"      # one strike: one interval without a step, or one failed idle answer
    STUCK = "stuck"            # two strikes in a row: shown stuck
    DEAD = "dead"              # nothing answers
    NO_METRICS = "no-metrics"  # judged without metrics


class Event(str, Enum):
    ARRIVED = "arrived"              # requests present, nothing comparable before
    PROGRESS = "progress"            # requests present at both reads, steps advanced
    NO_PROGRESS = "no-progress"      # requests present at both reads, no step (a strike)
    ANSWERED = "answered"            # idle and the tiny answer came back
    NO_ANSWER = "no-answer"          # idle and the tiny answer failed (a strike)
    BLIND_ANSWERED = "blind-answered"  # no metrics; /v1/models and the tiny answer came back
    BLIND_NO_ANSWER = "blind-no-answer"  # no metrics; /v1/models answered, the tiny answer did not
    SILENT = "silent"                # no metrics and no /v1/models
    RESTART_ANSWERED = "restart-answered"  # restarted, requests present, a free slot answered


_STRIKES = (Event.NO_PROGRESS, Event.NO_ANSWER)
_AFTER = {Event.ARRIVED: Phase.UNKNOWN, Event.PROGRESS: Phase.BUSY, Event.ANSWERED: Phase.IDLE,
          Event.BLIND_ANSWERED: Phase.NO_METRICS, Event.BLIND_NO_ANSWER: Phase.NO_METRICS,
          Event.SILENT: Phase.DEAD, Event.RESTART_ANSWERED: Phase.BUSY}


def _build_table() -> dict[tuple[Phase, Event], Phase]:
    """Every (phase, event) pair: a strike after a strike is STUCK, a first strike STALLING;
    every other event leads to the same phase whatever came before."""
    table = {}
    for phase in Phase:
        for event in Event:
            if event in _STRIKES:
                struck = phase in (Phase.STALLING, Phase.STUCK)
                table[phase, event] = Phase.STUCK if struck else Phase.STALLING
            else:
                table[phase, event] = _AFTER[event]
    return table


TRANSITIONS: dict[tuple[Phase, Event], Phase] = _build_table()

# Phases that end a check with a verdict; UNKNOWN and STALLING need another read.
_REPORTED = {Phase.IDLE: Verdict.IDLE, Phase.BUSY: Verdict.BUSY, Phase.STUCK: Verdict.STUCK,
             Phase.DEAD: Verdict.DEAD, Phase.NO_METRICS: Verdict.NO_METRICS}


class Action(str, Enum):
    REPORT = "report"          # the judgement carries a verdict
    READ_AGAIN = "read-again"  # wait one interval, read /metrics again
    ANSWER = "answer"          # idle: send the tiny completion, then judge_answer
    # restarted between reads with requests present and a slot free: the same completion
    ANSWER_RESTARTED = "answer-restarted"
    BLIND = "blind"            # no metrics: GET /v1/models, then the tiny completion


class Answer(str, Enum):
    OK = "ok"                  # the tiny completion came back (2xx)
    FAILED = "failed"          # it failed or timed out
    NO_MODELS = "no-models"    # /v1/models did not answer (BLIND only; no completion sent)


@dataclass(frozen=True)
class CheckState:
    phase: Phase = Phase.UNKNOWN
    last: MetricsSnapshot | None = None  # baseline: the previous read (same process)
    restarted: bool = False              # the latest read came from a new process


@dataclass(frozen=True)
class Judgement:
    state: CheckState
    action: Action
    verdict: Verdict | None = None   # set when action is REPORT
    healthy: bool | None = None      # set when action is REPORT
    reason: str = ""


def _report(state: CheckState, reason: str, healthy: bool = True) -> Judgement:
    verdict = _REPORTED.get(state.phase)
    if verdict is None:
        return Judgement(state, Action.READ_AGAIN, reason=reason)
    if verdict in RESTART_VERDICTS:
        healthy = False
    return Judgement(state, Action.REPORT, verdict, healthy, reason)


def _apply(state: CheckState, event: Event, **changes) -> CheckState:
    return replace(state, phase=TRANSITIONS[state.phase, event], **changes)


def judge_read(state: CheckState, read: MetricsSnapshot | None, why_none: str = "",
               slots: int | None = None) -> Judgement:
    """Judge one read of /metrics (``None``: no usable metrics, for the reason ``why_none``).
    ``slots``: the engine's ``max_num_seqs`` where known (a restarted engine that holds
    requests is asked for an answer only while one of them is free)."""
    if read is None:
        return Judgement(replace(state, last=None, restarted=False), Action.BLIND,
                         reason=why_none or "no usable /metrics")
    restarted = state.last is not None and not read.same_process_as(state.last)
    before = None if restarted else state.last
    if not read.requests_present:
        return Judgement(replace(state, last=read, restarted=restarted), Action.ANSWER,
                         reason="no request running or waiting")
    if restarted and _slot_free(read, slots):
        return Judgement(replace(state, phase=Phase.UNKNOWN, last=read, restarted=True),
                         Action.ANSWER_RESTARTED,
                         reason=f"restarted between reads; a slot is free ({read.running:g} "
                                f"of {slots} running, none waiting)")
    if before is None or not before.requests_present:
        why = "requests present; nothing to compare with yet"
        if restarted:
            why = (f"restarted between reads; no free slot to ask in ({read.running:g} "
                   f"running, {read.waiting:g} waiting, slots {slots or 'unknown'})")
        return _report(_apply(state, Event.ARRIVED, last=read, restarted=restarted), why)
    if read.steps > before.steps:
        return _report(_apply(state, Event.PROGRESS, last=read, restarted=False),
                       f"{read.steps - before.steps:g} engine steps since the last read")
    next_state = _apply(state, Event.NO_PROGRESS, last=read, restarted=False)
    held = f"{read.running:g} running, {read.waiting:g} waiting"
    if next_state.phase is Phase.STUCK:
        return _report(next_state, f"no engine step across two consecutive intervals ({held})")
    return _report(next_state, f"no engine step in {read.at_s - before.at_s:.1f}s ({held}); "
                   "one more such interval is stuck")


def _slot_free(read: MetricsSnapshot, slots: int | None) -> bool:
    return slots is not None and read.waiting == 0 and read.running < slots


def judge_answer(state: CheckState, asked: Action, answer: Answer, detail: str = "") -> Judgement:
    """Judge the outcome of the tiny answer that ``asked`` (ANSWER, ANSWER_RESTARTED or
    BLIND) called for."""
    if asked is Action.ANSWER_RESTARTED:
        if answer is Answer.OK:
            return _report(_apply(state, Event.RESTART_ANSWERED),
                           "restarted between reads; the tiny answer came back in a free slot")
        return _report(_apply(state, Event.NO_ANSWER),
                       f"restarted between reads and the tiny answer failed: {detail}")
    if asked is Action.ANSWER:
        event = Event.ANSWERED if answer is Answer.OK else Event.NO_ANSWER
        why = "idle; the tiny answer came back" if answer is Answer.OK else (
            f"idle but the tiny answer failed: {detail}")
        return _report(_apply(state, event), why)
    if answer is Answer.NO_MODELS:
        return _report(_apply(state, Event.SILENT), f"nothing answers: {detail}")
    if answer is Answer.OK:
        return _report(_apply(state, Event.BLIND_ANSWERED), "no metrics; /v1/models and the "
                       "tiny answer came back")
    return _report(_apply(state, Event.BLIND_NO_ANSWER),
                   f"no metrics; /v1/models answered but the tiny answer failed: {detail}",
                   healthy=False)
