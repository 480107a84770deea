"""The relay: republishes due retry and delay copies to their origin topics.

One per worker, when the app has retry topics (agents with ``Retry``) or delay topics
(setting ``delayed_policy=relay``). It is a member of its own consumer group,
``{group}-relay``, subscribed to those topics only: the workers share their partitions
as they share the source's, and a relay joining or leaving never makes the agents'
group rebalance (which would close and reopen every table partition).

Per partition, in offset order, a copy whose ``x-deliver-at`` has passed is
republished to its ``x-origin-topic`` (:func:`streamapp.engine.chain.republished`:
keyed as before, so it lands on the partition of its key); the partition's offset is
committed past the due copies only once the broker confirmed them (``acks=all``,
idempotent). At the first copy not yet due the partition seeks back to it and pauses
until then. A crash between the confirm and the commit republishes those copies again:
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

from ..engine import chain
from ..errors import SourceError
from ..settings import Settings
from ..sink import Message
from .retry import with_startup_retry
from .sink import KafkaSink

log = logging.getLogger("streamapp.relay")


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
        self.held: dict[TopicPartition, int] = {}
        """Paused partitions and when their head is due (epoch ms)."""
        self.relayed = 0
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

    async def _loop(self) -> None:
        poll_ms = self.settings.poll_timeout_ms
        while not self._stopping:
            self._resume_due()
            try:
                fetched = await self._consumer.getmany(timeout_ms=poll_ms)
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
                if tp not in self.held:
                    await self._relay(tp, records)

    def _resume_due(self) -> None:
        now = time.time() * 1000
        for tp, due in list(self.held.items()):
            if due <= now:
                del self.held[tp]
                self._quietly(self._consumer.resume, tp)

    async def _relay(self, tp: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        now = time.time() * 1000
        due: list[ConsumerRecord] = []
        for record in records:
            at = chain.due_ms(record.headers) or 0
            if at > now:  # the head is not due: wait for it, later copies behind it
                self._quietly(self._consumer.seek, tp, record.offset)
                self._quietly(self._consumer.pause, tp)
                self.held[tp] = at
                break
            due.append(record)
        if not due:
            return
        messages: list[Message] = []
        for record in due:
            origin = chain.header(record.headers, chain.ORIGIN_TOPIC)
            if origin is None:
                log.warning(
                    "relay: %s[%d]@%d has no %s header: skipped",
                    tp.topic,
                    tp.partition,
                    record.offset,
                    chain.ORIGIN_TOPIC,
                )
                continue
            headers = list(record.headers)
            messages.append(chain.republished(origin.decode(), record.value, record.key, headers))
        try:
            if messages:
                await self.sink.publish_many(messages)
        except Exception as exc:  # held for a poll interval, so a fast failure never spins
            pause_ms = self.settings.poll_timeout_ms
            log.error(
                "relay: republishing %d from %s failed (%r); again in %d ms",
                len(due),
                tp,
                exc,
                pause_ms,
            )
            self._quietly(self._consumer.seek, tp, due[0].offset)
            self._quietly(self._consumer.pause, tp)
            self.held[tp] = int(time.time() * 1000) + pause_ms
            return
        self.relayed += len(messages)
        try:
            await self._consumer.commit({tp: due[-1].offset + 1})
        except KafkaError as exc:  # moved to another relay: it republishes them again
            log.info("relay: commit of %s skipped (%r); at least once", tp, exc)

    def _quietly(self, call: object, *args: object) -> None:
        try:
            call(*args)  # type: ignore[operator]
        except Exception as exc:  # not assigned any more
            log.debug("relay: %r", exc)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Forgets held partitions on revoke (pauses do not survive a rebalance)."""

    def __init__(self, relay: KafkaRelay) -> None:
        self.relay = relay

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self.relay.held.pop(tp, None)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in list(self.relay.held):
            if tp not in assigned:
                del self.relay.held[tp]
