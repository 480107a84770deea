"""Catch-up then live: one event-store reader per worker feeds its partitions.

A partition whose agent declares ``history=FromEventStore()`` replays its events from
the store before it takes live deliveries. Replaying per partition would read the whole
store once per partition, so one :class:`StoreFeed` per worker reads the global order in
large chunks and hands each partition task its share (by the one partitioner, over the
stream id). Each chunk is committed per partition with the next store position in its
checkpoint (same atomic write as the state, and in the changelog), so a restart resumes
the replay where it stood, and a partition that moves takes its position along.

Handover: when a read returns fewer rows than asked, the partitions that have applied
everything up to that read are caught up; the task marks ``caught_up`` in its
checkpoint and starts the live source (see :meth:`StoreFeed.live_start`). Events seen
both in the replay and live are applied once by the per-key stream-version rule: store
events always carry ``streamversion``; a live event without one cannot be deduplicated.

With ``STREAMAPP_BROKER=none`` the store is the only source: the feed keeps following
the live partitions after their catch-up, polling the head every poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import add, length_hint
from typing import NamedTuple, overload

from . import catchup_progress
from .catchup_progress import CatchUpProgress, stuck_record
from .engine.pace import Pace, pause
from .engine.provenance import StoreIdentity
from .engine.replay import Replayed
from .eventstore.base import EventStoreBackend, StoredRow, display_url
from .partitioner import Partitioner, partition_for
from .records import Headers

log = logging.getLogger("streamapp.catchup")
_new = tuple.__new__

HEAD_EVERY_S = 2.5
"""How often the store's head is read again while partitions catch up (for progress)."""

PARTITION_CACHE_STREAMS = 100_000
"""Stream ids whose partition the replay remembers (per partition count and partitioner):
~15 MB at most, outside ``memory_limit_mb`` (docs/settings.md: Memory)."""


