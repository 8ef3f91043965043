from __future__ import annotations

import pytest

from agentenv.runtime.node.recovery import RULES
from agentenv.state.lifecycle import (
    PUBLIC_STATE,
    TRANSIENT,
    TRANSITIONS,
    Event,
    State,
    TransitionError,
    allows,
    next_state,
)


def test_happy_path() -> None:
    state = next_state(State.CREATING, Event.DONE)
    assert state is State.RUNNING
    assert next_state(state, Event.PAUSE) is State.PAUSING
    assert next_state(State.PAUSING, Event.DONE) is State.PAUSED
    assert next_state(State.PAUSED, Event.RESUME) is State.RESUMING
    assert next_state(State.RESUMING, Event.DONE) is State.RUNNING
    assert next_state(State.RUNNING, Event.KILL) is State.KILLING


def test_refused_transition_names_state_and_event() -> None:
    with pytest.raises(TransitionError, match="cannot pause a sandbox that is paused"):
        next_state(State.PAUSED, Event.PAUSE)
    assert not allows(State.RUNNING, Event.RESUME)


def test_every_state_is_reachable_and_public() -> None:
    reached = {State.CREATING} | set(TRANSITIONS.values())
    assert reached == set(State)
    assert set(PUBLIC_STATE) == set(State)


def test_every_transient_state_ends_and_fails() -> None:
    for state in TRANSIENT:
        assert allows(state, Event.DONE) and allows(state, Event.FAILED), state
        assert next_state(state, Event.DONE) not in TRANSIENT


def test_failed_operations_return_where_they_started() -> None:
    assert next_state(State.PAUSING, Event.FAILED) is State.RUNNING
    assert next_state(State.RESUMING, Event.FAILED) is State.PAUSED
    assert next_state(State.CHECKPOINTING, Event.FAILED) is State.RUNNING
    assert next_state(State.CREATING, Event.FAILED) is State.KILLING
    # A resumed guest that ran and then failed cannot go back to its saved state.
    assert next_state(State.RESUMING, Event.LOST) is State.KILLING


def test_kill_is_allowed_from_every_state() -> None:
    for state in State:
        assert next_state(state, Event.KILL) is State.KILLING


def test_recovery_has_a_rule_for_every_state() -> None:
    assert set(RULES) == set(State)


def test_the_table_answers_what_a_state_means() -> None:
    assert [s for s in State if s.runs] == [State.RUNNING]
    assert [s for s in State if not s.visible] == [State.KILLING]
    assert [s for s in State if s.going] == [State.KILLING]
    assert {s for s in State if not s.holds_memory} == {State.PAUSED, State.COPYING, State.KILLING}
    assert [s for s in State if s.at_rest] == [State.PAUSED]
    assert [s for s in State if s.expires] == [State.RUNNING]
    # What users are shown of a state that runs is "running".
    assert all(PUBLIC_STATE[s] == "running" for s in State if s.runs)
