"""The forwarder (outbox relay): the event store's events, in store order, to the live broker.

It publishes each chunk of events to every topic whose agent replays this store
(``history=FromEventStore()``), keyed by stream id, and advances its checkpoint (kept in
the store's own database) only after the broker confirmed the whole chunk. A crash between
the two publishes the chunk again: at-least-once, never a gap; consumers apply an event
once by its stream version. One forwarder of a store publishes at a time: the others wait
on the store's forwarder lock and take over when its holder dies.

With tracing on, each event published gets a span ``forward`` in its own trace (the
``traceparent`` its append gave it), from the publish to the broker's confirm; the event
goes out with its trace context unchanged (Kafka: the ``ce_traceparent`` and
``ce_tracestate`` headers; RabbitMQ: ``cloudEvents_traceparent``, ``cloudEvents_tracestate``).

Logs: a line when it takes the lock (and where it starts), one for its first chunk, then
a summary every :data:`SUMMARY_EVERY_S` while it publishes (events, rate, position
against the store's head, lag), and a line when it stops or loses the lock. Each chunk's
offsets are logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from .. import tracing
from ..agents.history import FromEventStore
from ..app import App
from ..engine.delivery import STORE_POSITION_HEADER
from ..engine.interfaces import Sink
from ..errors import ConfigError, EventStoreUnavailableError, LockLostError, PublishError
from ..events import Event
from ..eventstore.base import EventStoreBackend, ForwarderState, StoredEvent
from ..records import Message, Receipt
from ..settings.settings import Backoff, Settings
from ..settings.store_url import parse_url

log = logging.getLogger("streamapp.forwarder")

SUMMARY_EVERY_S = 5.0
"""How often a publishing forwarder logs its summary line."""

Encoder = Callable[[Event], tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]
"""``event -> (key, value, headers)`` in the sink's wire format."""


def forwarded_topics(app: App, settings: Settings) -> list[str]:
    """The topics of ``app``'s agents whose history is the ``event_store`` of ``settings``."""
    store = parse_url(settings.event_store)
    topics = list(
        dict.fromkeys(
            agent.topic.name
            for agent in app.agents.values()
            if isinstance(agent.history, FromEventStore)
            and parse_url(agent.history.url or settings.event_store) == store
        )
    )
    if not topics:
        raise ConfigError(
            f"app {app.id!r} has no agent with history=FromEventStore() on the store of "
            f"setting event_store (STREAMAPP_EVENT_STORE) = {settings.event_store!r}: "
            "nothing to forward. Declare the history on an agent, or point the setting at "
            "its store."
        )
    return topics


