"""What observers read of a partition task: its counts and its status value.

``/status``, the readiness check, the metrics and the logs read a task through these
(and its phase); nothing an observer reads changes the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..failures.outcomes import Outcome
from ..tables.checkpoint import Checkpoint
from ..topics import TopicSpec
from .hold import held_counts
from .lane import Lane
from .phase import LiveState, Phase


@dataclass(slots=True)
class TaskCounts:
    """A task's running counts, shown by its status."""

    processed: int = 0
    """Live deliveries settled."""
    restored: int = 0
    """Changelog records restored into its stores."""
    replayed: int = 0
    """Stored events settled by the replay."""
    rebuilt: int = 0
    """Corrupt local stores wiped and rebuilt."""
    stuck_on: dict[str, object] | None = None
    """The stored event its catch-up fails on (set by the event-store feed)."""


def outcomes_of(lanes: Sequence[Lane]) -> dict[Outcome, int]:
    """Outcomes of every delivery handled, live and replayed, summed over the lanes."""
    out: dict[Outcome, int] = {}
    for lane in lanes:
        for outcome, n in lane.outcomes.items():
            out[outcome] = out.get(outcome, 0) + n
    return out


class _Fed(Protocol):
    @property
    def follows_store(self) -> bool: ...


class Observed(Protocol):
    """What the status reads of a partition task (:class:`~streamapp.engine.task.PartitionTask`;
    a protocol, as the task imports this module)."""

    @property
    def topic(self) -> TopicSpec: ...
    @property
    def partition(self) -> int: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def busy(self) -> bool: ...
    @property
    def live_state(self) -> LiveState: ...
    @property
    def next_position(self) -> int | None: ...
    @property
    def lag(self) -> int | None: ...
    @property
    def counts(self) -> TaskCounts: ...
    @property
    def lanes(self) -> Sequence[Lane]: ...
    @property
    def replay(self) -> _Fed: ...


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """One task's status, as ``/status`` shows it (:meth:`as_dict`)."""

    topic: str
    partition: int
    phase: Phase
    busy: bool
    start_position: int | None
    next_position: int | None
    lag: int | None
    counts: TaskCounts
    lanes: Sequence[Lane]
    store_fed: bool = False
    """The event store is the live source (STREAMAPP_BROKER=none)."""
    live_state: LiveState | None = None
    """What it is doing while live or suspended (None in other phases)."""

    @classmethod
    def of(cls, task: Observed, start_position: int | None) -> TaskStatus:
        """``task``'s status now (``start_position``: where its live source began)."""
        return cls(
            task.topic.name,
            task.partition,
            task.phase,
            task.busy,
            start_position,
            task.next_position,
            task.lag,
            task.counts,
            task.lanes,
            task.replay.follows_store,
            task.live_state if task.phase in (Phase.LIVE, Phase.SUSPENDED) else None,
        )

    def as_dict(self) -> dict[str, object]:
        lanes, counts = self.lanes, self.counts
        first = next((lane.tables for lane in lanes if lane.tables is not None), None)
        cp = first.checkpoint if first is not None else None
        return {
            "agent": ", ".join(lane.name for lane in lanes),
            "topic": self.topic,
            "partition": self.partition,
            "phase": self.phase.value,
            "busy": self.busy,
            "live_state": None if self.live_state is None else self.live_state.value,
            "start_position": self.start_position,
            "next_position": self.next_position,
            "lag": self.lag,
            "processed": counts.processed,
            "restored": counts.restored,
            "replayed": counts.replayed,
            "stuck_on": counts.stuck_on,
            "rebuilt": counts.rebuilt,
            "unversioned": sum(lane.unversioned for lane in lanes),
            "outcomes": _named(outcomes_of(lanes)),
            "held_streams": sum(n for n, _ in held_counts(lanes).values()),
            **_stored(cp),
            "checkpoint": _resumes_at(cp, self.store_fed),
            "agents": {lane.name: _lane_status(lane) for lane in lanes},
        }


def _resumes_at(cp: Checkpoint | None, store_fed: bool) -> int | None:
    """The source position a restart resumes from: the live one, or the store position
    when the event store is the only source (embedded mode keeps no live position)."""
    if cp is None:
        return None
    return cp.history if store_fed and cp.live is None else cp.live


def _stored(cp: Checkpoint | None) -> dict[str, object]:
    return {
        "store_position": None if cp is None else cp.history,
        "caught_up": None if cp is None else cp.caught_up,
    }


def _lane_status(lane: Lane) -> dict[str, object]:
    cp = lane.tables.checkpoint if lane.tables is not None else None
    return {
        "phase": lane.phase.value,
        "position": lane.next,
        "outcomes": _named(lane.outcomes),
        "chain": dict(lane.chain_totals),
        **_stored(cp),
        **_held(lane),
    }


def _held(lane: Lane) -> dict[str, object]:
    """A lane's held streams (``Park(destination, hold="stream")``): their count, the
    events they hold, each with its error, and the held events skipped on purpose (``streamapp
    parked skip``, counted in memory); nothing for a lane that never holds."""
    counts = held_counts([lane]).get(lane.name)
    if counts is None or lane.tables is None:
        return {}
    return {
        "held_streams": counts[0],
        "held_events": counts[1],
        "held": [h.as_json() for h in lane.tables.held_streams().values()],
        "skipped": lane.tables.skips,
    }


def _named(outcomes: dict[Outcome, int]) -> dict[str, int]:
    return {o.value: n for o, n in sorted(outcomes.items(), key=lambda kv: kv[0].value)}
