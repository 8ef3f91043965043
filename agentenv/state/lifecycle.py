"""Sandbox lifecycle: every state and every allowed transition, in one table.

Each multi-step operation (create, pause, resume, checkpoint for a fork, kill) has a
transient state of its own. It ends with DONE or FAILED, so a crash leaves the state that
names the unfinished step, and recovery (`runtime/node/recovery.py`) has one rule per state.
"""

from __future__ import annotations

from enum import StrEnum

from ..errors import Conflict


class State(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    # Frozen for a fork's copy of its memory and disk; it runs on afterwards.
    CHECKPOINTING = "checkpointing"
    # A paused sandbox's files being copied (for a snapshot); it stays paused.
    COPYING = "copying"
    # Put back to one of its snapshots in place; its files are the snapshot's from the
    # moment this state is entered, so it ends running or paused at that snapshot.
    ROLLING_BACK = "rolling_back"
    KILLING = "killing"

    # The questions the rest of the code asks of a state; the sets below answer them.
    @property
    def runs(self) -> bool:
        """Its guest runs with no pause behind it; the proxy routes to it exactly now."""
        return self in RUNS

    @property
    def visible(self) -> bool:
        """Listed and found by id; a sandbox being killed is gone for its users."""
        return self not in GOING

    @property
    def going(self) -> bool:
        """Being killed: whatever ends in it is torn down."""
        return self in GOING

    @property
    def holds_memory(self) -> bool:
        return self in HOLDS_MEMORY

    @property
    def at_rest(self) -> bool:
        return self in AT_REST

    @property
    def expires(self) -> bool:
        return self in EXPIRES


class Event(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CHECKPOINT = "checkpoint"
    COPY = "copy"
    ROLLBACK = "rollback"
    KILL = "kill"
    # The operation of the current transient state finished, or failed and was undone.
    DONE = "done"
    FAILED = "failed"
    # A resume failed after the restored guest ran: its saved state no longer matches.
    LOST = "lost"
    # A running sandbox's VM exited on its own (the sweeper saw it gone): it is removed.
    EXITED = "exited"
    # Another node takes the sandbox of a node that was lost (`runtime/node/adoption.py`).
    ADOPT = "adopt"
    # Its network rules are replaced; it stays as it is (one stored change, then applied).
    RECONFIGURE = "reconfigure"


# (state, event) -> next state. Anything absent is refused with `TransitionError`.
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.CREATING, Event.DONE): State.RUNNING,
    (State.CREATING, Event.FAILED): State.KILLING,
    (State.RUNNING, Event.PAUSE): State.PAUSING,
    (State.RUNNING, Event.CHECKPOINT): State.CHECKPOINTING,
    (State.PAUSING, Event.DONE): State.PAUSED,
    (State.PAUSING, Event.FAILED): State.RUNNING,
    (State.PAUSED, Event.RESUME): State.RESUMING,
    (State.RESUMING, Event.DONE): State.RUNNING,
    (State.RESUMING, Event.FAILED): State.PAUSED,
    (State.RESUMING, Event.LOST): State.KILLING,
    (State.CHECKPOINTING, Event.DONE): State.RUNNING,
    (State.CHECKPOINTING, Event.FAILED): State.RUNNING,
    (State.PAUSED, Event.COPY): State.COPYING,
    (State.COPYING, Event.DONE): State.PAUSED,
    (State.COPYING, Event.FAILED): State.PAUSED,
    (State.RUNNING, Event.ROLLBACK): State.ROLLING_BACK,
    (State.PAUSED, Event.ROLLBACK): State.ROLLING_BACK,
    (State.ROLLING_BACK, Event.DONE): State.RUNNING,
    (State.ROLLING_BACK, Event.FAILED): State.PAUSED,
    (State.ROLLING_BACK, Event.LOST): State.KILLING,
    # Only a sandbox at rest in the object store outlives its node; a copy under way died
    # with it, and the sandbox is paused at its stored files.
    (State.PAUSED, Event.ADOPT): State.PAUSED,
    (State.COPYING, Event.ADOPT): State.PAUSED,
    (State.RUNNING, Event.EXITED): State.KILLING,
    (State.RUNNING, Event.RECONFIGURE): State.RUNNING,
    (State.PAUSED, Event.RECONFIGURE): State.PAUSED,
    # Kill is always possible, from a stuck transient state too; killing again retries.
    **{(state, Event.KILL): State.KILLING for state in State},
}

# Transient states: an operation is under way (or was, when the server died).
TRANSIENT = frozenset(
    {
        State.CREATING,
        State.PAUSING,
        State.RESUMING,
        State.CHECKPOINTING,
        State.COPYING,
        State.ROLLING_BACK,
    }
)

RUNS = frozenset({State.RUNNING})

GOING = frozenset({State.KILLING})

# States whose VM holds host memory (admission counts them); paused ones hold disk only.
HOLDS_MEMORY = frozenset(set(State) - {State.PAUSED, State.COPYING, State.KILLING})

# States whose files no VM or operation changes: uploads may read them meanwhile.
AT_REST = frozenset({State.PAUSED})

# Sandboxes that expire: a paused one waits to be resumed or deleted.
EXPIRES = frozenset({State.RUNNING})

# States the E2B API shows; transient ones are reported as the state they come from.
PUBLIC_STATE: dict[State, str] = {
    State.CREATING: "running",
    State.RUNNING: "running",
    State.PAUSING: "running",
    State.PAUSED: "paused",
    State.RESUMING: "paused",
    State.CHECKPOINTING: "running",
    State.COPYING: "paused",
    State.ROLLING_BACK: "running",
    State.KILLING: "running",
}


class TransitionError(Conflict):
    """An event that the sandbox's current state does not allow (HTTP 409)."""

    def __init__(self, state: State, event: Event) -> None:
        super().__init__(f"cannot {event.value} a sandbox that is {state.value}")
        self.state = state
        self.event = event


def allows(state: State, event: Event) -> bool:
    return (state, event) in TRANSITIONS


def next_state(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise TransitionError(state, event) from None
