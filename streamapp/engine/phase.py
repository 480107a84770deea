"""The phases a partition task goes through, shown by status and views, and the moves
allowed between them (Kafka Streams' ``Task.State.isValidTransition``).

A task and its lanes change phase in one place, the task's :class:`PhaseMachine`
(:meth:`~streamapp.engine.task.PartitionTask.transition_to` and ``transition_lane``),
and every move is checked by :func:`check_transition` against :data:`TRANSITIONS`: a
move the table does not allow is a bug and raises :class:`PhaseTransitionError`.
``CLOSED`` is terminal: a move from it raises too. Work that can race the close (a batch,
a rebuild, a replay, an opening in hand) says so where it moves
(``transition_if_open``): its late move is dropped then, and logged at DEBUG.

While live, what the task is doing is its :class:`LiveState` (``busy`` is any but
``IDLE``), set and cleared through one checked method (:meth:`PhaseMachine.set_live_state`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Protocol

from ..errors import PhaseTransitionError

log = logging.getLogger("streamapp.partition")


class Phase(enum.Enum):
    RESTORING = "restoring"
    """Opening its store and restoring it from the changelog."""
    CATCHING_UP = "catching_up"
    """Replaying the event store into the tables; live deliveries wait."""
    LIVE = "live"
    """Handling live deliveries; views answer."""
    SUSPENDED = "suspended"
    """Revoked by a rebalance that may hand it back: stores and transaction kept open,
    no deliveries taken until it rejoins (live again) or closes."""
    CLOSED = "closed"
    """Revoked or stopped."""
    LOST = "lost"
    """Another worker fenced this one; waits for the group to revoke it."""
    FAILED = "failed"
    """Stopped for good in this worker (an agent refused, a store behind its changelog, a
    store or an app that cannot open): the worker is told and leaves the group."""

    @property
    def serves(self) -> bool:
        """True when views may answer from this partition's committed state."""
        return self is Phase.LIVE

    @property
    def stopped(self) -> bool:
        """True when the task takes no more work here (closed, fenced or failed)."""
        return self in (Phase.CLOSED, Phase.LOST, Phase.FAILED)


_STOPS = frozenset({Phase.CLOSED, Phase.LOST, Phase.FAILED})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # a failed open is tried again from the start
    Phase.RESTORING: frozenset({Phase.RESTORING, Phase.CATCHING_UP, Phase.LIVE}) | _STOPS,
    Phase.CATCHING_UP: frozenset({Phase.RESTORING, Phase.LIVE}) | _STOPS,
    # a corrupt store is rebuilt (restoring), a gap in the queue replayed (catching up)
    Phase.LIVE: frozenset({Phase.RESTORING, Phase.CATCHING_UP, Phase.SUSPENDED}) | _STOPS,
    Phase.SUSPENDED: frozenset({Phase.LIVE}) | _STOPS,
    Phase.LOST: frozenset({Phase.FAILED, Phase.CLOSED}),
    Phase.FAILED: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}
"""The phases a task may move to from each phase."""


def check_transition(name: str, current: Phase, to: Phase) -> None:
    """Raise :class:`PhaseTransitionError` unless ``current`` may move to ``to``: the one
    check of every move, a task's and a lane's."""
    if to not in TRANSITIONS[current]:
        allowed = sorted(p.value for p in TRANSITIONS[current]) or "nothing (terminal)"
        raise PhaseTransitionError(
            f"{name}: a partition task cannot move from {current.value} to {to.value}; "
            f"from {current.value} it moves to {allowed}"
        )


