"""One Kafka partition task's share of its worker's transaction, and its changelog restore.

Every commit of a partition task goes into its worker's transaction
(:class:`~streamapp.transports.kafka.txn_writer.TransactionalWriter`, one transactional
producer per worker, the batches of every partition of a poll cycle in one transaction):
the changelog records of every agent of the topic (each to its own changelog topic,
same partition number), every derived event the batch sent, and the source offset,
committed with the group's generation and member id (``TxnOffsetCommit`` v3,
:mod:`~streamapp.transports.kafka.txn_offsets`). The offset is the batch's own end when
an agent of the topic has no tables (no checkpoint to resume from; its metadata names
the agents that are ahead of it, :mod:`streamapp.engine.lane`); with tables only, it is
the position already durable before the batch, and the batch's own offset is committed
after the store write (:mod:`streamapp.engine.commit`). Either way the group
coordinator checks the worker's membership with it: a zombie's transaction (a worker
whose partitions moved, its consumer not told yet) is refused and aborted. A
``read_committed`` reader sees all of a transaction or nothing: after a ``kill -9`` the
open transaction is aborted (by the worker's next start: its transactional id is kept
in its data directory), the batches run again, and their derived events appear once.

Without a writer given, a :class:`KafkaTransaction` has one of its own with the given
transactional id (a second writer of that id fences the first: ``FencedError``).

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
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ...agents.agent import Agent
from ...engine.interfaces import Committed
from ...errors import FencedError, PublishError, SourceError
from ...records import Message
from ...tables.changelog import RestoreChunk, records
from ...tables.partition import BatchChanges, PartitionTables
from .changelog_read import CommittedReader
from .lineage import mismatch
from .port import offset_metadata
from .txn_writer import Part, TransactionalWriter

log = logging.getLogger("streamapp.partition")


class KafkaTransaction:
    """One partition task's share of the worker's transactional writer, and its restorer."""

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
        writer: TransactionalWriter | None = None,
        assigned: Callable[[], bool] = lambda: True,
        unconfirmed: Callable[[], str | None] = lambda: None,
        settled: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self._assigned = assigned
        """True while the group still assigns the source partition to this worker."""
        self._unconfirmed = unconfirmed
        """Why the group has not confirmed this worker's ownership lately (None: the
        owner's lease holds, :mod:`streamapp.transports.kafka.lease`)."""
        self._owned = writer is None
        """The writer is this partition's own (closed with it), not the worker's."""
        self.writer: TransactionalWriter = writer or TransactionalWriter(
            bootstrap, transactional_id, group_id=group_id, timeout_s=timeout_s
        )
        self.transactional_id = self.writer.transactional_id
        self._settled = settled
        """Until the source partition's offset commits made outside a transaction are
        done (at once when they end at the given position): a transaction's offset must
        land after them, never before."""
        self.source, self.group_id, self._changelog = source, group_id, changelog
        self.timeout_s, self.stall_timeout_s = timeout_s, stall_timeout_s
        self.retention_ms = retention_ms
        """Each changelog topic's ``delete.retention.ms`` (absent: no stale-store rule)."""
        self._where = f"{source.topic}[{source.partition}]"

    async def open(self) -> None:
        """Start the writer (the worker's: once; it ends this id's previous life's open
        transaction), while the group assigns the partition here and confirmed it lately
        (the owner's lease): a worker cut off from the group, whose consumer still holds
        the assignment it had, does not restore and take deliveries for a partition
        that another worker may own by now."""
        self._check_owned()
        await self.writer.start()

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
            pending_s=self.writer.producer_timeout_s + PENDING_MARGIN_S,
        )

    async def commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        """Hand the batch to the writer's cycle and wait for its transaction; raises what
        failed it (FencedError, PublishError), for every partition of that transaction."""
        if settle is not None and self._settled is not None:
            await self._settled(settle.position)
        part = Part(
            self.source,
            [(self._topic(agent), records(batch)) for agent, batch in changes],
            outputs,
            None if settle is None else (settle.position, offset_metadata(settle.ahead)),
        )
        return await self.writer.commit(part)

    async def reset(self) -> None:
        """After a failed commit: a writer that can commit again (the failed transaction
        dropped the producer; a new one ends that transaction for good)."""
        self._check_owned()
        if self._owned:
            await self.writer.close()
        await self.writer.start()

    def _check_owned(self) -> None:
        if not self._assigned():
            raise FencedError(
                f"{self._where} is no longer assigned to this worker: its transactional "
                f"writer {self.transactional_id} takes no batch of it again"
            )
        why = self._unconfirmed()
        if why is not None:
            raise PublishError(
                f"{self._where}: {why}; its batches go to the transactional writer "
                f"{self.transactional_id} again once the group confirms this worker's "
                "ownership (setting owner_lease_s)"
            )

    async def close(self) -> None:
        if self._owned:
            await self.writer.close()

    def _topic(self, agent: Agent) -> str:
        topic = self._changelog(agent)
        if topic is None:
            raise SourceError(f"agent {agent.name!r} has no changelog topic (no tables)")
        return topic


