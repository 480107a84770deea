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
import sys
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import add
from typing import NamedTuple, overload

from .engine.delivery import Headers
from .engine.pace import Pace, pause
from .engine.phase import Phase
from .engine.task import PartitionTask
from .eventstore.base import EventStoreBackend, StoredRow
from .partitioner import partition_for

log = logging.getLogger("streamapp.catchup")
_new = tuple.__new__

PROGRESS_EVERY_S = 5.0
PARTITION_CACHE_STREAMS = 100_000
"""Stream ids whose partition the replay remembers (per partition count): ~15 MB at
most, outside ``memory_limit_mb`` (README: Memory)."""


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
        self._waiting: dict[PartitionTask, asyncio.Future[None]] = {}
        self._following: set[PartitionTask] = set()
        self._retry_at: dict[PartitionTask, float] = {}
        """Tasks whose replayed event failed under Redeliver, and when to try again."""
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._partitions: dict[int, dict[str, int]] = {}
        self._progress = _Progress()
        self._head_read = 0.0
        self.reads = 0
        """read_all calls made (a restart after the caught-up marker makes none)."""

    # HistoryFeed -------------------------------------------------------------------
    async def catch_up(self, task: PartitionTask) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiting[task] = future
        self._wake.set()
        try:
            await future
        finally:
            self._waiting.pop(task, None)

    async def live_start(self, task: PartitionTask) -> int | None:
        """The live offset from which every event at or after the task's store position
        is found, when the forwarder recorded it; None lets the source decide."""
        return await self.store.live_offset(
            task.topic.name, task.partition, task.history_position()
        )

    def follow(self, task: PartitionTask) -> None:
        """Keep feeding ``task`` after its catch-up (the store is its live source)."""
        task.follows_store = True
        self._following.add(task)
        self._wake.set()

    def forget(self, task: PartitionTask) -> None:
        task.follows_store = False
        self._following.discard(task)

    # the reader --------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="event store feed")

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._loop is not None:
            await asyncio.gather(self._loop, return_exceptions=True)
        self._progress.done()

    async def wait(self) -> None:
        if self._loop is not None:
            await self._loop

    async def _run(self) -> None:
        prefetch: tuple[int, asyncio.Task[list[StoredRow]]] | None = None
        pace = Pace(self._stop)
        while not self._stop.is_set():
            members = self._members()
            if not members:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                continue
            start = min(t.history_position() for t in members)
            try:
                if self._waiting and time.monotonic() - self._head_read > PROGRESS_EVERY_S / 2:
                    self.head = max(self.head, await self.store.head())
                    self._head_read = time.monotonic()
                if prefetch is not None and prefetch[0] == start:
                    rows = await prefetch[1]
                else:
                    _discard(prefetch)
                    rows = await self._read(start)
            except Exception as exc:  # the store is down or busy: keep the partitions waiting
                log.error("reading the event store failed (%r); retrying in %.1fs", exc, pace.delay)
                prefetch = None
                await pace.wait()
                continue
            pace.delay = pace.initial_s
            prefetch = None
            end = rows[-1][0] + 1 if rows else start
            at_head = len(rows) < self.chunk
            if not at_head:  # read the next chunk while this one is applied
                prefetch = (end, asyncio.create_task(self._read(end)))
            else:
                self.head = max(self.head, end - 1)
            failed = await self._apply(members, rows, end)
            self._progress.tick(self, rows)
            if at_head:
                for task in members:
                    if task not in failed and task.history_position() >= end:
                        self._caught_up(task)
            now = time.monotonic()
            for task in failed:  # an event failed under Redeliver: that partition waits
                self._retry_at[task] = now + task.retry_pause_s()
            if at_head and (not rows or failed):
                await pause(self._stop, self.poll_s)
        _discard(prefetch)

    async def _read(self, start: int) -> list[StoredRow]:
        self.reads += 1
        return await self.store.read_rows(start, self.chunk)

    def _members(self) -> list[PartitionTask]:
        """The tasks to feed now: catching up or following, and not waiting to retry."""
        now = time.monotonic()
        for task, due in list(self._retry_at.items()):
            if due <= now or task.phase in (Phase.CLOSED, Phase.LOST):
                del self._retry_at[task]
        waiting = [
            t for t in self._waiting if t.phase is Phase.CATCHING_UP and t not in self._retry_at
        ]
        following = [
            t for t in self._following if t.phase is Phase.LIVE and t not in self._retry_at
        ]
        self._following.difference_update(
            [t for t in self._following if t.phase in (Phase.CLOSED, Phase.LOST)]
        )
        return waiting + following

    async def _apply(
        self, members: Iterable[PartitionTask], rows: list[StoredRow], end: int
    ) -> set[PartitionTask]:
        """Give each member its share of ``rows``; returns the members that failed."""
        split: dict[int, list[list[int]]] = {}
        failed: set[PartitionTask] = set()
        first = rows[0][0] if rows else end
        for task in members:
            position = task.history_position()
            if position >= end:
                continue
            topic = task.topic
            shares = split.get(topic.partitions)
            if shares is None:
                shares = split[topic.partitions] = self._split(rows, topic.partitions)
            share = shares[task.partition]
            if position > first:  # applied in part already (a retry after a failed event)
                share = share[bisect_left(share, position, key=lambda i: rows[i][0]) :]
            deliveries = Share(rows, share, topic.name, task.partition)
            if not await task.apply_history(deliveries, end):
                failed.add(task)
        return failed

    def _split(self, rows: list[StoredRow], n: int) -> list[list[int]]:
        """The indexes of ``rows`` by partition among ``n`` (stream ids' partitions
        cached: murmur2 is ~3 us; at most :data:`PARTITION_CACHE_STREAMS` per ``n``)."""
        cache = self._partitions.setdefault(n, {})
        if len(cache) > PARTITION_CACHE_STREAMS:
            cache.clear()
        get = cache.get
        shares: list[list[int]] = [[] for _ in range(n)]
        appends = [share.append for share in shares]
        for i, (_, sid, _) in enumerate(rows):
            p = get(sid)
            if p is None:
                p = cache[sid] = partition_for(sid.encode(), n)
            appends[p](i)
        return shares

    def _caught_up(self, task: PartitionTask) -> None:
        """Release ``task`` to go live; it is no member of any later read (a read in
        flight while it hands over must never reach it)."""
        future = self._waiting.pop(task, None)
        if future is not None and not future.done():
            future.set_result(None)

    def status(self) -> dict[str, object]:
        return {"head": self.head, "catching_up": len(self._waiting), "reads": self.reads}


