"""The relay: republishes due retry and delay copies to their origin topics.

One per worker, when the app has retry topics (agents with ``Retry``) or delay topics
(setting ``delayed_policy=relay``). It is a member of its own consumer group,
``{group}-relay``, subscribed to those topics only: the workers share their partitions
as they share the source's, and a relay joining or leaving never makes the agents'
group rebalance (which would close and reopen every table partition).

Each partition is read ahead: the copies not yet due (``x-deliver-at``) wait in a
window in memory (:class:`streamapp.transports.kafka.window.DueWindow`, at most ``WINDOW`` copies
per partition; a full window pauses the partition until copies leave it). Each copy is
republished to its ``x-origin-topic`` when due (:func:`streamapp.failures.retry_chain.republished`:
keyed as before, so it lands on the partition of its key), in due-time order (ties by
offset), so a long back-off never holds a shorter one behind it: a copy can go back
before an earlier-offset copy that is due later. The partition's offset is committed
only up to the lowest copy not yet confirmed by the broker (``acks=all``, idempotent),
never past it. A crash, a stop or a rebalance drops the window; the next reader reads it
again from the committed offset and republishes what was confirmed but not committed:
the relay is at least once (the per-stream version guard skips what an agent applied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from ...errors import SourceError
from ...failures import retry_chain as chain
from ...records import Message
from ...settings.settings import Settings
from .connection import with_startup_retry
from .sink import KafkaSink
from .window import DueWindow

log = logging.getLogger("streamapp.relay")

WINDOW = 10_000
"""Copies read ahead and held per partition before the relay pauses it."""


def relay_group(group_id: str) -> str:
    """The relay's consumer group: the app's group id with ``-relay``."""
    return f"{group_id}-relay"


class KafkaRelay:
    """Republishes due copies of ``topics`` (retry and delay topics) through ``sink``."""

    def __init__(self, settings: Settings, sink: KafkaSink, topics: Sequence[str]) -> None:
        self.settings, self.sink, self.topics = settings, sink, list(topics)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=relay_group(settings.group_id),
            client_id=f"{settings.app_id}-relay",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",  # only copies of committed batches
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
        )
        self.windows: dict[TopicPartition, DueWindow[ConsumerRecord]] = {}
        """Per assigned partition: the copies read and not yet republished."""
        self._full: set[TopicPartition] = set()
        """Partitions paused because their window is full."""
        self._committed: dict[TopicPartition, int] = {}
        """The offset this relay last committed per partition (skip commits that add nothing)."""
        self.relayed = 0
        self._next: dict[TopicPartition, int] = {}
        """Per partition, the relay's position after its last poll (metrics' lag)."""
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        await with_startup_retry(self.settings, "Kafka relay", self._consumer.start)
        self._consumer.subscribe(self.topics, listener=_Listener(self))
        self._task = asyncio.create_task(self._loop(), name="relay")
        log.info("relay started on %s", ", ".join(self.topics))

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()

    async def wait(self) -> None:
        """Until the relay's loop ends (it raises when the consumer fails for good)."""
        if self._task is not None:
            await self._task

    @property
    def held(self) -> int:
        """Copies read and not yet republished, over every partition."""
        return sum(len(w) for w in self.windows.values())

    @property
    def held_copies(self) -> int:
        """:attr:`held`, as the metrics read it (:class:`~streamapp.engine.metrics.RelayGauges`)."""
        return self.held

    async def _loop(self) -> None:
        poll_ms = self.settings.poll_timeout_ms
        while not self._stopping:
            await self._republish_due()
            self._resume_roomy()
            try:
                fetched = await self._consumer.getmany(timeout_ms=self._wait_ms(poll_ms))
            except KafkaError as exc:
                if not exc.retriable:
                    raise SourceError(
                        f"relay consumer (group {relay_group(self.settings.group_id)}, topics "
                        f"{', '.join(self.topics)}) failed: {exc!r}",
                        retriable=False,
                    ) from exc
                log.warning("relay poll failed (%r); polling again", exc)
                await asyncio.sleep(poll_ms / 1000)
                continue
            for tp, records in fetched.items():
                self._read(tp, records)
            await self._positions()

    def _wait_ms(self, poll_ms: int) -> int:
        """Poll until the next copy is due, at most ``poll_ms``."""
        dues = [d for w in self.windows.values() if (d := w.next_due()) is not None]
        if not dues:
            return poll_ms
        return max(0, min(poll_ms, int(min(dues) - time.time() * 1000) + 1))

    async def _positions(self) -> None:
        """Where each partition stands once the poll's copies are read (:meth:`lag`):
        the consumer's position, past transaction markers, at a held copy after a seek."""
        for tp in self._consumer.assignment():
            try:
                self._next[tp] = await self._consumer.position(tp)
            except Exception as exc:  # revoked meanwhile
                log.debug("relay: position of %s: %r", tp, exc)

    def lag(self) -> dict[tuple[str, int], int]:
        """Offsets not republished yet per assigned retry or delay partition: its last
        stable offset minus the relay's position (markers of transactions count too), plus
        the copies read into its window and not yet republished."""
        out: dict[tuple[str, int], int] = {}
        try:
            assigned = self._consumer.assignment()
        except Exception:  # not started or closed
            return out
        for tp in assigned:
            end = self._consumer.last_stable_offset(tp)
            if end is None:
                end = self._consumer.highwater(tp)
            at = self._next.get(tp)
            if end is not None and at is not None:
                window = self.windows.get(tp)
                out[(tp.topic, tp.partition)] = max(0, end - at) + (len(window) if window else 0)
        return out

    def _read(self, tp: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        """Put ``records`` in the partition's window; a full one pauses the partition."""
        if tp not in self._consumer.assignment():  # fetched before a revoke: dropped
            return
        window = self.windows.setdefault(tp, DueWindow(WINDOW))
        for record in records:
            if window.full:  # read again from here once the window has room
                self._quietly(self._consumer.seek, tp, record.offset)
                self._quietly(self._consumer.pause, tp)
                self._full.add(tp)
                return
            if chain.header(record.headers, chain.ORIGIN_TOPIC) is None:
                log.warning(
                    "relay: %s[%d]@%d has no %s header: skipped",
                    tp.topic,
                    tp.partition,
                    record.offset,
                    chain.ORIGIN_TOPIC,
                )
                window.skip(record.offset)
                continue
            window.add(record.offset, chain.due_ms(record.headers) or 0, record)

    def _resume_roomy(self) -> None:
        for tp in list(self._full):
            window = self.windows.get(tp)
            if window is None or not window.full:
                self._full.discard(tp)
                self._quietly(self._consumer.resume, tp)

    async def _republish_due(self) -> None:
        now = time.time() * 1000
        for tp, window in list(self.windows.items()):
            taken = window.take_due(now)
            if taken:
                await self._republish(tp, window, taken)
            await self._commit(tp, window)

    async def _republish(
        self,
        tp: TopicPartition,
        window: DueWindow[ConsumerRecord],
        taken: list[tuple[int, ConsumerRecord]],
    ) -> None:
        messages: list[Message] = []
        for _, record in taken:
            origin = chain.header(record.headers, chain.ORIGIN_TOPIC)
            assert origin is not None  # checked when read
            headers = list(record.headers)
            messages.append(chain.republished(origin.decode(), record.value, record.key, headers))
        try:
            await self.sink.publish_many(messages)
        except Exception as exc:  # again after a poll interval, so a fast failure never spins
            pause_ms = self.settings.poll_timeout_ms
            log.error(
                "relay: republishing %d from %s failed (%r); again in %d ms",
                len(taken),
                tp,
                exc,
                pause_ms,
            )
            window.put_back(taken, int(time.time() * 1000) + pause_ms)
            return
        self.relayed += len(messages)
        window.done(offset for offset, _ in taken)

    async def _commit(self, tp: TopicPartition, window: DueWindow[ConsumerRecord]) -> None:
        """Commit the prefix of copies already republished (never past one that is not)."""
        at = window.commit_at
        if at is None or at <= self._committed.get(tp, -1) or self.windows.get(tp) is not window:
            return
        try:
            await self._consumer.commit({tp: at})
            self._committed[tp] = at
        except KafkaError as exc:  # moved to another relay: it republishes them again
            log.info("relay: commit of %s skipped (%r); at least once", tp, exc)

    def revoked(self, revoked: set[TopicPartition]) -> None:
        """Forget ``revoked`` (the rebalance listener's): their windows, pauses, commits
        and positions; the next owner reads the copies again from the commit."""
        for tp in revoked:
            self.windows.pop(tp, None)
            self._full.discard(tp)
            self._committed.pop(tp, None)
            self._next.pop(tp, None)

    def assigned(self, assigned: set[TopicPartition]) -> None:
        """Keep only what belongs to ``assigned`` (the rebalance listener's)."""
        for tp in list(self.windows):
            if tp not in assigned:
                self.windows.pop(tp, None)
                self._committed.pop(tp, None)
        self._full &= assigned

    def _quietly(self, call: object, *args: object) -> None:
        try:
            call(*args)  # type: ignore[operator]
        except Exception as exc:  # not assigned any more
            log.debug("relay: %r", exc)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Drops the windows on revoke: the next owner reads them again from the commit."""

    def __init__(self, relay: KafkaRelay) -> None:
        self.relay = relay

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.relay.revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.relay.assigned(assigned)
