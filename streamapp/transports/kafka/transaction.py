"""One Kafka partition task's transaction: changelogs, derived events and offsets at once.

Every commit of a partition task is one Kafka transaction of one transactional producer
(:class:`KafkaTransaction`): the changelog records of every agent of the topic (each to
its own changelog topic, same partition number), every derived event the batch sent,
and, when an agent of the topic has no tables (no checkpoint to resume from), the source
offset with ``send_offsets_to_transaction`` (its metadata names the agents that are
ahead of it, :mod:`streamapp.engine.lane`). With tables only, the offset is committed
after the store write instead: two round trips fewer per transaction. A ``read_committed`` reader
sees all of it or nothing: after a ``kill -9`` the open transaction is aborted, the
batch runs again, and its derived events appear once.

The ``transactional_id`` is stable per (app, source topic, partition), so a new owner's
``init_transactions`` fences the previous owner and aborts its open batch; a fenced
writer raises :class:`~streamapp.errors.FencedError`. ``TxnOffsetCommit`` carries no
group generation (aiokafka sends v0, no KIP-447 fencing): the stable id is the fence.

Restore (:func:`restore`) reads one agent's changelog partition from its store's
recorded position to the end with ``read_committed`` (aborted batches are invisible; the
fetch is its own, :mod:`~streamapp.transports.kafka.changelog_read`, record batches with no object
per record), in chunks, each one atomic store write with the new position. First the
store's lineage is checked (:mod:`streamapp.transports.kafka.lineage`): a store that is not of this
changelog (deleted and made again since) is wiped and restored in full. A store whose last write is
older than the topic's ``delete.retention.ms`` is wiped and restored in full: compaction
may have dropped tombstones it never saw (the Kafka Streams rule). Format and the
reasons for transactions: :mod:`streamapp.tables.changelog`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, KafkaError, ProducerFenced

from ...agents.agent import Agent
from ...engine.interfaces import Committed
from ...errors import FencedError, PublishError, SourceError
from ...records import Message
from ...tables.changelog import RestoreChunk, records
from ...tables.partition import BatchChanges, PartitionTables
from .changelog_read import CommittedReader
from .lineage import mismatch
from .port import offset_metadata
from .sink import producer_config

log = logging.getLogger("streamapp.partition")

FENCED = (ProducerFenced, InvalidProducerEpoch)


class KafkaTransaction:
    """The transactional writer and the changelog restorer of one partition task."""

    def __init__(
        self,
        bootstrap: str,
        transactional_id: str,
        source: TopicPartition,
        group_id: str,
        changelog: Callable[[Agent], str | None],
        *,
        timeout_s: float,
        stall_timeout_s: float,
        retention_ms: Mapping[str, int],
        assigned: Callable[[], bool] = lambda: True,
        unconfirmed: Callable[[], str | None] = lambda: None,
        settled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.bootstrap, self.transactional_id = bootstrap, transactional_id
        self._assigned = assigned
        self._unconfirmed = unconfirmed
        """Why the group has not confirmed this worker's ownership lately (None: the
        owner's lease holds, :mod:`streamapp.transports.kafka.lease`)."""
        self._settled = settled
        """Until the source partition's offset commits made outside a transaction are
        done: a transaction's offset must land after them, never before."""
        """True while the group still assigns the source partition to this worker."""
        self.source, self.group_id, self._changelog = source, group_id, changelog
        self.timeout_s, self.stall_timeout_s = timeout_s, stall_timeout_s
        self.retention_ms = retention_ms
        """Each changelog topic's ``delete.retention.ms`` (absent: no stale-store rule)."""
        self._producer: AIOKafkaProducer | None = None
        self._abandoned: set[asyncio.Task[None]] = set()
        """Stops of writers that did not start in time, each run once its start ended."""
        self._where = f"{source.topic}[{source.partition}]"

    async def open(self) -> None:
        await self._start_writer()

    async def restore(self, agent: Agent, tables: PartitionTables) -> int:
        topic = self._topic(agent)
        retention = self.retention_ms.get(topic)

        def stale() -> bool:
            """The store missed changelog records and was last written longer ago than
            ``delete.retention.ms``: compaction may have dropped deletes it never saw."""
            cp = tables.checkpoint
            if retention is None or not cp.written_ms or not cp.changelog:
                return False
            idle_ms = time.time() * 1000 - cp.written_ms
            if idle_ms <= retention:
                return False
            log.warning(
                "%s: the local store of agent %s was last written %.0fs ago, longer than "
                "delete.retention.ms of %s (%.0fs), and the changelog moved on since: "
                "compaction may have dropped deletes it never saw, so it is wiped and "
                "restored in full",
                self._where,
                agent.name,
                idle_ms / 1000,
                topic,
                retention / 1000,
            )
            return True

        return await restore(
            self.bootstrap,
            TopicPartition(topic, self.source.partition),
            tables,
            self.stall_timeout_s,
            stale,
        )

    async def commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        try:
            return await asyncio.wait_for(self._commit(changes, outputs, settle), self.timeout_s)
        except FENCED as exc:
            raise FencedError(
                f"transactional writer {self.transactional_id} of {self._where} was fenced by "
                "another worker that took the partition over"
            ) from exc
        except TimeoutError:
            raise PublishError(
                f"transaction of {self.transactional_id} ({self._where}) not committed "
                f"within {self.timeout_s:g}s (setting transaction_timeout_s)"
            ) from None
        except KafkaError as exc:
            raise PublishError(f"transaction of {self._where} failed: {exc!r}") from exc

    async def reset(self) -> None:
        await self.close()
        await self._start_writer()

    async def close(self) -> None:
        if self._abandoned:
            await asyncio.wait(set(self._abandoned))
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.stop(), ABORT_TIMEOUT_S)
            except TimeoutError:
                log.warning(
                    "%s: transactional writer %s did not stop within %.0fs (broker away?); "
                    "left behind, the next writer fences it",
                    self._where,
                    self.transactional_id,
                    ABORT_TIMEOUT_S,
                )

    def _topic(self, agent: Agent) -> str:
        topic = self._changelog(agent)
        if topic is None:
            raise SourceError(f"agent {agent.name!r} has no changelog topic (no tables)")
        return topic

    async def _start_writer(self) -> None:
        """Start the producer; this fences any previous owner of the partition, so only
        while the group assigns the partition here and has confirmed it lately (the
        owner's lease): a worker cut off from the group, whose consumer still holds the
        assignment it had, must not fence the worker that took the partition over when
        its network comes back, before its consumer learns it left the group."""
        if not self._assigned():
            raise FencedError(
                f"{self._where} is no longer assigned to this worker: its transactional "
                f"writer {self.transactional_id} is not started again"
            )
        why = self._unconfirmed()
        if why is not None:
            raise PublishError(
                f"{self._where}: {why}; its transactional writer {self.transactional_id} is "
                "not started until the group confirms this worker's ownership again "
                "(setting owner_lease_s)"
            )
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **producer_config(
                {
                    "transactional_id": self.transactional_id,
                    # No linger: changelog records go out as whole batches already, and
                    # a lingering batch holds up the transaction (its commit waits).
                    "linger_ms": 0,
                    "max_batch_size": BATCH_BYTES,
                }
            ),
        )
        # Never cancelled mid-start: aiokafka's bootstrap drops a connection it was
        # reading metadata on when cancelled there (its reader task left running). A
        # start past the deadline is left to end, then stopped (:meth:`close` waits).
        start = asyncio.ensure_future(producer.start())
        try:
            await asyncio.wait({start}, timeout=self.timeout_s)
        except BaseException:
            self._abandon(producer, start)
            raise
        if not start.done():
            self._abandon(producer, start)
            raise PublishError(
                f"transactional writer {self.transactional_id} did not start within "
                f"{self.timeout_s:g}s (setting transaction_timeout_s)"
            )
        exc = start.exception()
        if exc is not None:
            await producer.stop()
            if isinstance(exc, KafkaError):
                raise SourceError(f"transactional writer {self.transactional_id}: {exc!r}") from exc
            raise exc
        self._producer = producer

    def _abandon(self, producer: AIOKafkaProducer, start: asyncio.Future[None]) -> None:
        """Stop ``producer`` once its ``start`` ends (bounded by ``ABORT_TIMEOUT_S``)."""

        async def stop() -> None:
            await asyncio.wait({start}, timeout=ABORT_TIMEOUT_S)
            if not start.done():
                start.cancel()  # the broker is away: aiokafka may leave a connection
            elif not start.cancelled():
                start.exception()  # seen: the caller was told already
            try:
                await asyncio.wait_for(producer.stop(), ABORT_TIMEOUT_S)
            except TimeoutError:
                log.warning(
                    "%s: transactional writer %s that did not start in time did not stop "
                    "within %.0fs either (broker away?)",
                    self._where,
                    self.transactional_id,
                    ABORT_TIMEOUT_S,
                )

        task = asyncio.create_task(stop(), name=f"stop {self.transactional_id}")
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    async def _commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        producer = self._producer
        if producer is None:
            raise PublishError(f"transactional writer of {self._where} is closed")
        p = self.source.partition
        if settle is not None and self._settled is not None:
            await self._settled()
        await producer.begin_transaction()
        sent: list[asyncio.Future[Any]] = []
        """Every send's future: each is retrieved, whatever happens (a fenced writer's
        would each print "Future exception was never retrieved")."""
        try:
            lasts = [
                await _send_records(producer, self._topic(agent), p, records(batch), sent)
                for agent, batch in changes
            ]
            for m in outputs:
                future = await producer.send(
                    m.topic, m.value, key=m.key, headers=list(m.headers), partition=m.partition
                )
                sent.append(future)
            if settle is not None:
                offset = (settle.position, offset_metadata(settle.ahead))
                await producer.send_offsets_to_transaction({self.source: offset}, self.group_id)
            await producer.commit_transaction()
        except BaseException:
            await _abort(producer)
            raise
        finally:
            _retrieve(sent)
        return [int((await last).offset) + count for last, count in lasts]


