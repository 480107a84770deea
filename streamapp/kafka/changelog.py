"""The Kafka changelog of one partition: transactional writes, read_committed restore.

Format and the reasons for transactions: :mod:`streamapp.tables.changelog`. The
``transactional_id`` is stable per (app, agent, partition), so a new owner's
``init_transactions`` fences the previous owner and aborts its open batch; a fenced
writer raises :class:`~streamapp.errors.FencedError`.

Restore reads the changelog partition from the store's recorded position to the end
with ``read_committed`` (aborted batches are invisible), in chunks, each one atomic
store write with the new position. A store whose last write is older than the topic's
``delete.retention.ms`` is wiped and restored in full: compaction may have dropped
tombstones it never saw (the Kafka Streams rule).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, KafkaError, ProducerFenced

from ..errors import FencedError, PublishError, SourceError
from ..tables.changelog import RestoreChunk, records
from ..tables.checkpoint import Checkpoint
from ..tables.partition import BatchChanges, PartitionTables
from .sink import producer_config

log = logging.getLogger("streamapp.partition")

CHUNK = 5000
FENCED = (ProducerFenced, InvalidProducerEpoch)


class KafkaChangelog:
    """One partition's changelog writer and restorer."""

    def __init__(
        self,
        bootstrap: str,
        transactional_id: str,
        topic: str,
        partition: int,
        *,
        timeout_s: float,
        stall_timeout_s: float,
        retention_ms: int | None,
    ) -> None:
        self.bootstrap, self.transactional_id = bootstrap, transactional_id
        self.topic, self.partition = topic, partition
        self.timeout_s, self.stall_timeout_s = timeout_s, stall_timeout_s
        self.retention_ms = retention_ms
        """The topic's ``delete.retention.ms`` (None: unknown, no stale-store rule)."""
        self._producer: AIOKafkaProducer | None = None
        self._where = f"{topic}[{partition}]"

    async def open(self, tables: PartitionTables) -> int:
        await self._start_writer()
        if self._stale(tables.checkpoint):
            log.warning(
                "%s: the local store was last written %.0fs ago, longer than "
                "delete.retention.ms of %s (%.0fs): compaction may have dropped deletes it "
                "never saw, so it is wiped and restored in full",
                self._where,
                (time.time() * 1000 - tables.checkpoint.written_ms) / 1000,
                self.topic,
                (self.retention_ms or 0) / 1000,
            )
            tables.store.wipe()
            tables.checkpoint = Checkpoint()
        return await self._restore(tables)

    async def write(self, batch: BatchChanges) -> int:
        try:
            return await asyncio.wait_for(self._write(batch), self.timeout_s)
        except FENCED as exc:
            raise FencedError(
                f"changelog writer {self.transactional_id} of {self._where} was fenced by "
                "another worker that took the partition over"
            ) from exc
        except TimeoutError:
            raise PublishError(
                f"changelog transaction of {self.transactional_id} to {self._where} not "
                f"committed within {self.timeout_s:.0f}s (setting publish_timeout_s)"
            ) from None
        except KafkaError as exc:
            raise PublishError(f"changelog transaction to {self._where} failed: {exc!r}") from exc

    async def reset(self) -> None:
        await self.close()
        await self._start_writer()

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def _start_writer(self) -> None:
        """Start the producer; this fences any previous owner of the partition."""
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **producer_config({"transactional_id": self.transactional_id, "linger_ms": 5}),
        )
        try:
            await asyncio.wait_for(producer.start(), self.timeout_s)
        except BaseException as exc:
            await producer.stop()
            if isinstance(exc, TimeoutError):
                raise PublishError(
                    f"changelog writer {self.transactional_id} did not start within "
                    f"{self.timeout_s:.0f}s (setting publish_timeout_s)"
                ) from None
            if isinstance(exc, KafkaError):
                raise SourceError(f"changelog writer {self.transactional_id}: {exc!r}") from exc
            raise
        self._producer = producer

    async def _write(self, batch: BatchChanges) -> int:
        producer = self._producer
        if producer is None:
            raise PublishError(f"changelog writer of {self._where} is closed")
        await producer.begin_transaction()
        try:
            last = None
            for key, value in records(batch):
                last = await producer.send(self.topic, value, key=key, partition=self.partition)
            await producer.commit_transaction()
        except BaseException:
            await _abort(producer)
            raise
        assert last is not None  # records() always ends with the checkpoint
        return int((await last).offset) + 1

    def _stale(self, cp: Checkpoint) -> bool:
        if self.retention_ms is None or not cp.written_ms or not cp.changelog:
            return False
        return time.time() * 1000 - cp.written_ms > self.retention_ms

    async def _restore(self, tables: PartitionTables) -> int:
        tp = TopicPartition(self.topic, self.partition)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )
        try:
            await consumer.start()
            consumer.assign([tp])
            start = tables.checkpoint.changelog
            consumer.seek(tp, start)
            end = (await consumer.end_offsets([tp]))[tp]
            if start >= end:
                return 0
            log.info("restoring %s: up to %d changelog records", self._where, end - start)
            applied, last_progress = 0, time.monotonic()
            position = start
            while position < end:
                fetched = await consumer.getmany(tp, timeout_ms=500, max_records=CHUNK)
                chunk = RestoreChunk(tables)
                for rec in fetched.get(tp, ()):
                    chunk.apply(rec.key, rec.value)
                    applied += 1
                position = await consumer.position(tp)
                chunk.write(tables, position)  # holds the GIL anyway; never races close()
                if chunk.skipped:
                    log.warning(
                        "%s: %d records of unknown tables skipped", self._where, chunk.skipped
                    )
                if fetched:
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > self.stall_timeout_s:
                    raise SourceError(
                        f"restore of {self._where} made no progress for "
                        f"{self.stall_timeout_s:.0f}s (setting restore_stall_timeout_s)"
                    )
            return applied
        except KafkaError as exc:
            raise SourceError(f"restore of {self._where} failed: {exc!r}") from exc
        finally:
            await consumer.stop()


async def _abort(producer: AIOKafkaProducer) -> None:
    try:
        await producer.abort_transaction()
    except Exception as exc:  # the producer may be fenced or stopped already
        log.debug("abort of changelog transaction failed: %r", exc)