async def restore(
    bootstrap: str,
    tp: TopicPartition,
    tables: PartitionTables,
    stall_timeout_s: float,
    stale: Callable[[], bool] = lambda: False,
    *,
    pending_s: float = 0.0,
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
        began = time.monotonic()
        await consumer.start()
        consumer.assign([tp])
        consumer.pause(tp)  # read by the CommittedReader (the lineage check resumes it)
        started = time.monotonic()
        end = await _settled_end(bootstrap, consumer, tp, pending_s)
        settled = time.monotonic()
        why = await mismatch(consumer, tp, tables.checkpoint, end, stall_timeout_s)
        log.debug(  # an opening's "fence and restore" in parts (docs/operations.md)
            "restore %s: consumer %.3fs, settled end %.3fs, lineage %.3fs",
            where,
            started - began,
            settled - started,
            time.monotonic() - settled,
        )
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


PENDING_MARGIN_S = 5.0
"""How much longer than a transaction's timeout a restore waits for one left open."""


async def _settled_end(
    bootstrap: str, consumer: AIOKafkaConsumer, tp: TopicPartition, pending_s: float
) -> int:
    """``tp``'s end for ``consumer`` (``read_committed``: its last stable offset), once no
    transaction is open below the high watermark as it is now, waited for up to
    ``pending_s``. A transaction left open on a changelog partition is another worker's
    (a zombie's, or one killed mid-batch: the transactional id is each worker's, so this
    worker's start does not end it): restored up to it, the store would take batches on
    top of a batch that may still commit, and the next open would find the store past
    the changelog's end. The broker aborts it after its timeout; its worker started
    again aborts it at once."""
    end = int((await consumer.end_offsets([tp]))[tp])
    if pending_s <= 0:
        return end
    top = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_uncommitted"
    )
    await top.start()
    try:
        # assigned (and paused: it fetches nothing), its metadata is asked for at once;
        # a consumer asked for the offsets of a partition it knows nothing of first
        # waits out a metadata back-off (retry_backoff_ms, 0.1 s of every opening)
        top.assign([tp])
        top.pause(tp)
        high = int((await top.end_offsets([tp]))[tp])
    finally:
        await top.stop()
    if end >= high:
        return end
    log.info(
        "%s[%d]: a transaction is open at offset %d (another worker's): restore waits up "
        "to %.0fs for it to end",
        tp.topic,
        tp.partition,
        end,
        pending_s,
    )
    deadline = time.monotonic() + pending_s
    while end < high and time.monotonic() < deadline:
        await asyncio.sleep(PENDING_POLL_S)
        end = int((await consumer.end_offsets([tp]))[tp])
    if end < high:
        log.warning(
            "%s[%d]: a transaction still open at offset %d after %.0fs: restored up to it",
            tp.topic,
            tp.partition,
            end,
            pending_s,
        )
    return end


PENDING_POLL_S = 0.2
"""How often a restore asks whether a transaction left open has ended."""

CHUNK = 20_000
"""Changelog records per restore write (atomic, with the position after them)."""


def _write(chunk: RestoreChunk, tables: PartitionTables, position: int, where: str) -> int:
    """Write ``chunk`` with changelog ``position``; the records it applied."""
    chunk.write(tables, position)  # holds the GIL anyway; never races close()
    if chunk.skipped:
        log.warning("%s: %d records of unknown tables skipped", where, chunk.skipped)
    return chunk.taken
