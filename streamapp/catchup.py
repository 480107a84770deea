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
from collections.abc import Iterable

from .engine.delivery import Message
from .engine.pace import Pace, pause
from .engine.phase import Phase
from .engine.task import PartitionTask
from .eventstore.base import EventStoreBackend, StoredEvent
from .partitioner import partition_for

log = logging.getLogger("streamapp.catchup")

PROGRESS_EVERY_S = 5.0


class StoreFeed:
    """The worker's one reader of the event store (a HistoryFeed for its tasks)."""

    def __init__(
        self,
        store: EventStoreBackend,
        *,
        chunk: int = 10_000,
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
        prefetch: tuple[int, asyncio.Task[list[StoredEvent]]] | None = None
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
            end = rows[-1].position + 1 if rows else start
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

    async def _read(self, start: int) -> list[StoredEvent]:
        self.reads += 1
        return await self.store.read_all(start, self.chunk)

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
        self, members: Iterable[PartitionTask], rows: list[StoredEvent], end: int
    ) -> set[PartitionTask]:
        """Give each member its share of ``rows``; returns the members that failed."""
        by_count: dict[int, list[list[StoredEvent]]] = {}
        failed: set[PartitionTask] = set()
        for task in members:
            position = task.history_position()
            if position >= end:
                continue
            n = task.topic.partitions
            shares = by_count.get(n)
            if shares is None:
                shares = by_count[n] = self._split(rows, n)
            topic = task.topic.name
            deliveries = [
                Message(topic, task.partition, r.position, r.stream_id.encode(), r.payload, ())
                for r in shares[task.partition]
                if r.position >= position
            ]
            if not await task.apply_history(deliveries, end):
                failed.add(task)
        return failed

    def _split(self, rows: list[StoredEvent], n: int) -> list[list[StoredEvent]]:
        """``rows`` by partition among ``n`` (stream ids cached: murmur2 is ~3 us)."""
        cache = self._partitions.setdefault(n, {})
        if len(cache) > 1_000_000:
            cache.clear()
        shares: list[list[StoredEvent]] = [[] for _ in range(n)]
        for row in rows:
            p = cache.get(row.stream_id)
            if p is None:
                p = cache[row.stream_id] = partition_for(row.stream_id.encode(), n)
            shares[p].append(row)
        return shares

    def _caught_up(self, task: PartitionTask) -> None:
        """Release ``task`` to go live; it is no member of any later read (a read in
        flight while it hands over must never reach it)."""
        future = self._waiting.pop(task, None)
        if future is not None and not future.done():
            future.set_result(None)

    def status(self) -> dict[str, object]:
        return {"head": self.head, "catching_up": len(self._waiting), "reads": self.reads}


def _discard(prefetch: tuple[int, asyncio.Task[list[StoredEvent]]] | None) -> None:
    """Drop a read ahead that is not wanted, without leaving its error unretrieved."""
    if prefetch is not None:
        task = prefetch[1]
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


class _Progress:
    """Logs replay progress every few seconds; draws a bar when stderr is a terminal."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last = self.started
        self.events = 0
        self.bar = sys.stderr.isatty()
        self._drawn = False

    def tick(self, feed: StoreFeed, rows: list[StoredEvent]) -> None:
        self.events += len(rows)
        if not feed._waiting:
            self.done()
            return
        now = time.monotonic()
        if now - self.last < (0.5 if self.bar else PROGRESS_EVERY_S):
            return
        self.last = now
        at = rows[-1].position if rows else feed.head
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
