"""One assigned source partition: restore its tables, process batches, flush, settle.

The runner owns the partition between assignment and revocation. The poll loop hands it
records only when it is ready and idle; while it works, the partition is paused in the
consumer, so the loop keeps polling (heartbeats, other partitions) meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ..agent import Agent, BatchResult, run_batch
from ..app import App
from ..settings import Settings
from ..source import Record
from ..tables.changelog import ChangelogWriter
from ..tables.partition import PartitionTables, spaces_for
from ..tables.restore import restore
from ..tables.store import RocksStore
from . import codec
from .sink import KafkaSink

log = logging.getLogger("streamapp.partition")

RESTORING, READY, BUSY, CLOSED = "restoring", "ready", "busy", "closed"


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

    # lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Pause the partition and restore in the background; resume when ready."""
        self.consumer.pause(self.tp)
        self._opening = asyncio.create_task(self._open(), name=f"open {self.name}")

    async def close(self) -> None:
        """Finish the batch in hand (it flushes and commits), then close the store."""
        self.state = CLOSED
        batch = self._batch
        if batch is not None and not batch.done():
            budget = self.settings.rebalance_timeout_ms / 2000
            try:
                await asyncio.wait_for(asyncio.shield(batch), budget)
            except Exception as exc:
                log.warning(
                    "revoked %s: batch did not finish in %.0fs (%r)", self.name, budget, exc
                )
        for task in (self._opening, batch):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._writer is not None:
            await self._writer.stop()
        if self.tables is not None:
            self.tables.store.close()
        log.info("revoked %s at offset %s", self.name, self.next_offset)

    @property
    def accepting(self) -> bool:
        return self.state == READY

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

    def dropped(self) -> None:
        """Records arrived while not accepting: seek to our position before resuming."""
        self._reseek = True

    # restore -----------------------------------------------------------------------
    async def _open(self) -> None:
        try:
            await self._open_tables()
            await self._ready()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: could not open its tables; will retry on next assignment", self.name)

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
        topics = self.app.changelog_topics(agent)
        self._writer = await self._start_writer()
        started = time.monotonic()
        self.restored = await restore(
            self.tables, topics, settings.kafka_bootstrap, label=self.name
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
            self.app.changelog_topics(self.agent),
            self.tp.partition,
            self.settings.publish_timeout_s,
        )
        await writer.start()
        return writer

    async def _ready(self) -> None:
        offset = self.tables.checkpoint.offset if self.tables is not None else None
        if self.tables is not None:
            if offset is None:
                if self.settings.auto_offset_reset == "earliest":
                    await self.consumer.seek_to_beginning(self.tp)
                else:
                    await self.consumer.seek_to_end(self.tp)
                offset = await self.consumer.position(self.tp)
            else:
                self.consumer.seek(self.tp, offset)
                # The store may be ahead of the group (killed between store write and
                # commit): commit what is durable so that lag reads true.
                await self._commit(offset)
        else:
            offset = await self.consumer.position(self.tp)
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
                    self.consumer.seek(self.tp, chunk[result.settled].offset)
                    self._reseek = False
                    if result.redeliver:
                        policy_pause = getattr(self.agent.on_failure, "pause_s", None)
                        pause_s = policy_pause or settings.poll_timeout_ms / 1000
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error(
                "%s: batch failed, rewinding to offset %s: %r", self.name, self.next_offset, exc
            )
            pause_s = settings.poll_timeout_ms / 1000
            try:
                await self._rewind()
            except Exception as again:
                log.error(
                    "%s: rewind failed (%r); the partition stops until reassigned", self.name, again
                )
                self.state = CLOSED
                return
        if pause_s:
            await asyncio.sleep(pause_s)
        if self.state != BUSY:
            return
        if self._reseek and self.next_offset is not None:
            self.consumer.seek(self.tp, self.next_offset)
            self._reseek = False
        self.state = READY
        self.consumer.resume(self.tp)

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

    async def _rewind(self) -> None:
        """After a failed flush: drop the batch, restart the changelog writer, seek back."""
        if self.tables is not None:
            self.tables.take_batch(0)
            assert self._writer is not None
            await self._writer.stop()
            self._writer = await self._start_writer()
        if self.next_offset is not None:
            self.consumer.seek(self.tp, self.next_offset)

    async def _park(self, record: Record, reason: str) -> bool:
        policy = self.agent.on_failure
        destination = getattr(policy, "destination", None)
        if destination is None:
            return False
        headers = [
            *record.headers,
            ("streamapp-park-reason", reason.encode()),
            ("streamapp-agent", self.agent.name.encode()),
            ("streamapp-source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
        ]
        try:
            await self.sink.publish(destination, record.value, key=record.key, headers=headers)
        except Exception as exc:
            log.error(
                "%s: parking offset %d to %s failed: %r", self.name, record.offset, destination, exc
            )
            return False
        log.warning("%s: parked offset %d to %s: %s", self.name, record.offset, destination, reason)
        return True


def _close_when_opened(opening: asyncio.Future[RocksStore]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
