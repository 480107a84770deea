"""Where a partition's live source starts: a pure decision from what each lane knows.

Kafka Streams decides a task's starting offsets from its checkpoint file before the
consumer fetches; here each lane (agent) of a partition knows its live position from its
table checkpoint, from the event store's replay (the live offset the forwarder recorded
for its store position), or from the group's committed offset (a lane without tables),
or knows nothing. :func:`plan_start` says how to begin the source
(:meth:`~streamapp.engine.port.PartitionPort.begin`); :func:`place` says, from where the
source began, where each lane and the partition go on, and whether to rewind first.

Positions of a port that is not ``absolute`` count deliveries from ``begin()`` on: a
position of an earlier session says nothing of this one, so every lane starts where the
source began (the per-key version guard skips what a lane applied already).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaneStart:
    """What one lane knows of its live position before the source begins."""

    stateful: bool
    """The lane has tables in this partition."""
    replays: bool
    """Its agent declares a history (the event store holds what came before)."""
    position: int | None = None
    """Where the lane goes on (None: the transport must place it)."""
    durable: bool = False
    """``position`` is held by a table (its checkpoint, or the replay), not by the group."""


@dataclass(frozen=True, slots=True)
class StartPlan:
    """How to begin the partition's source."""

    begin_at: int | None
    """The position asked of ``begin()`` (None: the transport's own start)."""
    stateful: bool
    earliest: bool
    """Without a position: from the earliest record (the replay holds nothing live)."""
    settle: bool
    """Settle at the start first: the group may be behind the tables."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the partition and each of its lanes go on once the source began."""

    start: int
    """The partition's next position (the lowest lane's)."""
    positions: tuple[int, ...]
    """Each lane's next position, in the lanes' order."""
    rewind_to: int | None = None
    """Rewind the source here first (a lane is behind where the source began)."""


def plan_start(lanes: Sequence[LaneStart], *, absolute: bool) -> StartPlan:
    """How to begin the source of a partition with these ``lanes`` (at least one)."""
    if not lanes:
        raise ValueError("a partition task has at least one lane")
    known = [lane.position for lane in lanes if lane.position is not None]
    unknown = [lane for lane in lanes if lane.position is None]
    settle = any(lane.durable for lane in lanes)
    if unknown and known and not absolute:
        # A new table without history has nothing to start from: the port may refuse.
        fresh = any(lane.stateful and not lane.replays for lane in unknown)
        return StartPlan(None if fresh else min(known), True, False, settle)
    if unknown:
        stateful = any(lane.stateful for lane in unknown)
        # A new table beside live lanes is built from the topic's earliest offset (the
        # worker checked the topic keeps everything); the live lanes skip what they did.
        beside = bool(known) and any(lane.stateful and not lane.replays for lane in unknown)
        earliest = beside or any(lane.replays for lane in unknown if lane.stateful)
        return StartPlan(None, stateful, earliest, settle)
    return StartPlan(min(known), True, False, settle)


def place(lanes: Sequence[LaneStart], begun: int, *, absolute: bool) -> Placement:
    """Where ``lanes`` go on, the source having begun at ``begun`` as :func:`plan_start`
    asked: a lane without a position starts there; on an absolute port, a lane behind
    it pulls the partition back (rewind)."""
    if not absolute:
        return Placement(begun, (begun,) * len(lanes))
    positions = tuple(begun if lane.position is None else lane.position for lane in lanes)
    if all(lane.position is not None for lane in lanes):
        return Placement(begun, positions)
    low = min(positions)
    return Placement(low, positions, low if low < begun else None)
