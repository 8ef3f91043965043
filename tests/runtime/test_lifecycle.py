from __future__ import annotations

import pytest

from agentenv.runtime.lifecycle import (
    PUBLIC_STATE,
    TRANSITIONS,
    Event,
    State,
    TransitionError,
    next_state,
)


def test_happy_path() -> None:
    state = next_state(State.CREATING, Event.BOOTED)
    assert state is State.RUNNING
    assert next_state(state, Event.KILL) is State.KILLING


def test_refused_transition_names_state_and_event() -> None:
    with pytest.raises(TransitionError, match="cannot pause a sandbox that is paused"):
        next_state(State.PAUSED, Event.PAUSE)


def test_every_state_is_reachable_and_public() -> None:
    reached = {State.CREATING} | set(TRANSITIONS.values())
    assert reached == set(State)
    assert set(PUBLIC_STATE) == set(State)
