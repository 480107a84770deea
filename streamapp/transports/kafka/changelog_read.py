"""Reading one changelog partition for a restore: committed record batches, no object
per record beyond the client's own.

A consumer's ``getmany`` builds a ``ConsumerRecord`` (a Python dataclass, with its key
and value sizes and a headers tuple) for every record: measured over a restore, that was
most of its time. A restore needs only each record's offset, key and value, so
:class:`CommittedReader` sends the fetch itself, over the restore consumer's own client
and connections, and hands back aiokafka's record batches as they are parsed (in C), for
:meth:`~streamapp.tables.changelog.RestoreChunk.apply_records` to read in one loop.

``read_committed`` is kept as the consumer keeps it: the fetch asks the broker for
committed data only (isolation level 1: nothing past the last stable offset) and the
batches of aborted transactions are left out with the broker's list of aborted
transactions, by the rule of aiokafka's ``PartitionRecords`` (``consumer/fetcher.py``),
written here per batch (:func:`committed_batches`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords

from ...errors import SourceError

log = logging.getLogger("streamapp.partition")

READ_COMMITTED = 1
"""The fetch's isolation level: committed data only (below the last stable offset)."""
FETCH_WAIT_MS = 500
"""How long the broker may hold a fetch that finds nothing yet."""
PARTITION_FETCH_BYTES = 4 * 1024 * 1024
"""Bytes one fetch returns at most (the consumer's default is 1 MB): a changelog of
small records is read in few round trips. A record batch larger than this still comes
whole (the broker returns at least one batch)."""
RETRY_S = 0.1
"""The pause before a fetch is sent again after a retriable error."""


class Batch(Protocol):
    """What this module reads of an aiokafka record batch."""

    @property
    def base_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def producer_id(self) -> int | None: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control_batch(self) -> bool: ...
    def __iter__(self) -> Iterator[Any]: ...


def committed_batches(
    batches: Iterable[Batch], aborted: Iterable[tuple[int, int]]
) -> Iterator[tuple[Batch | None, int]]:
    """The batches of a ``read_committed`` fetch to apply, each with the offset after it.

    ``aborted`` is the broker's list of aborted transactions in the fetched range, as
    ``(producer_id, first_offset)``. A transactional batch of a producer whose aborted
    transaction began at or before it is left out, until that producer's abort marker
    (a control batch) ends the transaction; control batches are left out. A batch left
    out is yielded as ``(None, next_offset)``: the position still moves past it."""
    pending = sorted(aborted, key=lambda pair: pair[1])
    producers: set[int] = set()
    for batch in batches:
        producer = batch.producer_id
        if producer is not None:
            while pending and pending[0][1] <= batch.base_offset:
                producers.add(pending.pop(0)[0])
            if batch.is_control_batch and _is_abort_marker(batch):
                producers.discard(producer)
            if batch.is_transactional and producer in producers:
                yield None, batch.next_offset
                continue
        if batch.is_control_batch:
            yield None, batch.next_offset
            continue
        yield batch, batch.next_offset


def _is_abort_marker(batch: Batch) -> bool:
    for record in batch:
        return bool(ControlRecord.parse(record.key) == ABORT_MARKER)
    raise SourceError("a changelog control batch holds no record")


class CommittedReader:
    """Fetches committed record batches of one partition over ``consumer``'s client.

    The consumer keeps ``tp`` assigned and paused (its own fetcher then leaves it alone);
    this reader's position is its own."""

    def __init__(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, max_bytes: int | None = None
    ) -> None:
        self._consumer, self.tp = consumer, tp
        self._max_bytes = PARTITION_FETCH_BYTES if max_bytes is None else max_bytes
        self._client: Any = consumer._client  # the consumer's connections and metadata

    async def fetch(self, offset: int) -> tuple[list[tuple[Batch, int]], int]:
        """The committed batches from ``offset``, each with the offset after it (the
        first may begin below ``offset``: skip those records), and the offset to fetch
        next (past the batches left out too). Nothing new: ``([], offset)``
        after the broker's wait; a retriable error is retried once after a pause and
        then also returns ``([], offset)`` (the caller's stall bound decides)."""
        tp = self.tp
        node = self._client.cluster.leader_for_partition(tp)
        if node is None or node == -1:
            await self._client.force_metadata_update()
            return [], offset
        request = FetchRequest(
            FETCH_WAIT_MS,
            1,
            self._max_bytes,
            READ_COMMITTED,
            [(tp.topic, [(tp.partition, offset, self._max_bytes)])],
        )
        try:
            response = await self._client.send(node, request)
        except kafka_errors.KafkaError as exc:
            if not exc.retriable:
                raise
            log.debug("fetching %s failed (%r); fetching again", tp, exc)
            await asyncio.sleep(RETRY_S)
            return [], offset
        if response.API_VERSION < 4:
            raise SourceError(
                f"the broker answered a fetch of {tp.topic}[{tp.partition}] with version "
                f"{response.API_VERSION}, which cannot read committed data only (needs 4+)"
            )
        for _, partitions in response.topics:
            for _, code, _, *data in partitions:
                error = kafka_errors.for_code(code)
                if error is not kafka_errors.NoError:
                    return await self._failed(error, offset)
                aborted = data[1] if response.API_VERSION == 4 else data[2]
                return self._batches(MemoryRecords(data[-1] or b""), aborted or (), offset)
        return [], offset

    def _batches(
        self, records: MemoryRecords, aborted: Iterable[tuple[int, int]], offset: int
    ) -> tuple[list[tuple[Batch, int]], int]:
        raw: list[Batch] = []
        while records.has_next():
            batch = records.next_batch()
            if not batch.validate_crc():
                raise SourceError(f"changelog {self.tp.topic}[{self.tp.partition}]: invalid CRC")
            raw.append(batch)
        if not raw and records.size_in_bytes() > 0:
            raise SourceError(
                f"changelog {self.tp.topic}[{self.tp.partition}]: a record batch at offset "
                f"{offset} is larger than the fetch size {self._max_bytes}"
            )
        out: list[tuple[Batch, int]] = []
        for batch, after in committed_batches(raw, aborted):
            if batch is not None:
                out.append((batch, after))
            offset = max(offset, after)
        return out, offset

    async def _failed(
        self, error: type[Exception], offset: int
    ) -> tuple[list[tuple[Batch, int]], int]:
        tp = self.tp
        if error in (
            kafka_errors.NotLeaderForPartitionError,
            kafka_errors.UnknownTopicOrPartitionError,
        ):
            await self._client.force_metadata_update()
            return [], offset
        if error is kafka_errors.OffsetOutOfRangeError:
            # As the consumer did (auto_offset_reset="earliest"): from the first offset.
            first = (await self._consumer.beginning_offsets([tp]))[tp]
            log.info("%s: offset %d is out of range; restoring from %d", tp, offset, first)
            return [], first
        if getattr(error, "retriable", False):
            await asyncio.sleep(RETRY_S)
            return [], offset
        raise error()
