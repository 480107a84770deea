"""The worker's one transactional producer: every partition's batches of a poll cycle in
one Kafka transaction (exactly-once v2, KIP-447).

A worker has one :class:`TransactionalWriter`; each partition task commits through its
:class:`~streamapp.transports.kafka.transaction.KafkaTransaction`, which hands the
batch to the writer as a :class:`Part` (its changelog records, derived events and source
offset). The writer gathers the parts of one cycle into one transaction: the first part
that arrives while no transaction is under way opens a cycle, which takes every part
that arrives until each partition busy with a batch has handed its part in (bounded by
:data:`CYCLE_LINGER_S`); parts that arrive while a transaction commits go into the next.
So the partitions fed by one poll commit together, and a transaction of eight
partitions is as many requests as one of a single partition.

The offsets of every part go in the transaction with the consumer group's generation and
member id (``TxnOffsetCommit`` v3, :mod:`~streamapp.transports.kafka.txn_offsets`): the
group coordinator refuses them once the group has moved on without this worker, and the
transaction is aborted. That is what fences a zombie now that the transactional id is
the worker's, not the partition's. A failure of any part (a send refused, a fence, the
deadline) aborts the whole transaction and fails every part of it: each partition task
rewinds to its checkpoint (:mod:`streamapp.engine.recover`), as Kafka Streams rewinds
every task of a failed commit. After a failure the producer is dropped; the next
transaction starts a new one, whose ``InitProducerId`` ends (commits or aborts for good)
a transaction of this id whose outcome the deadline left unknown.

A transaction left open by another worker (a zombie's, or one killed mid-batch) is no
longer ended by the next owner's start, the transactional id being each worker's: the
next owner's restore waits for it (:func:`~streamapp.transports.kafka.transaction.restore`,
up to the producer's transaction timeout, :attr:`TransactionalWriter.producer_timeout_s`)
before it reads the changelog. Not closed here: a zombie whose offsets the group
coordinator accepted before the group moved on, but whose changelog records had not
reached the broker when the new owner restored, can still commit by a late ``EndTxn``
(Kafka Streams waits for such pending offsets with ``OffsetFetch`` ``require_stable``,
v7, which aiokafka 0.14 does not define): its batch would then land in the changelog
before the new owner's batches of the same records, its derived events twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, KafkaError, ProducerFenced

from ...errors import FencedError, PublishError, SourceError
from ...records import Message
from .sink import producer_config
from .txn_offsets import Member, group_refusal, install, set_member

log = logging.getLogger("streamapp.partition")

FENCED = (ProducerFenced, InvalidProducerEpoch)

CYCLE_LINGER_S = 0.005
"""The longest a transaction waits for the parts of partitions still busy with a batch
(a long batch, a Redeliver pause) before it commits without them."""

BATCH_BYTES = 512 * 1024
"""The writer's record batch size: a batch's changelog records go out in few record
batches (the broker takes up to 1 MB a batch by default)."""

MIN_PRODUCER_TIMEOUT_S = 10.0
"""The shortest transaction timeout the writer asks the broker for (setting
``transaction_timeout_s`` above it gives that)."""

ABORT_TIMEOUT_S = 5.0
"""Bound of an abort or a producer's stop: the broker may be away (the next producer's
start fences whatever is left open)."""


@dataclass(slots=True, eq=False)
class Part:
    """One partition's batch in a shared transaction."""

    source: TopicPartition
    changes: Sequence[tuple[str, Iterable[tuple[bytes, bytes | None]]]]
    """Per lane with tables: its changelog topic and records (partition of ``source``)."""
    outputs: Sequence[Message]
    offset: tuple[int, str] | None
    """The source offset committed in the transaction, with its metadata."""
    done: asyncio.Future[list[int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """Per entry of ``changes``: the next changelog offset once committed."""


class TransactionalWriter:
    """One transactional producer and the cycles of parts it commits."""

    def __init__(
        self,
        bootstrap: str,
        transactional_id: str,
        *,
        group_id: str,
        timeout_s: float,
        member: Callable[[], Member | None] | None = None,
        busy: Callable[[], Collection[TopicPartition]] = lambda: (),
        linger_s: float = CYCLE_LINGER_S,
    ) -> None:
        install()  # TxnOffsetCommit v3 with the group's metadata
        self.bootstrap, self.transactional_id = bootstrap, transactional_id
        self.group_id, self.timeout_s, self.linger_s = group_id, timeout_s, linger_s
        self._member = member
        """The group's metadata to commit offsets with (None here: no group check; a
        callable returning None: this worker is not a member now, nothing commits)."""
        self._busy = busy
        """Source partitions with a batch in hand (a cycle waits for their parts)."""
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()
        self._start: asyncio.Future[AIOKafkaProducer] | None = None
        """The producer's start under way: the writer's, not a caller's (see start)."""
        self._queue: list[Part] = []
        self._arrived = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._abandoned: set[asyncio.Task[None]] = set()
        self.transactions = 0
        """Transactions committed (each one cycle)."""
        self.producer_timeout_s = max(timeout_s, MIN_PRODUCER_TIMEOUT_S)
        """The broker aborts a transaction of this writer left open this long (its
        ``transaction.timeout.ms``): how long a zombie's or a killed worker's open
        transaction can hold a changelog's restore (Kafka Streams: 10 s)."""

    async def start(self) -> None:
        """Start the producer unless it runs (after a failure: a new one).

        The start is the writer's, not its caller's: a caller cancelled meanwhile (a
        partition whose opening failed, e.g. on a damaged store) leaves it running for
        the next caller, and a start abandoned past its deadline ends before another
        begins. Each start's ``InitProducerId`` bumps the epoch of the worker's one
        transactional id: one left running beside another could land after it and
        fence the producer the writer kept."""
        async with self._starting:
            if self._producer is not None:
                return
            if self._start is None:
                if self._abandoned:
                    await asyncio.wait(set(self._abandoned))
                self._start = asyncio.ensure_future(self._start_producer())
            starting = self._start
            try:
                producer = await asyncio.shield(starting)
            except asyncio.CancelledError:
                if not starting.done():
                    raise  # this caller's: the start goes on for the next one
                self._start = None  # it ended as this caller was cancelled: keep its producer
                if not starting.cancelled() and starting.exception() is None:
                    self._producer = starting.result()
                raise
            except BaseException:
                self._start = None
                raise
            self._start, self._producer = None, producer

    async def commit(self, part: Part) -> list[int]:
        """Commit ``part`` in the cycle's transaction; its next changelog offsets.
        Raises what failed the transaction (every part of it gets the same)."""
        self._queue.append(part)
        self._arrived.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="transactions")
        return await part.done

    async def close(self) -> None:
        """Stop after the transaction under way; parts not in one fail."""
        if self._flusher is not None and not self._flusher.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._flusher), self.timeout_s)
            except (TimeoutError, Exception):
                self._flusher.cancel()
                await asyncio.gather(self._flusher, return_exceptions=True)
        for part in self._queue:
            _fail(part, PublishError(f"transactional writer {self.transactional_id} closed"))
        self._queue = []
        starting, self._start = self._start, None
        if starting is not None:  # a start no caller waits for any more: stop its producer
            await asyncio.wait({starting})
            if not starting.cancelled() and starting.exception() is None:
                await _stop(starting.result(), self.transactional_id)
        if self._abandoned:
            await asyncio.wait(set(self._abandoned))
        await self._drop()

    async def run(self, parts: Sequence[Part]) -> list[list[int]]:
        """One transaction of ``parts``, bounded by ``timeout_s``; per part, its next
        changelog offsets. Errors become streamapp's, and drop the producer."""
        where = ", ".join(sorted({f"{p.source.topic}[{p.source.partition}]" for p in parts}))
        member = None
        if self._member is not None and any(p.offset is not None for p in parts):
            member = self._member()
            if member is None:
                raise FencedError(
                    f"this worker is not a member of group {self.group_id} now (its consumer "
                    f"left the group or was removed): the batches of {where} are not committed"
                )
        try:
            return await asyncio.wait_for(self._transaction(parts, member), self.timeout_s)
        except BaseException as exc:
            await self._drop()
            if isinstance(exc, FENCED):
                raise FencedError(
                    f"transactional writer {self.transactional_id} of {where} was fenced by "
                    "a newer producer of its transactional id (another worker's on the same "
                    "id, or the broker ended a transaction of it past its timeout)"
                ) from exc
            refusal = group_refusal(exc)
            if refusal is not None:
                if refusal == "REBALANCE_IN_PROGRESS":
                    raise PublishError(f"transaction of {where} refused: {exc}") from exc
                raise FencedError(
                    f"transaction of {where} fenced by the group coordinator ({exc}): the "
                    "group moved on without this worker, its partitions are elsewhere"
                ) from exc
            if isinstance(exc, TimeoutError):
                raise PublishError(
                    f"transaction of {self.transactional_id} ({where}) not committed within "
                    f"{self.timeout_s:g}s (setting transaction_timeout_s)"
                ) from None
            if isinstance(exc, KafkaError):
                raise PublishError(f"transaction of {where} failed: {exc!r}") from exc
            raise

    # the cycle ---------------------------------------------------------------------
    async def _flush(self) -> None:
        while self._queue:
            await self._gather()
            parts = [p for p in self._queue if not p.done.done()]  # cancelled: left out
            self._queue = []
            if not parts:
                continue
            try:
                results = await self.run(parts)
            except BaseException as exc:
                for part in parts:
                    _fail(part, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self.transactions += 1
            for part, positions in zip(parts, results, strict=True):
                if not part.done.done():
                    part.done.set_result(positions)

    async def _gather(self) -> None:
        """Until every partition busy with a batch has handed in its part, or
        :attr:`linger_s` passed: let the tasks run first (they hand in their parts
        without a wait of their own), then wait for arrivals in slices."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        turns = 0
        while True:
            handed = {p.source for p in self._queue}
            if not [tp for tp in self._busy() if tp not in handed]:
                return
            if turns < 4:  # the tasks made ready by the last commit run their batches
                turns += 1
                await asyncio.sleep(0)
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(remaining, 0.001))

    async def _transaction(self, parts: Sequence[Part], member: Member | None) -> list[list[int]]:
        await self.start()
        producer = self._producer
        if producer is None:
            raise PublishError(f"transactional writer {self.transactional_id} is closed")
        await producer.begin_transaction()
        ending = _transaction_waiter(producer)
        sent: list[asyncio.Future[Any]] = []
        """Every send's future; it and the transaction's own end (``ending``) are
        retrieved whatever happens (a fenced writer's would each print "Future exception
        was never retrieved"; aiokafka replaces a transaction's failed end by another
        when the failure turns fatal, and that first one no one else holds)."""
        try:
            lasts: list[list[tuple[asyncio.Future[Any], int]]] = []
            for part in parts:
                p = part.source.partition
                lasts.append(
                    [await _send_records(producer, t, p, items, sent) for t, items in part.changes]
                )
                for m in part.outputs:
                    future = await producer.send(
                        m.topic, m.value, key=m.key, headers=list(m.headers), partition=m.partition
                    )
                    sent.append(future)
            # Every send acknowledged before the offsets join the transaction, and before
            # it commits (aiokafka commits a transaction one of whose batches failed):
            # a Produce the broker verifies (KIP-890) while AddOffsetsToTxn changes the
            # same transaction gets CONCURRENT_TRANSACTIONS, which it answers to aiokafka's
            # Produce v7 as NOT_ENOUGH_REPLICAS, retried after retry_backoff_ms (100 ms):
            # measured, 1-3 transactions in a hundred, which made the p99: 116 ms against 21.
            if sent:  # wait, not gather: a cancelled gather would cancel aiokafka's futures
                await asyncio.wait(sent)
                for future in sent:
                    future.result()  # a refused send fails the transaction here
            offsets = {part.source: part.offset for part in parts if part.offset is not None}
            if offsets:
                set_member(self.transactional_id, member)
                await producer.send_offsets_to_transaction(offsets, self.group_id)
            await producer.commit_transaction()
        except BaseException:
            await _abort(producer)
            raise
        finally:
            _retrieve([*ending, *sent])
        return [[int((await last).offset) + count for last, count in of] for of in lasts]

    # the producer ------------------------------------------------------------------
    async def _start_producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **producer_config(
                {
                    "transactional_id": self.transactional_id,
                    # No linger: changelog records go out as whole batches already, and
                    # a lingering batch holds up the transaction (its commit waits).
                    "linger_ms": 0,
                    "max_batch_size": BATCH_BYTES,
                    "transaction_timeout_ms": int(self.producer_timeout_s * 1000),
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
        return producer

    async def _drop(self) -> None:
        """Stop the producer (bounded); the next transaction starts another."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await _stop(producer, self.transactional_id)

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
                    "transactional writer %s that did not start in time did not stop "
                    "within %.0fs either (broker away?)",
                    self.transactional_id,
                    ABORT_TIMEOUT_S,
                )

        task = asyncio.create_task(stop(), name=f"stop {self.transactional_id}")
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)