def _retrieve(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Mark each future's outcome as seen, now or when it ends: the transaction's commit
    or its failure is what reports them."""
    for future in futures:
        if future.done():
            _seen(future)
        else:
            future.add_done_callback(_seen)


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


BATCH_BYTES = 512 * 1024
"""The transactional writer's batch size: a batch's changelog records go out in few
record batches (the broker takes up to 1 MB a batch by default)."""


async def _send_records(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    items: Iterable[tuple[bytes, bytes | None]],
    sent: list[asyncio.Future[Any]],
) -> tuple[asyncio.Future[Any], int]:
    """Send ``items`` to ``topic``'s ``partition`` as whole record batches (one append
    each, no coroutine per record: a batch of a 10,000-key workload writes thousands).
    Returns the last batch's future (its base offset) and its record count; every
    batch's future is added to ``sent``."""
    builder = producer.create_batch()
    count = 0
    last: tuple[asyncio.Future[Any], int] | None = None
    for key, value in items:
        if builder.append(key=key, value=value, timestamp=None) is None:  # full
            last = (await producer.send_batch(builder, topic, partition=partition), count)
            sent.append(last[0])
            builder, count = producer.create_batch(), 0
            if builder.append(key=key, value=value, timestamp=None) is None:
                raise PublishError(
                    f"a changelog record of {len(value or b'')} bytes for {topic}[{partition}] "
                    f"does not fit a record batch of {BATCH_BYTES} bytes"
                )
        count += 1
    if count:
        last = (await producer.send_batch(builder, topic, partition=partition), count)
        sent.append(last[0])
    assert last is not None  # records() always ends with the checkpoint
    return last


