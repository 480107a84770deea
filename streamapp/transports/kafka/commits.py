"""Offset commits of the group member, coalesced: one ``OffsetCommit`` for many partitions.

aiokafka serialises offset commits behind one lock, one request each: with eight
partitions settling at once, the last waited for seven round trips before its own. Here
a partition's settle only records its position; one background commit sends every
position recorded meanwhile, and the next one goes as soon as it returns. Positions of a
partition only move forward (a later settle replaces an earlier one not yet sent).

A settle does not wait for its commit: it is made only once the batch is durable (in the
table's checkpoint, or a transaction), so the task may take its next batch at once. What
a commit that failed or never went out costs is a redelivery: a stateful agent resumes
from its checkpoint and skips it, a stateless one runs it again (at least once).
:meth:`OffsetCommits.flush` waits for what was recorded, before a revoke hands the
partitions on and before the consumer stops.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger("streamapp.kafka")

FLUSH_TIMEOUT_S = 10.0
"""The longest a flush, or one ``OffsetCommit``, may take (the broker may be away)."""


class OffsetCommits:
    """The positions to commit for one consumer, sent together in the background."""

    def __init__(self, consumer: AIOKafkaConsumer, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        self._consumer = consumer
        self.timeout_s = timeout_s
        self._pending: dict[TopicPartition, tuple[int, str]] = {}
        self._latest: dict[TopicPartition, int] = {}
        """The last position recorded per partition (what every commit ends at)."""
        self._in_flight: frozenset[TopicPartition] = frozenset()
        self._sending: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> frozenset[TopicPartition]:
        """Partitions with a position recorded for the next ``OffsetCommit``."""
        return frozenset(self._pending)

    @property
    def in_flight(self) -> frozenset[TopicPartition]:
        """Partitions of the ``OffsetCommit`` under way (sent, not answered yet)."""
        return self._in_flight

    def record(self, tp: TopicPartition, offset: int, metadata: str = "") -> None:
        """Commit ``offset`` of ``tp`` soon (with the next ``OffsetCommit``)."""
        if self._closed:  # the consumer is stopping: the checkpoints hold
            return
        self._pending[tp] = (offset, metadata)
        self._latest[tp] = offset
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send(), name="offset commits")

    async def settled(self, tp: TopicPartition, position: int | None = None) -> None:
        """Until no commit of ``tp`` recorded here is pending or in flight: before an
        offset of ``tp`` goes into a transaction, so that this one cannot land after it.
        At once when that offset is ``position``, the last one recorded: whichever lands
        last, the partition ends at it (a transaction's offset that restates what is
        durable already, :mod:`streamapp.engine.commit`, does not wait for a round trip)."""
        if position is not None and self._latest.get(tp) == position:
            return
        while (tp in self._pending or tp in self._in_flight) and not self._idle():
            await asyncio.shield(self._sending)  # type: ignore[arg-type]

    async def flush(self) -> None:
        """Wait, bounded, until every recorded position was committed (or refused). Past
        the bound, what is left is dropped: no commit may outlive a revoke (aiokafka
        retries one with the group's next generation)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                while not self._idle():
                    await asyncio.shield(self._sending)  # type: ignore[arg-type]
        except TimeoutError:
            log.warning(
                "offset commits not done within %.0fs (%d partitions): dropped, the table "
                "checkpoints hold",
                self.timeout_s,
                len(self._pending) + len(self._in_flight),
            )
            await self._cancel()

    async def close(self) -> None:
        """Flush, then stop sending."""
        await self.flush()
        self._closed = True
        await self._cancel()

    def _idle(self) -> bool:
        return self._sending is None or self._sending.done()

    async def _cancel(self) -> None:
        self._pending = {}
        if not self._idle():
            assert self._sending is not None
            self._sending.cancel()
            await asyncio.gather(self._sending, return_exceptions=True)

    async def _send(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                assigned = self._consumer.assignment()
                batch = {tp: offset for tp, offset in batch.items() if tp in assigned}
                if not batch:  # revoked meanwhile: the next owner starts from checkpoints
                    continue
                self._in_flight = frozenset(batch)
                try:
                    async with asyncio.timeout(self.timeout_s):
                        await self._consumer.commit(batch)
                except Exception as exc:  # not owned any more, the group moved on, stopped
                    log.info(
                        "offset commit of %s skipped (%r); the table checkpoints hold",
                        ", ".join(
                            f"{tp.topic}[{tp.partition}]@{o}" for tp, (o, _) in batch.items()
                        ),
                        exc,
                    )
        finally:
            self._in_flight = frozenset()
