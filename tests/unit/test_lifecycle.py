"""The replica lifecycle table: every legal move, every illegal one, and the error type."""

from __future__ import annotations

import itertools
import pickle

import pytest

from controlplane.deployment.lifecycle import (
    ACTIVE_STATES,
    SERVING_STATES,
    TRANSITIONS,
    IllegalTransition,
    ReplicaEvent,
    ReplicaState,
    is_terminal,
    next_state,
)

S = ReplicaState
E = ReplicaEvent

# Written out independently of the module so a changed table entry fails here.
LEGAL = {
    (S.STARTING, E.STARTED): S.RUNNING,
    (S.STARTING, E.START_FAILED): S.FAILED,
    (S.STARTING, E.STOP): S.STOPPING,
    (S.STARTING, E.DIED): S.FAILED,
    (S.STARTING, E.UNHEALTHY): S.FAILED,
    (S.RUNNING, E.RECONFIGURE): S.UPDATING,
    (S.RUNNING, E.STOP): S.STOPPING,
    (S.RUNNING, E.UNHEALTHY): S.STOPPING,
    (S.RUNNING, E.DIED): S.STOPPED,
    (S.UPDATING, E.RECONFIGURED): S.RUNNING,
    (S.UPDATING, E.RECONFIGURE_FAILED): S.RUNNING,
    (S.UPDATING, E.STOP): S.STOPPING,
    (S.UPDATING, E.UNHEALTHY): S.STOPPING,
    (S.UPDATING, E.DIED): S.STOPPED,
    (S.STOPPING, E.STOPPED): S.STOPPED,
    (S.STOPPING, E.DIED): S.STOPPED,
    (S.STOPPING, E.STOP): S.STOPPING,
}
ILLEGAL = [pair for pair in itertools.product(S, E) if pair not in LEGAL]


@pytest.mark.parametrize(("state", "event"), list(LEGAL))
def test_legal_transition(state, event):
    assert next_state(state, event) is LEGAL[(state, event)]


def test_table_has_exactly_the_legal_pairs():
    assert dict(TRANSITIONS) == LEGAL


def raised(state: ReplicaState, event: ReplicaEvent) -> IllegalTransition:
    with pytest.raises(IllegalTransition) as info:
        next_state(state, event)
    return info.value


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_illegal_transition_raises(state, event):
    err = raised(state, event)
    assert (err.machine, err.state, err.event) == ("replica", state, event)


def test_terminal_states_accept_no_event():
    for state, event in itertools.product([S.FAILED, S.STOPPED], E):
        with pytest.raises(IllegalTransition):
            next_state(state, event)


def test_illegal_transition_message():
    assert str(raised(S.STOPPED, E.STARTED)) == "illegal replica transition: STOPPED on STARTED"


def test_illegal_transition_pickles():
    err = raised(S.RUNNING, E.STARTED)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is IllegalTransition
    assert (back.state, back.event) == (S.RUNNING, E.STARTED)
    assert str(back) == str(err)


def test_table_cannot_be_mutated():
    with pytest.raises(TypeError):
        TRANSITIONS[(S.FAILED, E.STOP)] = S.STOPPING  # type: ignore[index]


def test_terminal_and_state_groups():
    assert {s for s in S if is_terminal(s)} == {S.FAILED, S.STOPPED}
    assert ACTIVE_STATES == {S.STARTING, S.RUNNING, S.UPDATING}
    assert SERVING_STATES == {S.RUNNING, S.UPDATING}