class StoreFeed:
    """The worker's one reader of the event store (a HistoryFeed for its tasks)."""

    def __init__(
        self,
        store: EventStoreBackend,
        *,
        chunk: int = 50_000,
        poll_s: float = 0.5,
    ) -> None:
        self.store, self.chunk, self.poll_s = store, chunk, poll_s
        self.head = 0
        """The store's head as last seen."""
        self._waiting: dict[Replayed, asyncio.Future[None]] = {}
        self._after: dict[Replayed, int] = {}
        """For a ``fresh`` catch-up: only a read numbered above this one releases it."""
        self._issued = 0
        """The number of the last read issued (reads are numbered as they start)."""
        self._tail_read = 0.0
        self._following: set[Replayed] = set()
        self._retry_at: dict[Replayed, float] = {}
        """Tasks whose replayed event failed under Redeliver, and when to try again."""
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._partitions: dict[tuple[int, Partitioner], dict[str, int]] = {}
        """Per partition count and partitioner, the partitions of stream ids seen lately."""
        self._progress = CatchUpProgress()
        self._ticker: asyncio.Task[None] | None = None
        self._head_read = 0.0
        self.reads = 0
        """read_all calls made (a restart after the caught-up marker makes none)."""
        self._store_id: str | None = None

    # HistoryFeed -------------------------------------------------------------------
    async def catch_up(self, task: Replayed, *, fresh: bool = False) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiting[task] = future
        self._after[task] = self._issued if fresh else -1
        self._progress.join(task)
        self._wake.set()
        try:
            await future
        finally:
            self._waiting.pop(task, None)
            self._after.pop(task, None)

    async def live_start(self, task: Replayed) -> int | None:
        """The live offset from which every event at or after the task's store position
        is found, when the forwarder recorded it; None lets the source decide."""
        return await self.store.live_offset(
            task.topic.name, task.partition, task.history_position()
        )

    async def identity(self) -> StoreIdentity:
        """The store's identity (read once) and its head now."""
        if self._store_id is None:
            self._store_id = await self.store.store_id()
        return StoreIdentity(self._store_id, display_url(self.store.url), await self.store.head())

    def follow(self, task: Replayed) -> None:
        """Keep feeding ``task`` after its catch-up (the store is its live source)."""
        task.follow(True)
        self._following.add(task)
        self._wake.set()

    def forget(self, task: Replayed) -> None:
        task.follow(False)
        self._following.discard(task)

    # the reader --------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="event store feed")
        self._ticker = asyncio.create_task(self._tick(), name="catch-up progress")

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._loop is not None:
            await asyncio.gather(self._loop, return_exceptions=True)
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        self._progress.close()

    async def _tick(self) -> None:
        """A progress line every :data:`~.catchup_progress.EVERY_S` while catching up,
        however long a chunk takes."""
        while True:
            await asyncio.sleep(0.5 if self._progress.bar else catchup_progress.EVERY_S)
            self._progress.head = max(self._progress.head, self.head)
            self._progress.report()

    async def wait(self) -> None:
        if self._loop is not None:
            await self._loop

    async def _run(self) -> None:
        prefetch: tuple[int, int, asyncio.Task[list[StoredRow]]] | None = None
        pace = Pace(self._stop)
        failing_since: float | None = None
        while not self._stop.is_set():
            members = self._members()
            if not members:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                continue
            start = min(t.history_position() for t in members)
            try:
                if self._waiting and time.monotonic() - self._head_read > HEAD_EVERY_S:
                    self.head = max(self.head, await self.store.head())
                    self._head_read = time.monotonic()
                await self._follow_tail(members, start)
                if prefetch is not None and prefetch[0] == start:
                    number, reading = prefetch[1:]
                    rows = await reading
                else:
                    _discard(prefetch)
                    number = self._issue()
                    rows = await self._read(start)
            except Exception as exc:  # the store is down or busy: keep the partitions waiting
                if failing_since is None:  # once per outage, not once per retry
                    failing_since = time.monotonic()
                    log.error("reading the event store failed (%r); retrying", exc)
                prefetch = None
                await pace.wait()
                continue
            if failing_since is not None:
                log.warning(
                    "reading the event store again after %.1fs",
                    time.monotonic() - failing_since,
                )
                failing_since = None
            pace.delay = pace.initial_s
            prefetch = None
            end = rows[-1][0] + 1 if rows else start
            at_head = len(rows) < self.chunk
            if not at_head:  # read the next chunk while this one is applied
                prefetch = (end, self._issue(), asyncio.create_task(self._read(end)))
            else:
                self.head = max(self.head, end - 1)
            self._progress.head = max(self._progress.head, self.head)
            failed: set[Replayed] = set()
            # Whole partitions first: they go live as soon as they are done, and do not
            # wait for the lanes that build a new table version beside live ones.
            for group in _by_kind(members):
                failed |= await self._apply(group, rows, end)
                if at_head:
                    self._release(group, failed, end, number)
            self._note_stuck(members, failed, rows)
            self._progress.finish(self._waiting)
            now = time.monotonic()
            for task in failed:  # an event failed under Redeliver: that partition waits
                self._retry_at[task] = now + task.retry_pause_s()
            if at_head and (not rows or failed):
                await pause(self._stop, self.poll_s)
        _discard(prefetch)

    async def _read(self, start: int) -> list[StoredRow]:
        self.reads += 1
        return await self.store.read_rows(start, self.chunk)

    def _release(
        self, members: Iterable[Replayed], failed: set[Replayed], end: int, number: int
    ) -> None:
        """Release the members that applied everything up to ``end``, the head of read
        ``number`` (a ``fresh`` catch-up: only by a read issued after its call)."""
        for task in members:
            if task in failed or task.history_position() < end:
                continue
            if self._after.get(task, -1) < number:
                self._caught_up(task)

    def _issue(self) -> int:
        """Number a read about to start: it sees everything stored before now."""
        self._issued += 1
        return self._issued

    async def _follow_tail(self, members: list[Replayed], start: int) -> None:
        """Feed the live followers (the store is their live source) from their own
        position, every poll interval, while the chunked read serves partitions far
        behind: a lane building a new table version must not hold the live ones."""
        following = [t for t in members if t in self._following]
        if not following or len(following) == len(members):
            return
        tail = min(t.history_position() for t in following)
        if tail <= start + self.chunk or time.monotonic() - self._tail_read < self.poll_s:
            return
        self._tail_read = time.monotonic()
        self._issue()
        rows = await self._read(tail)
        end = rows[-1][0] + 1 if rows else tail
        self.head = max(self.head, end - 1)
        failed = await self._apply(following, rows, end)
        self._note_stuck(following, failed, rows)
        now = time.monotonic()
        for task in failed:
            self._retry_at[task] = now + task.retry_pause_s()

    def _members(self) -> list[Replayed]:
        """The tasks to feed now: catching up or following, and not waiting to retry."""
        now = time.monotonic()
        for task, due in list(self._retry_at.items()):
            if due <= now or task.stopped:
                del self._retry_at[task]
        for task, future in list(self._waiting.items()):
            if task.stopped and not future.done():
                future.set_result(None)  # it takes no more events here: its wait ends
        waiting = [t for t in self._waiting if t.catching_up and t not in self._retry_at]
        following = [t for t in self._following if t.live and t not in self._retry_at]
        self._following.difference_update([t for t in self._following if t.stopped])
        return waiting + following

    async def _apply(
        self, members: Iterable[Replayed], rows: list[StoredRow], end: int
    ) -> set[Replayed]:
        """Give each member its share of ``rows``; returns the members that failed."""
        split: dict[tuple[int, Partitioner], list[list[int]]] = {}
        failed: set[Replayed] = set()
        first = rows[0][0] if rows else end
        todo: list[tuple[Replayed, list[int]]] = []
        for task in members:
            position = task.history_position()
            if position >= end:
                continue
            topic = task.topic
            placed = (topic.partitions, topic.partitioner)
            shares = split.get(placed)
            if shares is None:
                shares = split[placed] = self._split(rows, *placed)
            share = mine = shares[task.partition]
            if position > first:  # applied in part already (a retry after a failed event)
                share = share[bisect_left(share, position, key=lambda i: rows[i][0]) :]
            self._progress.chunk(task, len(rows), len(mine), len(share), end)
            todo.append((task, share))
        for task, share in todo:
            deliveries = Share(rows, share, task.topic.name, task.partition)
            self._progress.applying(task, deliveries)
            try:
                if not await task.apply_history(deliveries, end):
                    failed.add(task)
            finally:
                self._progress.applied_share()
        return failed

    def _note_stuck(
        self, members: Iterable[Replayed], failed: set[Replayed], rows: list[StoredRow]
    ) -> None:
        """Name the event each failed partition is stuck on (status, readiness, log);
        forget it once the partition moved past it."""
        stuck = self._progress.stuck
        for task in members:
            record = stuck.get(task)
            if task in failed:
                record = stuck_record(task, rows) or record
                if record is not None:
                    stuck[task] = record
                    task.stuck(record.as_dict())
            elif record is not None and task.history_position() > record.position:
                del stuck[task]
                task.stuck(None)

    def _split(self, rows: list[StoredRow], n: int, by: Partitioner) -> list[list[int]]:
        """The indexes of ``rows`` by partition among ``n``, placed by ``by`` (the topic's
        partitioner, as its live records are; stream ids' partitions cached: murmur2 is
        ~3 us; at most :data:`PARTITION_CACHE_STREAMS` per ``n`` and ``by``)."""
        cache = self._partitions.setdefault((n, by), {})
        if len(cache) > PARTITION_CACHE_STREAMS:
            cache.clear()
        get = cache.get
        shares: list[list[int]] = [[] for _ in range(n)]
        appends = [share.append for share in shares]
        for i, (_, sid, _) in enumerate(rows):
            p = get(sid)
            if p is None:
                p = cache[sid] = partition_for(sid.encode(), n, by)
            appends[p](i)
        return shares

    def _caught_up(self, task: Replayed) -> None:
        """Release ``task`` to go live; it is no member of any later read (a read in
        flight while it hands over must never reach it)."""
        future = self._waiting.pop(task, None)
        if future is not None and not future.done():
            future.set_result(None)

    def status(self) -> dict[str, object]:
        return {
            "head": self.head,
            "catching_up": len(self._waiting),
            "reads": self.reads,
            "progress": self._progress.status(),
        }


