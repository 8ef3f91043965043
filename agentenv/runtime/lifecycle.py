"""Sandbox lifecycle: every state and every allowed transition, in one table."""

from __future__ import annotations

from enum import StrEnum

from ..errors import Conflict


class State(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    KILLING = "killing"


class Event(StrEnum):
    BOOTED = "booted"
    KILL = "kill"
    PAUSE = "pause"
    PAUSED = "paused"
    RESUME = "resume"
    RESUMED = "resumed"
    FAILED = "failed"


# (state, event) -> next state. Anything absent is refused with `TransitionError`.
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.CREATING, Event.BOOTED): State.RUNNING,
    (State.CREATING, Event.FAILED): State.KILLING,
    (State.RUNNING, Event.KILL): State.KILLING,
    (State.RUNNING, Event.PAUSE): State.PAUSING,
    (State.PAUSING, Event.PAUSED): State.PAUSED,
    (State.PAUSING, Event.FAILED): State.RUNNING,
    (State.PAUSED, Event.RESUME): State.RESUMING,
    (State.PAUSED, Event.KILL): State.KILLING,
    (State.RESUMING, Event.RESUMED): State.RUNNING,
    (State.RESUMING, Event.FAILED): State.PAUSED,
}

# States the E2B API shows; transient ones are reported as the state they come from.
PUBLIC_STATE: dict[State, str] = {
    State.CREATING: "running",
    State.RUNNING: "running",
    State.PAUSING: "running",
    State.PAUSED: "paused",
    State.RESUMING: "paused",
    State.KILLING: "running",
}


class TransitionError(Conflict):
    """An event that the sandbox's current state does not allow (HTTP 409)."""

    def __init__(self, state: State, event: Event) -> None:
        super().__init__(f"cannot {event.value} a sandbox that is {state.value}")
        self.state = state
        self.event = event


def next_state(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise TransitionError(state, event) from None