async def restore(
    bootstrap: str,
    tp: TopicPartition,
    tables: PartitionTables,
    stall_timeout_s: float,
    stale: Callable[[], bool] = lambda: False,
) -> int:
    """Apply ``tp`` from the store's recorded changelog position to its end (committed
    batches only); returns the records applied. A store that is not of this changelog
    (its lineage, :func:`~streamapp.transports.kafka.lineage.mismatch`) is wiped and restored in
    full. When the changelog holds more than the store saw and ``stale()`` says the
    store is too old to catch up, it is wiped and restored in full too. An idle store at
    the changelog's end is kept: a rebalance that hands it back costs no restore."""
    where = f"{tp.topic}[{tp.partition}]"
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    try:
        await consumer.start()
        consumer.assign([tp])
        consumer.pause(tp)  # read by the CommittedReader (the lineage check resumes it)
        end = (await consumer.end_offsets([tp]))[tp]
        why = await mismatch(consumer, tp, tables.checkpoint, end, stall_timeout_s)
        if why is not None:
            log.warning(
                "the local store %s is not of changelog %s: %s. It is wiped and restored "
                "in full from the changelog",
                getattr(tables.store, "path", "(in memory)"),
                where,
                why,
            )
            tables.wipe()
        start = tables.checkpoint.changelog
        if start >= end - 1:  # at the end, or before the last transaction's commit marker
            return 0
        if stale():
            tables.wipe()
            start = 0
        reader = CommittedReader(consumer, tp)
        log.info("restoring %s: up to %d changelog records", where, end - start)
        applied, last_progress = 0, time.monotonic()
        position = start
        while position < end:
            batches, after = await reader.fetch(position)
            chunk = RestoreChunk(tables)
            for batch, next_offset in batches:
                chunk.apply_records(batch, position)  # a first batch may begin below it
                position = next_offset
                if chunk.taken >= CHUNK:  # one atomic write per CHUNK records
                    applied += _write(chunk, tables, position, where)
                    await asyncio.sleep(0)  # the other partitions' turn
                    chunk = RestoreChunk(tables)
            if chunk.taken or after != tables.checkpoint.changelog:
                applied += _write(chunk, tables, after, where)
            if after != position or batches:
                position, last_progress = after, time.monotonic()
                await asyncio.sleep(0)
            elif time.monotonic() - last_progress > stall_timeout_s:
                raise SourceError(
                    f"restore of {where} made no progress for "
                    f"{stall_timeout_s:.0f}s (setting restore_stall_timeout_s)"
                )
        return applied
    except KafkaError as exc:
        raise SourceError(f"restore of {where} failed: {exc!r}") from exc
    finally:
        await consumer.stop()


CHUNK = 20_000
"""Changelog records per restore write (atomic, with the position after them)."""


def _write(chunk: RestoreChunk, tables: PartitionTables, position: int, where: str) -> int:
    """Write ``chunk`` with changelog ``position``; the records it applied."""
    chunk.write(tables, position)  # holds the GIL anyway; never races close()
    if chunk.skipped:
        log.warning("%s: %d records of unknown tables skipped", where, chunk.skipped)
    return chunk.taken


ABORT_TIMEOUT_S = 5.0
"""Bound of an abort or a writer's stop: the broker may be away (the reset after it
fences whatever is left open)."""


async def _abort(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.abort_transaction(), ABORT_TIMEOUT_S)
    except Exception as exc:  # the producer may be fenced or stopped already
        log.debug("abort of the transaction failed: %r", exc)
    finally:
        # A fenced writer's sender stops and fails the transaction's waiter, which an
        # abort that cannot run never awaits: mark it seen (no "never retrieved" print).
        manager = getattr(producer, "_txn_manager", None)
        if manager is not None:
            _retrieve([manager.wait_for_transaction_end()])
