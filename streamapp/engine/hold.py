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

**Release.** A replay (``streamapp parked replay``, ``streamapp store parked replay``)
sends the parked copies back with their marks; the lane that holds the stream runs the
one that is next in the stream (the hold's ``first``) through the handler, and the hold
moves on to the next (stream versions are contiguous) until the last one held is
applied: the stream is released. One that fails again holds the stream again from it;
the copies sent back after it are parked again behind it, in order, not counted twice.
A held event sent back marked :data:`~streamapp.failures.republish.HELD_SKIP` (``streamapp parked
skip``) is skipped for good instead: recorded in the lane's ``skipped`` state with the
batch, logged, its stream version counted as applied; the only way an event is left out.

**One release is enough** (the design, against a release that has to be run again for
what was parked while it ran). Each versioned event parked *behind* a hold is also kept
in the lane's own state (``held_events``, :meth:`PartitionTables.keep
<streamapp.tables.partition.PartitionTables.keep>`), in the same atomic write as the
hold, the tables and the checkpoint, and in the changelog with them. When a release
applies a held event (or skips it), the lane applies the events it kept behind it at
once, in stream-version order, in the same delivery's turn (:func:`follow`), until none
is left: the stream is released there. So a new live event of the stream that came
before the release reached the lane (parked behind, kept) is applied right after the
held ones by that same release, whether or not the replay's run saw its parked copy;
one that comes after is applied live, the stream being released already. The order is
the stream's, and a live event is never applied before a held one. Through ``kill -9``
at any point the batch is written whole or not at all: the head's effects, the kept
events' effects, the hold's end and the kept copies' removal together; the head comes
again from the source and does the same. The copies of kept events that the replay
sends back afterwards are skipped by the stream-version guard without a warning
(:func:`~streamapp.engine.settle.settle_failed`). A kept event that fails again holds
the stream again from it, without a new parked copy (its copy is parked already, from
when it came); the next release applies it. Events without a stream version are not
kept (nothing would tell a copy from a redelivery): they wait for their copies.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterable
from dataclasses import replace

import orjson

from ..agents.agent import handle
from ..errors import DecodeError
from ..events import Event
from ..failures.outcomes import Outcome, parking
from ..failures.republish import HELD_PLACE, HELD_SKIP, HELD_STREAM
from ..failures.retry_chain import header
from ..records import Delivery, DeliveryRecord
from ..tables.held import HeldStream
from ..tables.partition import PartitionTables
from .delivery import Decoder, decode_delivery
from .interfaces import TaskMetrics
from .lane_surface import LaneSurface

log = logging.getLogger("streamapp.agent")

RELEASE = "release"
"""What :func:`behind` answers for the head of a held stream sent back by a replay: run
it through the handler, then :func:`released` moves the hold on."""


def holds_streams(lane: LaneSurface) -> PartitionTables | None:
    """The lane's tables when its policy holds streams (None: it does not)."""
    policy = parking(lane.agent.on_failure)
    return lane.tables if policy is not None and policy.holds else None


async def behind(
    lane: LaneSurface,
    tables: PartitionTables,
    record: Delivery,
    item: Event | DecodeError,
    metrics: TaskMetrics,
    decode: Decoder,
    counts: dict[Outcome, int],
) -> bool | str | None:
    """What the lane does with ``record`` of a stream it may hold. None: the stream is
    not held (or the guard skips the event, applied before the hold), the handler runs;
    :data:`RELEASE`: the next held event, sent back by a replay, the handler runs;
    True: parked behind the hold (confirmed), or a redelivery of an event parked already;
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
    sent_back = header(record.headers, HELD_STREAM) == held.stream.encode()
    if sent_back and held.heads(version):
        why = header(record.headers, HELD_SKIP)
        if why is None:
            return RELEASE
        _skip(lane, tables, record, item, why.decode(errors="replace"))
        await follow(lane, tables, item, decode, counts, metrics)
        return True
    if not sent_back and held.parked_already(version):
        return True
    after = held if sent_back else held.behind(version)  # sent back: counted already
    place = _place(held, version, after.events)
    reason = f"stream {held.stream!r} is held from {held.place} ({held.error})"
    if not await lane.park(_marked(record, held.stream, place), reason):
        return False
    tables.hold(after)
    if not sent_back and version is not None:  # a copy sent back was kept when it came
        tables.keep(held.stream, version, _kept(record))
    metrics.parked(lane.agent.name)
    log.debug(
        "agent %s: %s[%d]@%d parked behind held stream %r (place %d)",
        lane.agent.name,
        record.topic,
        record.partition,
        record.position,
        held.stream,
        place,
    )
    return True


def _skip(
    lane: LaneSurface, tables: PartitionTables, record: Delivery, item: Event, why: str
) -> None:
    """Skip the head of a held stream for good, on purpose (``streamapp parked skip``):
    recorded in the lane's state with the batch, its stream version counted as applied,
    logged; the hold moves on to the next event."""
    sid, version = item.stream_id, item.stream_version
    assert sid is not None
    skipped = {
        "stream": sid,
        "event": item.id,
        "version": version,
        "position": record.position,
        "reason": why,
        "at_ms": int(time.time() * 1000),
    }
    tables.skip(sid, item.id, orjson.dumps(skipped))
    if version is not None:
        tables.record_version(sid, version)
        tables.commit_event()
    log.warning(
        "agent %s: event %s of held stream %r (version %s) is skipped for good, on "
        "purpose (streamapp parked skip: %s): the table never applies it",
        lane.agent.name,
        item.id,
        sid,
        version,
        why,
    )
    released(lane, tables, item)


def released(lane: LaneSurface, tables: PartitionTables, item: Event | DecodeError) -> None:
    """The head of a held stream, sent back, was applied (or filtered): the hold moves to
    the next event, or the stream is released when it was the last one held."""
    if isinstance(item, DecodeError) or item.stream_id is None:
        return
    held = tables.held(item.stream_id)
    if held is None:
        return
    version = item.stream_version
    if version is not None:
        tables.done_with(held.stream, version)
    if held.events <= 1 or (version is not None and held.last is not None and version >= held.last):
        tables.release(held.stream)
        log.warning(
            "agent %s: stream %r is released: its held events are applied, in order",
            lane.agent.name,
            held.stream,
        )
        return
    tables.hold(held.applied(version))


async def release_next(
    lane: LaneSurface,
    tables: PartitionTables,
    item: Event | DecodeError,
    decode: Decoder,
    counts: dict[Outcome, int],
    metrics: TaskMetrics,
) -> None:
    """The head of a held stream, sent back, was applied (or filtered): move the hold
    on (:func:`released`), then apply what the lane kept behind it (:func:`follow`)."""
    released(lane, tables, item)
    await follow(lane, tables, item, decode, counts, metrics)


async def follow(
    lane: LaneSurface,
    tables: PartitionTables,
    item: Event | DecodeError,
    decode: Decoder,
    counts: dict[Outcome, int],
    metrics: TaskMetrics,
) -> None:
    """After a release applied (or skipped) ``item``, a held event: apply the events the
    lane kept behind it, lowest stream version first, while its stream is held (the
    module's "one release is enough"). A kept event that does not settle holds the
    stream again from it; its parked copy stays where it is, for the next release."""
    if isinstance(item, DecodeError) or item.stream_id is None or item.stream_version is None:
        return
    sid, after = item.stream_id, item.stream_version
    while (held := tables.held(sid)) is not None:
        found = tables.next_kept(sid, after)
        if found is None:
            return
        after, raw = found
        record = _delivery(raw)
        event = decode_delivery(decode, record)
        handled = await handle(
            lane.agent, event, tables, lane.views, lane.outbox, lane.send, lane.run
        )
        counts[handled.outcome] = counts.get(handled.outcome, 0) + 1
        if not handled.outcome.settles or isinstance(event, DecodeError):
            metrics.failed_attempts(lane.agent.name, 1)
            again = replace(
                held,
                first=after,
                exact=True,
                position=record.position,
                event=getattr(event, "id", ""),
                error=handled.reason,
            )
            tables.hold(again)
            log.warning(
                "agent %s: stream %r is held again from %d (%s[%d]@%d, kept behind its "
                "hold and applied by the release): %s; its parked copy is in the parking "
                "destination already: the next release applies it",
                lane.agent.name,
                sid,
                after,
                record.topic,
                record.partition,
                record.position,
                handled.reason,
            )
            return
        released(lane, tables, event)


async def hold_failed(lane: LaneSurface, record: Delivery, item: Event, reason: str) -> bool:
    """Park ``record``, which failed for good, as the first event of its stream's hold,
    and hold the stream; True once the park is confirmed."""
    tables = lane.tables
    assert tables is not None
    assert item.stream_id is not None
    sid = item.stream_id
    if not await lane.park(_marked(record, sid, 1), reason):
        return False
    before = tables.held(sid)  # sent back and failed again: held again from it
    held = HeldStream(
        stream=sid,
        first=item.stream_version,
        position=record.position,
        event=item.id,
        error=reason,
        events=1 if before is None else before.events,
        last=item.stream_version if before is None else before.last,
        since_ms=int(time.time() * 1000) if before is None else before.since_ms,
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


def _place(held: HeldStream, version: int | None, counted: int) -> int:
    """The place of the event of stream version ``version`` in ``held`` (1-based)."""
    if version is not None and held.first is not None:
        return version - held.first + 1
    return counted


def _marked(record: Delivery, stream: str, place: int) -> Delivery:
    headers = (
        *((n, v) for n, v in record.headers if n not in (HELD_STREAM, HELD_PLACE)),
        (HELD_STREAM, stream.encode()),
        (HELD_PLACE, str(place).encode()),
    )
    return DeliveryRecord(
        record.topic, record.partition, record.position, record.key, record.value, headers
    )


def _kept(record: Delivery) -> bytes:
    """``record`` as the lane keeps it behind a hold (JSON, bytes in base64)."""
    b64 = base64.b64encode
    return orjson.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "position": record.position,
            "key": None if record.key is None else b64(record.key).decode(),
            "value": None if record.value is None else b64(record.value).decode(),
            "headers": [[n, b64(v).decode()] for n, v in record.headers],
        }
    )


def _delivery(raw: bytes) -> DeliveryRecord:
    """A kept record (:func:`_kept`) as the delivery it was."""
    body = orjson.loads(raw)
    key, value = body["key"], body["value"]
    return DeliveryRecord(
        str(body["topic"]),
        int(body["partition"]),
        int(body["position"]),
        None if key is None else base64.b64decode(key),
        None if value is None else base64.b64decode(value),
        tuple((str(n), base64.b64decode(v)) for n, v in body["headers"]),
    )


def held_counts(lanes: Iterable[LaneSurface]) -> dict[str, tuple[int, int]]:
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
