"""The phases a partition task goes through, shown by status and views, and the moves
allowed between them (Kafka Streams' ``Task.State.isValidTransition``).

A task changes phase in one place (:meth:`~streamapp.engine.task.PartitionTask.transition_to`),
which checks :data:`TRANSITIONS`: a move the table does not allow is a bug and raises
:class:`PhaseTransitionError`. ``CLOSED`` is terminal: work that raced the close (a batch,
a rebuild, a replay in hand) finds the task closed and its late move is dropped.
"""

from __future__ import annotations

import enum

from ..errors import PhaseTransitionError


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
    """Raise :class:`PhaseTransitionError` unless ``current`` may move to ``to``."""
    if to not in TRANSITIONS[current]:
        allowed = sorted(p.value for p in TRANSITIONS[current]) or "nothing (terminal)"
        raise PhaseTransitionError(
            f"{name}: a partition task cannot move from {current.value} to {to.value}; "
            f"from {current.value} it moves to {allowed}"
        )