class Forwarder:
    """Publishes ``store``'s events to ``topics`` through sinks made by ``make_sink``."""

    def __init__(
        self,
        store: EventStoreBackend,
        make_sink: Callable[[], Sink],
        topics: Sequence[str],
        *,
        name: str,
        encode: Encoder,
        chunk: int = 1000,
        poll_interval_s: float = 0.5,
        backoff: Backoff | None = None,
    ) -> None:
        self.store = store
        self.make_sink = make_sink
        self.topics = list(topics)
        self.name = name
        self.encode = encode
        self.chunk = chunk
        self.poll_interval_s = poll_interval_s
        self.backoff = backoff or Backoff(attempts=20, initial_s=0.2, max_s=5.0)
        self.forwarded = 0
        """Events published (and checkpointed) by this forwarder since it started."""
        self.lag: int | None = None
        """Store events not published yet, at the last summary (None: not known yet)."""
        self.rate = 0.0
        """Events per second over the last summary's period (0 once a period published none)."""
        self.failures = 0
        """Failed publishes and producer starts since the last confirmed chunk (or idle read)."""
        self.holding = False
        """Whether this forwarder holds the store's forwarder lock (and so publishes)."""
        self.position: int | None = None
        """The checkpoint: the next store position to publish (None: lock never held)."""
        self.pending_since: float | None = None
        """When (monotonic) this forwarder first read the event at its checkpoint and had
        not published it yet (None: none read): the floor of its lag in seconds."""
        self.trace = tracing.active()
        """Tracing on: a span ``forward`` per event published, in its event's trace."""

    async def run(self) -> None:
        """Wait for the lock, then forward until cancelled. A lock lost with its database
        session (a server restart) stops publishing at once; the forwarder then waits for
        the lock again and goes on from the checkpoint, which another forwarder may have
        advanced meanwhile."""
        state = self.store.forwarder_state(self.name)
        while True:
            try:
                async with state.lock():
                    await self._forward(state)
            except LockLostError as exc:
                log.warning("%s: stopped publishing; taking the lock again", exc)
            except EventStoreUnavailableError as exc:
                log.warning("forwarder %s: %s; trying again", self.name, exc)
                await asyncio.sleep(self.poll_interval_s)

    async def _forward(self, state: ForwarderState) -> None:
        """Publish from the checkpoint on, while holding the lock."""
        position = await state.load()
        self.position, self.holding = position, True
        log.info(
            "forwarder %s starts at store position %d, publishing to %s",
            self.name,
            position,
            ", ".join(self.topics),
        )
        sink = await self._sink()
        failures = 0
        read_failed: float | None = None
        summary = _Summary(self, position)
        try:
            while True:
                await summary.maybe_log(position)
                try:
                    rows = await self.store.read_all(position, self.chunk)
                except Exception as exc:  # the store is busy, or still down: read again
                    if read_failed is None:  # once per outage (the store logs its own)
                        read_failed = time.monotonic()
                        log.warning("forwarder %s: reading the store failed: %r", self.name, exc)
                    await asyncio.sleep(self.poll_interval_s)
                    continue
                if read_failed is not None:
                    log.info(
                        "forwarder %s: reading the store again after %.1fs",
                        self.name,
                        time.monotonic() - read_failed,
                    )
                    read_failed = None
                if rows and self.pending_since is None:
                    self.pending_since = time.monotonic()
                if not rows:
                    self.failures = 0  # caught up, the producer started: nothing failing
                    await asyncio.sleep(self.poll_interval_s)
                    continue
                traced: list[tuple[Event, int]] | None = [] if self.trace is not None else None
                started_ns = time.time_ns()
                try:
                    receipts = await sink.publish_many(self._messages(rows, traced))
                except PublishError as exc:
                    failures += 1
                    self.failures += 1
                    delay = self.backoff.delays()[min(failures, self.backoff.attempts - 2)]
                    log.warning(
                        "forwarder %s: positions %d..%d not confirmed, publishing them "
                        "again in %.1fs with a new producer: %s",
                        self.name,
                        rows[0].position,
                        rows[-1].position,
                        delay,
                        exc,
                    )
                    await _stop(sink)
                    await asyncio.sleep(delay)
                    sink = await self._sink()
                    continue
                failures = self.failures = 0
                offsets = _highest(receipts, rows, len(self.topics))
                position = rows[-1].position + 1
                await state.save(position, offsets)
                self.position, self.pending_since = position, None
                self.forwarded += len(rows)
                if self.trace is not None and traced is not None:
                    self.trace.forwarded(traced, self.topics, started_ns)
                summary.published(rows[0].position, rows[-1].position)
                log.debug(
                    "forwarder %s published positions %d..%d (%d events); offsets %s",
                    self.name,
                    rows[0].position,
                    rows[-1].position,
                    len(rows),
                    " ".join(f"{t}[{p}]@{o}=pos{s}" for t, p, o, s in offsets),
                )
        finally:
            self.holding, self.pending_since = False, None
            log.info(
                "forwarder %s stopped publishing at store position %d (%d events published "
                "while it held the lock)",
                self.name,
                position,
                summary.total,
            )
            await _stop(sink)

    def _messages(
        self, rows: list[StoredEvent], traced: list[tuple[Event, int]] | None = None
    ) -> list[Message]:
        """Each row's event as a message to every topic (and into ``traced``, if given,
        with its store position)."""
        out: list[Message] = []
        for row in rows:
            event = row.event()
            if traced is not None:
                traced.append((event, row.position))
            key, value, headers = self.encode(event)
            headers = [*headers, (STORE_POSITION_HEADER, b"%d" % row.position)]
            out.extend(Message(topic, value, key, headers) for topic in self.topics)
        return out

    async def _sink(self) -> Sink:
        """A started sink; retries (logging) while the broker does not answer."""
        delays = self.backoff.delays()
        attempt = 0
        while True:
            sink = self.make_sink()
            try:
                await sink.start()
                return sink
            except Exception as exc:  # client errors differ per broker; retry any
                await _stop(sink)
                delay = delays[min(attempt, len(delays) - 1)] if delays else 1.0
                attempt += 1
                self.failures += 1
                log.warning(
                    "forwarder %s: broker not reachable (%r); retrying in %.1fs",
                    self.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)


class _Summary:
    """What a forwarder published since its last summary line (see the module docstring)."""

    def __init__(self, forwarder: Forwarder, position: int) -> None:
        self.forwarder = forwarder
        self.total = 0
        self._count = 0
        self._first: int | None = None
        self._last = position - 1
        self._since = time.monotonic()

    def published(self, first: int, last: int) -> None:
        if self.total == 0:
            log.info(
                "forwarder %s published positions %d..%d (%d events), its first since it "
                "took the lock; a summary follows every %.0fs while it publishes",
                self.forwarder.name,
                first,
                last,
                last - first + 1,
                SUMMARY_EVERY_S,
            )
            self._since = time.monotonic()
        else:
            self._first = first if self._first is None else self._first
            self._count += last - first + 1
        self.total += last - first + 1
        self._last = last

    async def maybe_log(self, position: int) -> None:
        """The summary line, when one is due and something was published since the last."""
        now = time.monotonic()
        elapsed = now - self._since
        if elapsed < SUMMARY_EVERY_S:
            return
        if self._first is None:  # a period without a published chunk: no rate
            if self.total:
                self.forwarder.rate = 0.0
            return
        fwd = self.forwarder
        try:
            head = await fwd.store.head()
        except Exception:  # the store is down: the read that follows says so
            return
        fwd.rate = self._count / elapsed
        fwd.lag = max(0, head - (position - 1))
        log.info(
            "forwarder %s published positions %d..%d: %d events in %.1fs (%.0f ev/s), "
            "%d in all; store position %d of head %d, lag %d events",
            fwd.name,
            self._first,
            self._last,
            self._count,
            elapsed,
            fwd.rate,
            self.total,
            position - 1,
            head,
            fwd.lag,
        )
        self._first, self._count, self._since = None, 0, now


def _highest(
    receipts: list[Receipt], rows: list[StoredEvent], per_row: int
) -> list[tuple[str, int, int, int]]:
    """Per topic partition, the highest offset of the chunk and the store position it carried."""
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for i, receipt in enumerate(receipts):
        if receipt.partition is None or receipt.offset is None:
            continue
        key = (receipt.topic, receipt.partition)
        if key not in best or best[key][0] < receipt.offset:
            best[key] = (receipt.offset, rows[i // per_row].position)
    return [(t, p, o, pos) for (t, p), (o, pos) in sorted(best.items())]


async def _stop(sink: Sink) -> None:
    try:
        await sink.stop()
    except Exception as exc:  # a broken producer may fail to flush: it is dropped anyway
        log.debug("sink stop failed: %r", exc)
