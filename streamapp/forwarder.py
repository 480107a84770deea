"""The forwarder (outbox relay): the event store's events, in store order, to the live broker.

It publishes each chunk of events to every topic whose agent replays this store
(``history=FromEventStore()``), keyed by stream id, and advances its checkpoint (kept in
the store's own database) only after the broker confirmed the whole chunk. A crash between
the two publishes the chunk again: at-least-once, never a gap; consumers apply an event
once by its stream version. One forwarder of a store publishes at a time: the others wait
on the store's forwarder lock and take over when its holder dies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from .app import App
from .engine.delivery import STORE_POSITION_HEADER
from .errors import ConfigError, PublishError
from .events import Event
from .eventstore.base import EventStoreBackend, StoredEvent, parse_url
from .history import FromEventStore
from .settings import Backoff, Settings
from .sink import Message, Receipt, Sink

log = logging.getLogger(__name__)

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

    async def run(self) -> None:
        """Wait for the lock, then forward until cancelled."""
        state = self.store.forwarder_state(self.name)
        async with state.lock():
            position = await state.load()
            log.info(
                "forwarder %s starts at store position %d, publishing to %s",
                self.name,
                position,
                ", ".join(self.topics),
            )
            sink = await self._sink()
            failures = 0
            try:
                while True:
                    try:
                        rows = await self.store.read_all(position, self.chunk)
                    except Exception as exc:  # the store restarts or is busy: read again
                        log.warning("forwarder %s: reading the store failed: %r", self.name, exc)
                        await asyncio.sleep(self.poll_interval_s)
                        continue
                    if not rows:
                        await asyncio.sleep(self.poll_interval_s)
                        continue
                    try:
                        receipts = await sink.publish_many(self._messages(rows))
                    except PublishError as exc:
                        failures += 1
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
                    failures = 0
                    offsets = _highest(receipts, rows, len(self.topics))
                    position = rows[-1].position + 1
                    await state.save(position, offsets)
                    self.forwarded += len(rows)
                    log.info(
                        "forwarder %s published positions %d..%d (%d events); offsets %s",
                        self.name,
                        rows[0].position,
                        rows[-1].position,
                        len(rows),
                        " ".join(f"{t}[{p}]@{o}=pos{s}" for t, p, o, s in offsets),
                    )
            finally:
                await _stop(sink)

    def _messages(self, rows: list[StoredEvent]) -> list[Message]:
        out: list[Message] = []
        for row in rows:
            key, value, headers = self.encode(row.event())
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
                log.warning(
                    "forwarder %s: broker not reachable (%r); retrying in %.1fs",
                    self.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)


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
