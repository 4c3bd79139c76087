"""The verdict table: every case of seed 001 over pure reads, no I/O, no clock."""

from __future__ import annotations

import pytest

from replicas.llm_metrics import MetricsSnapshot
from replicas.llm_verdict import (TRANSITIONS, Action, Answer, CheckState, Event, Phase, Verdict,
                                  judge_answer, judge_read)


def read(at: float, running: float = 0, waiting: float = 0, steps: float = 0,
         tokens: float = 0, start: float | None = 100.0) -> MetricsSnapshot:
    return MetricsSnapshot(at_s=at, running=running, waiting=waiting, steps=steps,
                           generation_tokens=tokens, start_time_s=start, model_name="m")


def feed(reads, answers=()):
    """Judge reads in order; ``answers`` are used, in order, whenever one is asked for."""
    state, out, answers = CheckState(), [], list(answers)
    for r in reads:
        j = judge_read(state, r)
        if j.action in (Action.ANSWER, Action.BLIND):
            j = judge_answer(j.state, j.action, answers.pop(0))
        state = j.state
        out.append(j)
    return out


def test_the_table_covers_every_phase_and_event():
    assert set(TRANSITIONS) == {(p, e) for p in Phase for e in Event}


def test_two_strikes_in_a_row_are_stuck_and_anything_else_clears_them():
    assert TRANSITIONS[Phase.BUSY, Event.NO_PROGRESS] is Phase.STALLING
    assert TRANSITIONS[Phase.STALLING, Event.NO_PROGRESS] is Phase.STUCK
    assert TRANSITIONS[Phase.STALLING, Event.NO_ANSWER] is Phase.STUCK
    assert TRANSITIONS[Phase.STALLING, Event.PROGRESS] is Phase.BUSY
    assert TRANSITIONS[Phase.STALLING, Event.ARRIVED] is Phase.UNKNOWN


def test_idle_asks_for_the_tiny_answer_and_only_then():
    j = judge_read(CheckState(), read(0))
    assert j.action is Action.ANSWER
    done = judge_answer(j.state, Action.ANSWER, Answer.OK)
    assert (done.action, done.verdict, done.healthy) == (Action.REPORT, Verdict.IDLE, True)


def test_busy_with_steps_advancing_is_healthy_without_a_test_request():
    out = feed([read(0, running=12, steps=100), read(40, running=12, waiting=3, steps=180)])
    assert [j.action for j in out] == [Action.READ_AGAIN, Action.REPORT]
    assert (out[-1].verdict, out[-1].healthy) == (Verdict.BUSY, True)


def test_long_prefill_moves_steps_not_tokens_and_is_busy():
    out = feed([read(0, running=2, steps=10, tokens=50), read(40, running=2, steps=90, tokens=50),
                read(80, running=2, steps=170, tokens=50)])
    assert [j.verdict for j in out] == [None, Verdict.BUSY, Verdict.BUSY]


def test_no_step_across_two_intervals_is_stuck_and_one_is_not_yet():
    out = feed([read(0, running=2, steps=10), read(40, running=2, steps=10),
                read(80, running=2, steps=10)])
    assert [j.action for j in out] == [Action.READ_AGAIN, Action.READ_AGAIN, Action.REPORT]
    assert out[1].state.phase is Phase.STALLING
    assert (out[2].verdict, out[2].healthy) == (Verdict.STUCK, False)


def test_a_pause_shorter_than_two_intervals_is_not_stuck():
    out = feed([read(0, running=2, steps=10), read(40, running=2, steps=10),
                read(80, running=2, steps=11)])
    assert out[-1].verdict is Verdict.BUSY


def test_a_wedged_queue_that_grows_while_nothing_runs_is_stuck():
    out = feed([read(0, waiting=1, steps=7), read(40, waiting=3, steps=7),
                read(80, waiting=6, steps=7)])
    assert out[-1].verdict is Verdict.STUCK


def test_a_burst_that_just_arrived_is_a_baseline_not_a_strike():
    out = feed([read(0), read(40, running=4, steps=0), read(80, running=4, steps=0)],
               answers=[Answer.OK])
    assert out[0].verdict is Verdict.IDLE
    assert out[1].state.phase is Phase.UNKNOWN and out[2].state.phase is Phase.STALLING


@pytest.mark.parametrize("new_start, counters_down", [(200.0, False), (None, True)])
def test_a_restart_between_reads_is_not_compared_and_an_idle_new_process_answers(
        new_start, counters_down):
    old_start = 100.0 if new_start else None
    before = read(0, running=2, steps=500, tokens=900, start=old_start)
    after = read(40, steps=3 if counters_down else 600, tokens=1, start=new_start)
    out = feed([before, after], answers=[Answer.OK])
    assert out[1].verdict is Verdict.IDLE and out[1].state.restarted


def test_a_restarted_process_that_is_already_busy_gets_no_test_request():
    out = feed([read(0, running=2, steps=500), read(40, running=2, steps=5, start=200.0),
                read(80, running=2, steps=90, start=200.0)])
    assert out[1].action is Action.READ_AGAIN and out[1].state.restarted
    assert out[2].verdict is Verdict.BUSY  # compared within the new process only


@pytest.mark.parametrize("answer, verdict, healthy", [
    (Answer.OK, Verdict.NO_METRICS, True),
    (Answer.FAILED, Verdict.NO_METRICS, False),
    (Answer.NO_MODELS, Verdict.DEAD, False),
])
def test_without_metrics_models_and_the_tiny_answer_decide(answer, verdict, healthy):
    j = judge_read(CheckState(), None, "/metrics: HTTP 404")
    assert j.action is Action.BLIND
    done = judge_answer(j.state, Action.BLIND, answer, "detail")
    assert (done.verdict, done.healthy) == (verdict, healthy)


def test_an_idle_server_that_fails_the_tiny_answer_twice_is_stuck():
    out = feed([read(0), read(40)], answers=[Answer.FAILED, Answer.FAILED])
    assert out[0].action is Action.READ_AGAIN and out[1].verdict is Verdict.STUCK
    out = feed([read(0), read(40)], answers=[Answer.FAILED, Answer.OK])
    assert out[1].verdict is Verdict.IDLE


def test_a_restarted_process_with_a_free_slot_is_asked_for_an_answer_in_it():
    """Seed 001: a restart between reads is followed by asking for an answer; with
    requests already in the new process, only while one of its slots is free."""
    before, after = read(0, running=2, steps=500), read(40, running=1, steps=5, start=200.0)
    j = judge_read(judge_read(CheckState(), before, slots=4).state, after, slots=4)
    assert j.action is Action.ANSWER_RESTARTED and j.state.restarted
    done = judge_answer(j.state, j.action, Answer.OK)
    assert (done.verdict, done.healthy, done.state.restarted) == (Verdict.BUSY, True, True)
    failed = judge_answer(j.state, j.action, Answer.FAILED, "timed out")
    assert failed.action is Action.READ_AGAIN and failed.state.phase is Phase.STALLING
    assert "restarted between reads and the tiny answer failed: timed out" in failed.reason


@pytest.mark.parametrize("running, waiting, slots", [(4, 0, 4), (3, 1, 4), (1, 0, None)])
def test_a_restarted_process_without_a_free_slot_is_read_again_not_asked(
        running, waiting, slots):
    before = read(0, running=2, steps=500)
    after = read(40, running=running, waiting=waiting, steps=5, start=200.0)
    j = judge_read(judge_read(CheckState(), before, slots=slots).state, after, slots=slots)
    assert j.action is Action.READ_AGAIN and j.state.restarted
    assert "no free slot to ask in" in j.reason