class LiveState(enum.Enum):
    """What a task is doing while live (``/status`` shows it as ``live_state``): nothing
    is fed to it unless it is ``IDLE``."""

    IDLE = "idle"
    """Taking live deliveries."""
    HANDLING = "handling"
    """A live batch in hand (and what it rebuilds or recovers on the way)."""
    REBUILDING = "rebuilding"
    """A store found corrupt while idle, rebuilt (:mod:`~streamapp.engine.rebuild`)."""
    SUSPENDED = "suspended"
    """Kept over a rebalance, until it rejoins or closes."""
    REJOINING = "rejoining"
    """Handed back after a suspend: catching up with what another owner committed."""
    JOINING = "joining"
    """A building lane's handover to live deliveries (:mod:`~streamapp.engine.lane_build`)."""


LIVE_MOVES: dict[LiveState, frozenset[LiveState]] = {
    LiveState.IDLE: frozenset(LiveState) - {LiveState.IDLE, LiveState.REJOINING},
    LiveState.HANDLING: frozenset({LiveState.IDLE}),
    LiveState.REBUILDING: frozenset({LiveState.IDLE}),
    LiveState.SUSPENDED: frozenset({LiveState.REJOINING}),
    LiveState.REJOINING: frozenset({LiveState.IDLE}),
    LiveState.JOINING: frozenset({LiveState.IDLE}),
}
"""The live states a task may move to from each: work starts from ``IDLE`` and ends
back there (a suspended task rejoins first)."""


class Moving(Protocol):
    """A lane as the phase machine moves it (:class:`~streamapp.engine.lane.Lane`)."""

    building: bool

    @property
    def name(self) -> str: ...
    @property
    def phase(self) -> Phase: ...
    def move_to(self, phase: Phase, *, of: str) -> None: ...


class PhaseMachine:
    """A task's phase, its lanes' and its live state: every move checked, none dropped
    unless the caller says it may race the close (:meth:`transition_if_open`)."""

    def __init__(self, name: str, lanes: Sequence[Moving]) -> None:
        self.name, self.lanes = name, lanes
        self.phase = Phase.RESTORING
        """Where the task stands (changed by :meth:`transition_to` alone)."""
        self.live_state = LiveState.IDLE
        """What the task is doing while live (changed by :meth:`set_live_state` alone)."""

    def transition_to(self, phase: Phase) -> None:
        """Move the task, then its lanes, to ``phase`` (each move checked). A building
        lane stays catching up while the task is not stopped (a rebuild, a gap closing:
        it waits)."""
        check_transition(self.name, self.phase, phase)
        self.phase = phase
        for lane in self.lanes:
            if lane.building and not phase.stopped:
                continue
            lane.building = False
            if lane.phase is not phase:
                lane.move_to(phase, of=self.name)

    def transition_lane(self, lane: Moving, phase: Phase) -> None:
        """Move one lane to ``phase``: building on its own (``catching_up``) beside live
        lanes, and its handover (``live``). Checked as the task's moves are."""
        if lane.phase is phase:
            return
        lane.move_to(phase, of=self.name)
        lane.building = phase is Phase.CATCHING_UP and self.phase is not Phase.CATCHING_UP

    def transition_if_open(self, phase: Phase, lane: Moving | None = None) -> bool:
        """For work that can race the close: move as above unless the task is closed
        (for a lane: stopped), and then drop the move (logged at DEBUG); True if moved."""
        if self.phase is Phase.CLOSED or (lane is not None and self.phase.stopped):
            what = self.name if lane is None else f"{self.name} of agent {lane.name}"
            log.debug("%s: %s, move to %s dropped", what, self.phase.value, phase.value)
            return False
        if lane is None:
            self.transition_to(phase)
        else:
            self.transition_lane(lane, phase)
        return True

    def set_live_state(self, to: LiveState, *, was: LiveState) -> None:
        """``was`` ends and ``to`` starts, as :data:`LIVE_MOVES` allows: work starts only
        on an idle task and only its own work ends (else PhaseTransitionError)."""
        if self.live_state is not was or to not in LIVE_MOVES[was]:
            raise PhaseTransitionError(
                f"{self.name}: a live partition task cannot move from {was.value} to "
                f"{to.value}: it is {self.live_state.value}"
            )
        self.live_state = to