async def _stop(producer: AIOKafkaProducer, transactional_id: str) -> None:
    """Stop ``producer``, bounded by ``ABORT_TIMEOUT_S``."""
    try:
        await asyncio.wait_for(producer.stop(), ABORT_TIMEOUT_S)
    except TimeoutError:
        log.warning(
            "transactional writer %s did not stop within %.0fs (broker away?); left "
            "behind, the next one fences it",
            transactional_id,
            ABORT_TIMEOUT_S,
        )


def _fail(part: Part, exc: BaseException) -> None:
    if not part.done.done():
        part.done.set_exception(exc)
        part.done.exception()  # seen here too: a cancelled waiter never reads it


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


def _transaction_waiter(producer: AIOKafkaProducer) -> list[asyncio.Future[Any]]:
    """The future aiokafka ends the transaction under way with (its transaction manager
    has no public accessor), as a list to add the sends' futures to."""
    manager = getattr(producer, "_txn_manager", None)
    waiter = None if manager is None else manager.wait_for_transaction_end()
    return [waiter] if isinstance(waiter, asyncio.Future) else []


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
        _retrieve(_drain_waiters(producer))


def _drain_waiters(producer: AIOKafkaProducer) -> list[asyncio.Future[Any]]:
    """The drain waiter of each record batch ``producer`` holds. A sender that stopped
    (fenced) fails every batch, its drain waiter too, which only ``wait_drain`` reads,
    and nothing here calls: each would print "Future exception was never retrieved"
    when collected. aiokafka keeps them on its accumulator, with no public accessor."""
    accumulator = getattr(producer, "_message_accumulator", None)
    queued = getattr(accumulator, "_batches", None)
    pending = getattr(accumulator, "_pending_batches", None)
    batches: list[Any] = [b for q in queued.values() for b in q] if isinstance(queued, dict) else []
    if isinstance(pending, set):
        batches.extend(pending)
    waiters = (getattr(batch, "_drain_waiter", None) for batch in batches)
    return [w for w in waiters if isinstance(w, asyncio.Future)]
