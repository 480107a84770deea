"""Held streams: what a lane of ``Park(destination, hold="stream")`` does with them.

An event that fails for good (its first attempt, or once a bounded Redeliver's attempts
are spent) is parked, and its stream is **held** in the lane: a
:class:`~streamapp.tables.held.HeldStream` set in the open batch, so it is written with
the tables and the checkpoint and reaches the changelog with them. While the stream is
held, each later event of it on that partition is parked behind, in order, without
running the handler (outcome ``held``); every other stream goes on. Each parked copy is
marked with the held stream (:data:`HELD_STREAM`) and its place in the hold
(:data:`HELD_PLACE`, 1 for the event that failed). A park that is not confirmed leaves
the delivery unsettled, as any park does: the partition redelivers it.

An event at or below the stream version the table applied already is not parked: the
stream-version guard skips it as before. A redelivery of an event parked behind already
(its version at or below the hold's last) is settled without a second copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import DecodeError
from ..events import Event
from ..outcomes import parking
from ..records import Delivery, DeliveryRecord
from ..tables.held import HeldStream
from ..tables.partition import PartitionTables
from .interfaces import TaskMetrics

if TYPE_CHECKING:
    from .lane import Lane

log = logging.getLogger("streamapp.agent")

HELD_STREAM = "streamapp-held-stream"
"""On a parked copy of a held stream: the stream id."""
HELD_PLACE = "streamapp-held-place"
"""On a parked copy of a held stream: its place in the hold (1: the event that failed)."""


def holds_streams(lane: Lane) -> PartitionTables | None:
    """The lane's tables when its policy holds streams (None: it does not)."""
    policy = parking(lane.agent.on_failure)
    return lane.tables if policy is not None and policy.holds else None


async def behind(
    lane: Lane,
    tables: PartitionTables,
    record: Delivery,
    item: Event | DecodeError,
    metrics: TaskMetrics,
) -> bool | None:
    """Park ``record`` behind the hold of its stream. None: its stream is not held (or
    the event was applied before the hold), it runs through the handler; True: settled
    for the lane (the park confirmed, or a redelivery of an event parked already);
    False: the park failed, the delivery stays unsettled."""
    if isinstance(item, DecodeError) or not tables.holding:
        return None
    sid = item.stream_id
    held = None if sid is None else tables.held(sid)
    if held is None:
        return None
    version = item.stream_version
    if version is not None and version <= tables.applied_version(held.stream):
        return None  # applied before the hold: the guard skips it
    if held.parked_already(version):
        return True
    after = held.behind(version)
    reason = f"stream {held.stream!r} is held from {held.place} ({held.error})"
    if not await lane.park(_marked(record, held.stream, after.events), reason):
        return False
    tables.hold(after)
    metrics.parked(lane.agent.name)
    log.debug(
        "agent %s: %s[%d]@%d parked behind held stream %r (place %d)",
        lane.agent.name,
        record.topic,
        record.partition,
        record.position,
        held.stream,
        after.events,
    )
    return True


async def hold_failed(lane: Lane, record: Delivery, item: Event, reason: str) -> bool:
    """Park ``record``, which failed for good, as the first event of its stream's hold,
    and hold the stream; True once the park is confirmed."""
    tables = lane.tables
    assert tables is not None
    assert item.stream_id is not None
    sid = item.stream_id
    if not await lane.park(_marked(record, sid, 1), reason):
        return False
    held = HeldStream(
        stream=sid,
        first=item.stream_version,
        position=record.position,
        event=item.id,
        error=reason,
        last=item.stream_version,
        since_ms=int(time.time() * 1000),
    )
    tables.hold(held)
    log.warning(
        "agent %s: stream %r is held from %s (%s[%d]@%d, event %s): %s; its later events "
        "on this partition are parked behind it until it is released (streamapp parked "
        "replay, docs/failures.md)",
        lane.agent.name,
        sid,
        held.place,
        record.topic,
        record.partition,
        record.position,
        item.id,
        reason,
    )
    return True


def _marked(record: Delivery, stream: str, place: int) -> Delivery:
    headers = (*record.headers, (HELD_STREAM, stream.encode()), (HELD_PLACE, str(place).encode()))
    return DeliveryRecord(
        record.topic, record.partition, record.position, record.key, record.value, headers
    )


def held_counts(lanes: Iterable[Lane]) -> dict[str, tuple[int, int]]:
    """Per agent of ``lanes`` that holds streams: its held streams and the events they
    hold (committed state; agents that hold none are there with zeros)."""
    out: dict[str, tuple[int, int]] = {}
    for lane in lanes:
        tables = holds_streams(lane)
        if tables is None:
            continue
        held = tables.held_streams().values()
        streams, events = out.get(lane.name, (0, 0))
        out[lane.name] = (streams + len(held), events + sum(h.events for h in held))
    return out