def _by_kind(members: list[Replayed]) -> list[list[Replayed]]:
    """``members`` as whole partitions, then lanes building beside live ones."""
    groups = [[t for t in members if not t.building], [t for t in members if t.building]]
    return [group for group in groups if group]


def _discard(prefetch: tuple[int, int, asyncio.Task[list[StoredRow]]] | None) -> None:
    """Drop a read ahead that is not wanted, without leaving its error unretrieved."""
    if prefetch is not None:
        task = prefetch[2]
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


class StoredDelivery(NamedTuple):
    """A replayed event as a :class:`~streamapp.engine.delivery.Delivery`: a
    :data:`StoredRow` and the task's topic and partition, made in one tuple addition."""

    position: int
    stream_id: str
    value: bytes
    topic: str
    partition: int
    headers: Headers

    @property
    def key(self) -> bytes:
        return self.stream_id.encode()


class Share(Sequence[StoredDelivery]):
    """One partition's deliveries of a stored chunk, each made as it is iterated: one
    lives only while its event is handled (see :data:`StoredRow` for why no object per
    event should live as long as its chunk)."""

    __slots__ = ("_indexes", "_iterating", "_rows", "_tail")

    def __init__(self, rows: list[StoredRow], indexes: list[int], topic: str, partition: int):
        self._rows, self._indexes = rows, indexes
        self._tail: tuple[str, int, Headers] = (topic, partition, ())
        self._iterating: Iterator[int] | None = None

    def taken(self) -> int:
        """How many deliveries its first iteration has handed out (progress, read
        without a cost per event: the index iterator's length hint)."""
        if self._iterating is None:
            return 0
        return len(self._indexes) - length_hint(self._iterating)

    def __len__(self) -> int:
        return len(self._indexes)

    @overload
    def __getitem__(self, i: int) -> StoredDelivery: ...
    @overload
    def __getitem__(self, i: slice) -> Share: ...
    def __getitem__(self, i: int | slice) -> StoredDelivery | Share:
        if isinstance(i, slice):
            topic, partition, _ = self._tail
            return Share(self._rows, self._indexes[i], topic, partition)
        return _new(StoredDelivery, self._rows[self._indexes[i]] + self._tail)

    def __iter__(self) -> Iterator[StoredDelivery]:
        indexes = iter(self._indexes)
        if self._iterating is None:
            self._iterating = indexes
        rows = map(self._rows.__getitem__, indexes)
        return map(_new, repeat(StoredDelivery), map(add, rows, repeat(self._tail)))