def _discard(prefetch: tuple[int, asyncio.Task[list[StoredRow]]] | None) -> None:
    """Drop a read ahead that is not wanted, without leaving its error unretrieved."""
    if prefetch is not None:
        task = prefetch[1]
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

    __slots__ = ("_indexes", "_rows", "_tail")

    def __init__(self, rows: list[StoredRow], indexes: list[int], topic: str, partition: int):
        self._rows, self._indexes = rows, indexes
        self._tail: tuple[str, int, Headers] = (topic, partition, ())

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
        rows = map(self._rows.__getitem__, self._indexes)
        return map(_new, repeat(StoredDelivery), map(add, rows, repeat(self._tail)))


class _Progress:
    """Logs replay progress every few seconds; draws a bar when stderr is a terminal."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last = self.started
        self.events = 0
        self.bar = sys.stderr.isatty()
        self._drawn = False

    def tick(self, feed: StoreFeed, rows: list[StoredRow]) -> None:
        self.events += len(rows)
        if not feed._waiting:
            self.done()
            return
        now = time.monotonic()
        if now - self.last < (0.5 if self.bar else PROGRESS_EVERY_S):
            return
        self.last = now
        at = rows[-1][0] if rows else feed.head
        head = max(feed.head, at)
        rate = self.events / max(now - self.started, 1e-6)
        eta = (head - at) / rate if rate else float("inf")
        if self.bar:
            done = at / head if head else 1.0
            filled = int(done * 30)
            sys.stderr.write(
                f"\rcatching up [{'#' * filled}{'.' * (30 - filled)}] {at}/{head} "
                f"{rate:,.0f} ev/s ETA {eta:.0f}s "
            )
            sys.stderr.flush()
            self._drawn = True
        else:
            log.info(
                "catching up: %d events replayed, store position %d of %d, %.0f ev/s, ETA %.0fs",
                self.events,
                at,
                head,
                rate,
                eta,
            )

    def done(self) -> None:
        if self._drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._drawn = False
