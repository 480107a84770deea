"""One assigned source partition: restore its tables, process batches, flush, settle.

The runner owns the partition between assignment and revocation. The poll loop hands it
records only when it is ready and idle; while it works, the partition is paused in the
consumer, so the loop keeps polling (heartbeats, other partitions) meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, KafkaError, ProducerFenced

from ..agent import Agent, BatchResult, run_batch
from ..app import App
from ..outcomes import Park
from ..settings import Settings
from ..source import Record, park_headers
from ..tables.changelog import ChangelogWriter
from ..tables.partition import PartitionTables, spaces_for
from ..tables.restore import restore
from ..tables.store import RocksStore
from . import codec
from .sink import KafkaSink

log = logging.getLogger("streamapp.partition")

RESTORING, READY, BUSY, CLOSED, LOST = "restoring", "ready", "busy", "closed", "lost"
FENCED = (ProducerFenced, InvalidProducerEpoch)
"""Another worker's changelog writer took over: this worker no longer owns the partition."""
RETRY_MIN_S, RETRY_MAX_S = 0.5, 10.0


class PartitionRunner:
    """Processes one partition of one agent's source topic."""

    def __init__(
        self,
        app: App,
        agent: Agent,
        tp: TopicPartition,
        consumer: AIOKafkaConsumer,
        sink: KafkaSink,
        settings: Settings,
    ) -> None:
        self.app, self.agent, self.tp = app, agent, tp
        self.consumer, self.sink, self.settings = consumer, sink, settings
        self.name = f"{tp.topic}[{tp.partition}]"
        self.state = RESTORING
        self.tables: PartitionTables | None = None
        self.next_offset: int | None = None
        self.start_offset: int | None = None
        self.processed = 0
        self.restored = 0
        self._writer: ChangelogWriter | None = None
        self._opening: asyncio.Task[None] | None = None
        self._batch: asyncio.Task[None] | None = None
        self._reseek = False
        self._closing = asyncio.Event()
        self._changelogs = app.changelog_topics(agent)

    # lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Pause the partition and restore in the background; resume when ready."""
        self.consumer.pause(self.tp)
        self._opening = asyncio.create_task(self._open(), name=f"open {self.name}")

    async def close(self) -> None:
        """Finish the batch in hand (it flushes and commits), then close the store."""
        self.state = CLOSED
        self._closing.set()  # ends a redelivery pause and stops between chunks
        batch = self._batch
        if batch is not None and not batch.done():
            budget = self.settings.rebalance_timeout_ms / 2000
            try:
                await asyncio.wait_for(asyncio.shield(batch), budget)
            except Exception as exc:
                log.warning(
                    "revoked %s: batch did not finish in %.0fs (setting rebalance_timeout_ms): %r",
                    self.name,
                    budget,
                    exc,
                )
        for task in (self._opening, batch):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._release_resources()
        log.info("revoked %s at offset %s", self.name, self.next_offset)

    async def _release_resources(self) -> None:
        """Stop the changelog writer and close the store, whatever fails on the way."""
        writer, self._writer = self._writer, None
        tables, self.tables = self.tables, None
        try:
            if writer is not None:
                await writer.stop()
        except Exception as exc:
            log.warning("%s: stopping the changelog writer failed: %r", self.name, exc)
        finally:
            if tables is not None:
                tables.store.close()

    def feed(self, records: list[Record]) -> None:
        """Take fetched records: process them in the background with the partition paused."""
        start = self.next_offset or 0
        recs: list[Record] = records
        if records and records[0].offset < start:  # already applied (a seek raced)
            recs = [r for r in records if r.offset >= start]
        if not recs:
            return
        self.state = BUSY
        self.consumer.pause(self.tp)
        self._batch = asyncio.create_task(self._process(recs), name=f"batch {self.name}")
        self._batch.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: batch task died: %r", self.name, task.exception())
            self.state = LOST

    def dropped(self) -> None:
        """Records arrived while not accepting: seek to our position before resuming."""
        self._reseek = True

    # restore -----------------------------------------------------------------------
    async def _open(self) -> None:
        """Open, restore and get ready, retrying with back-off: a partition is never left
        paused without an owner task (a lock still held, a broker hiccup, a slow restore)."""
        delay = RETRY_MIN_S
        while self.state == RESTORING:
            try:
                await self._open_tables()
                await self._ready()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error(
                    "%s: opening its tables failed (%r); retrying in %.1fs", self.name, exc, delay
                )
                await self._release_resources()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _open_tables(self) -> None:
        agent, settings = self.agent, self.settings
        if not agent.tables:
            return
        path = Path(settings.data_dir) / self.app.id / agent.name / str(self.tp.partition)
        opening = asyncio.ensure_future(
            asyncio.to_thread(
                RocksStore,
                path,
                spaces_for(agent.tables),
                open_timeout_s=settings.store_open_timeout_s,
            )
        )
        try:  # the open may wait for a previous owner's lock: off the loop
            store = await asyncio.shield(opening)
        except asyncio.CancelledError:  # revoked meanwhile: close it once it is open
            opening.add_done_callback(_close_when_opened)
            raise
        self.tables = PartitionTables(agent.tables, store, self.tp.partition)
        self._writer = await self._start_writer()
        started = time.monotonic()
        self.restored = await restore(
            self.tables,
            self._changelogs,
            settings.kafka_bootstrap,
            label=self.name,
            stall_timeout_s=settings.restore_stall_timeout_s,
        )
        if self.restored:
            log.info(
                "restored %s: %d changelog records in %.2fs",
                self.name,
                self.restored,
                time.monotonic() - started,
            )

    async def _start_writer(self) -> ChangelogWriter:
        """A changelog writer whose transactional id is stable per (app, agent, partition):
        starting it fences the partition's previous owner and aborts its open batch."""
        writer = ChangelogWriter(
            self.settings.kafka_bootstrap,
            f"{self.app.id}-{self.agent.name}-{self.tp.partition}",
            self._changelogs,
            self.tp.partition,
            self.settings.publish_timeout_s,
        )
        try:
            await writer.start()
        except BaseException:
            await writer.stop()
            raise
        return writer

    async def _ready(self) -> None:
        """Seek to where this partition's state stands, then resume it."""
        if self.tables is None:  # no state: the group's committed offset decides
            offset = await self.consumer.position(self.tp)
        elif (checkpoint := self.tables.checkpoint.offset) is not None:
            offset = checkpoint
            self.consumer.seek(self.tp, offset)
            # The store may be ahead of the group (killed between store write and
            # commit): commit what is durable so that lag reads true.
            await self._commit(offset)
        else:  # a new table: built from the topic, not from the group offset
            reset = self.settings.auto_offset_reset
            if reset == "earliest":
                await self.consumer.seek_to_beginning(self.tp)
            else:
                await self.consumer.seek_to_end(self.tp)
            offset = await self.consumer.position(self.tp)
            log.info("%s has no checkpoint: starts at the %s offset", self.name, reset)
        self.next_offset = self.start_offset = offset
        self._reseek = False
        self.state = READY
        self.consumer.resume(self.tp)
        log.info("ready %s at offset %d", self.name, offset)

    # processing --------------------------------------------------------------------
    async def _process(self, records: list[Record]) -> None:
        settings = self.settings
        pause_s = 0.0
        try:
            size = settings.max_batch_records
            for i in range(0, len(records), size):
                if self.state != BUSY:  # revoked: the next owner starts at our checkpoint
                    return
                chunk = records[i : i + size]
                result = await run_batch(
                    self.agent,
                    chunk,
                    self.tables,
                    codec.decode,
                    self._park,
                    settings.batch_budget_ms / 1000,
                )
                await self._settle(chunk, result)
                if result.settled < len(chunk):
                    self._seek(chunk[result.settled].offset)
                    if result.redeliver:
                        policy_pause = getattr(self.agent.on_failure, "pause_s", None)
                        pause_s = policy_pause or settings.poll_timeout_ms / 1000
                    break
        except FENCED as exc:
            self.state = LOST
            log.error(
                "%s: another worker's changelog writer fenced ours (%r): this worker no "
                "longer owns the partition; it stays paused until the group revokes it",
                self.name,
                exc,
            )
            return
        except Exception as exc:
            log.error(
                "%s: batch failed, rewinding to offset %s: %r", self.name, self.next_offset, exc
            )
            if not await self._rewind():
                return
            pause_s = settings.poll_timeout_ms / 1000
        if pause_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), pause_s)
        if self.state != BUSY:
            return
        if self._reseek and self.next_offset is not None:
            self._seek(self.next_offset)
        self.state = READY
        self.consumer.resume(self.tp)

    def _seek(self, offset: int) -> None:
        self.consumer.seek(self.tp, offset)
        self._reseek = False

    async def _settle(self, chunk: list[Record], result: BatchResult) -> None:
        """Flush the settled prefix: changelog, then store, then the consumer offset."""
        if result.settled == 0:
            if self.tables is not None:
                self.tables.take_batch(chunk[0].offset)  # drop a failed event's leftovers
            return
        next_offset = chunk[result.settled - 1].offset + 1
        tables = self.tables
        if tables is not None:
            assert self._writer is not None
            batch = tables.take_batch(next_offset)
            positions = await self._writer.write(batch)
            checkpoint = tables.checkpoint.advanced(next_offset, positions)
            # Synchronous on purpose: rocksdict holds the GIL while writing, so a thread
            # would not free the loop, and a write must never race the store's close.
            tables.write(batch, checkpoint)
        self.next_offset = next_offset
        self.processed += result.settled
        await self._commit(next_offset)

    async def _commit(self, offset: int) -> None:
        try:
            await self.consumer.commit({self.tp: offset})
        except KafkaError as exc:  # not owned any more, or the group moved on
            log.info(
                "%s: offset commit %d skipped (%r); the table checkpoint holds",
                self.name,
                offset,
                exc,
            )

    async def _rewind(self) -> bool:
        """After a failed flush: drop the batch, restart the changelog writer (a failed
        transaction leaves it unusable), seek back to the checkpoint. Retries with
        back-off while the partition is ours; False once it is not."""
        delay = RETRY_MIN_S
        while self.state == BUSY:
            try:
                if self.tables is not None:
                    self.tables.take_batch(0)
                    writer, self._writer = self._writer, None
                    if writer is not None:
                        await writer.stop()
                    self._writer = await self._start_writer()
                if self.next_offset is not None:
                    self._seek(self.next_offset)
                return True
            except Exception as exc:
                log.error("%s: rewind failed (%r); retrying in %.1fs", self.name, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)
                delay = min(delay * 2, RETRY_MAX_S)
        return False

    async def _park(self, record: Record, reason: str) -> bool:
        """Publish the record to the agent's parking topic; True once confirmed."""
        policy = self.agent.on_failure
        assert isinstance(policy, Park)  # run_batch parks only under a Park policy
        headers = park_headers(record, reason, self.agent.name)
        try:
            await self.sink.publish(
                policy.destination, record.value, key=record.key, headers=headers
            )
        except Exception as exc:
            log.error("%s: parking offset %d failed: %s", self.name, record.offset, exc)
            return False
        log.warning(
            "%s: parked offset %d to %s: %s", self.name, record.offset, policy.destination, reason
        )
        return True


def _close_when_opened(opening: asyncio.Future[RocksStore]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
