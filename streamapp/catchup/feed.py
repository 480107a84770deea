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

With ``STREAMAPP_BROKER=none`` the store is the only source: every agent with tables
catches up (``history=`` or not), and the feed keeps following the live partitions
after their catch-up, polling the head every poll interval.

Each member (a partition, or lanes building a new table version beside live ones) is
served on its own: it is given its share of the read at its position as soon as it has
applied its last one (one share at a time: its events stay in order, each committed
with its next store position). Partitions so apply concurrently, live followers are
served first and every poll interval, and the chunks read are kept while a member
behind the others still needs them, so the store is still read about once. A share
holds every event of the member from its position: a member that fell below a read
while it was made (a build joining the store's followers) is served by a lower read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import FIRST_COMPLETED as FIRST
from bisect import bisect_left
from collections.abc import Callable

from ..engine.backoff import Pace
from ..engine.provenance import StoreIdentity
from ..engine.stored import Share
from ..engine.task_surface import Replayed
from ..eventstore.base import EventStoreBackend, StoredRow, display_url
from ..topics import Partitioner, partition_for
from . import progress as catchup_progress
from .progress import CatchUpProgress

log = logging.getLogger("streamapp.catchup")

HEAD_EVERY_S = 2.5
"""How often the store's head is read again while partitions catch up (for progress)."""

KEPT_READS = 3
"""Full chunks kept for members behind the others (beside the one read ahead)."""

PARTITION_CACHE_STREAMS = 100_000
"""Stream ids whose partition the replay remembers (per partition count and partitioner):
~15 MB at most, outside ``memory_limit_mb`` (docs/settings.md: Memory)."""


class StoreFeed:
    """The worker's one reader of the event store (a HistoryFeed for its tasks)."""

    def __init__(self, store: EventStoreBackend, *, chunk: int = 50_000, poll_s: float = 0.5):
        self.store, self.chunk, self.poll_s = store, chunk, poll_s
        self.head = 0
        """The store's head as last seen."""
        self._waiting: dict[Replayed, asyncio.Future[None]] = {}
        self._after: dict[Replayed, int] = {}
        """For a ``fresh`` catch-up: only a read numbered above this one releases it."""
        self._issued = 0
        """The number of the last read issued (reads are numbered as they start)."""
        self._following: set[Replayed] = set()
        self._retry_at: dict[Replayed, float] = {}
        """Tasks whose replayed event failed under Redeliver, and when to try again."""
        self._applying: dict[Replayed, tuple[asyncio.Task[bool], _Read]] = {}
        """The share each member applies, and its read (one at a time: in order)."""
        self._polled: dict[Replayed, float] = {}
        """Members at the store's head with nothing new, and when they looked."""
        self._reads: dict[int, _Read] = {}
        """Full chunks read, by start, kept while a member may still need them."""
        self._ahead: tuple[int, int, asyncio.Task[list[StoredRow]]] | None = None
        """The next chunk, read while this one is applied: (start, number, read)."""
        self._wake = asyncio.Event()
        """Set when a share is applied or a member joins: the loop looks again."""
        self._joined = False
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
        self._joined = True
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
        self._joined = True
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
        """Serve every member on its own: a member (a partition, or lanes building beside
        live ones) is given its share of the read covering its position as soon as its
        last share is applied, whatever the others do. So partitions apply concurrently
        (a slow handler holds its own partition only), and live followers get new events
        every poll interval while a build or a catch-up applies its chunk."""
        pace = Pace(self._stop)
        failing_since: float | None = None
        try:
            while not self._stop.is_set():
                self._reap()
                due, wake_in = self._due()
                if not due:
                    await self._idle(wake_in)
                    continue
                try:
                    if self._waiting and time.monotonic() - self._head_read > HEAD_EVERY_S:
                        self.head = max(self.head, await self.store.head())
                        self._head_read = time.monotonic()
                    await self._serve(due)
                except Exception as exc:  # the store is down or busy: the members wait
                    if failing_since is None:  # once per outage, not once per retry
                        failing_since = time.monotonic()
                        log.error("reading the event store failed (%r); retrying", exc)
                    self._discard_reads()
                    await pace.wait()
                    continue
                if failing_since is not None:
                    log.warning(
                        "reading the event store again after %.1fs",
                        time.monotonic() - failing_since,
                    )
                    failing_since = None
                pace.delay = pace.initial_s
        finally:
            self._discard_reads()
            if self._applying:  # the tasks' close ends them (the checkpoint holds)
                await asyncio.gather(*self._pending(), return_exceptions=True)
            self._reap()

    def _due(self) -> tuple[list[Replayed], float]:
        """The members to serve now (none applying a share; a follower that found
        nothing new waits a poll interval), and the seconds until the next is due."""
        now = time.monotonic()
        due: list[Replayed] = []
        wake_in = self.poll_s
        for task in self._members():
            if task in self._applying:
                continue
            polled = self._polled.get(task)
            if polled is not None and now - polled < self.poll_s:
                wake_in = min(wake_in, self.poll_s - (now - polled))
                continue
            due.append(task)
        for retry in self._retry_at.values():
            wake_in = min(wake_in, max(0.0, retry - now))
        return due, wake_in

    async def _idle(self, wake_in: float) -> None:
        """Until a share is applied, a member joins or ``wake_in`` seconds pass."""
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            wake_in = max(wake_in, 0.001)
            await asyncio.wait([woken, *self._pending()], timeout=wake_in, return_when=FIRST)
        finally:
            woken.cancel()
        if self._joined:  # a member joined or changed: look at the head again
            self._joined = False
            self._polled.clear()

    async def _serve(self, due: list[Replayed]) -> None:
        """Give each of ``due`` its share of the read at its position: live followers
        first (the store is their live source), then whole partitions catching up, then
        lanes building beside live ones (see :func:`_by_kind`)."""
        for group in _by_kind(due):
            while group:
                read = await self._chunk(min(t.history_position() for t in group))
                group = self._dispatch(group, read)
        self._evict()

    async def _chunk(self, start: int) -> _Read:
        """The read holding ``start``: a full chunk read before, the one read ahead, or
        a new read (a full one starts the read of the next chunk meanwhile)."""
        for read in self._reads.values():
            if read.start <= start < read.end:
                return read
        ahead = self._ahead
        if ahead is not None and ahead[0] == start:
            self._ahead = None
            number, rows = ahead[1], await ahead[2]
        else:
            number = self._issue()
            rows = await self._read(start)
        end = rows[-1][0] + 1 if rows else start
        read = _Read(number, start, end, len(rows) < self.chunk, rows)
        self.head = max(self.head, read.end - 1)  # at least what was read
        if not read.at_head:
            self._reads[read.start] = read
            if self._ahead is None and read.end not in self._reads:
                reading = asyncio.create_task(self._read(read.end))
                self._ahead = (read.end, self._issue(), reading)
        self._progress.head = max(self._progress.head, self.head)
        return read

    async def _read(self, start: int) -> list[StoredRow]:
        self.reads += 1
        return await self.store.read_rows(start, self.chunk)

    def _dispatch(self, group: list[Replayed], read: _Read) -> list[Replayed]:
        """Start applying each member's share of ``read``; at the store's head, release
        the members that have everything. Returns the members ``read`` does not hold:
        beyond it, or now below its start (their next read starts lower)."""
        beyond: list[Replayed] = []
        for task in group:
            position = task.history_position()
            if position < read.start:
                # It moved below the read while the read was made (a build joined the
                # store's followers at a lower position): a share cut from here would
                # miss its events from ``position`` up to ``read.start``.
                beyond.append(task)
                continue
            if position >= read.end:
                if not read.at_head:
                    beyond.append(task)
                elif not self._release(task, read):
                    self._polled[task] = time.monotonic()  # nothing new: poll later
                continue
            self._polled.pop(task, None)
            topic = task.topic
            share = mine = read.share(
                topic.partitions, topic.partitioner, task.partition, self._split
            )
            if position > read.start:  # applied in part already (a retry, a later start)
                share = share[bisect_left(share, position, key=lambda i: read.rows[i][0]) :]
            self._progress.chunk(task, len(read.rows), len(mine), len(share), read.end)
            deliveries = Share(read.rows, share, task.topic.name, task.partition)
            applying = asyncio.create_task(self._apply(task, deliveries, read, position))
            self._applying[task] = applying, read
        return beyond

    def _pending(self) -> list[asyncio.Task[bool]]:
        return [applying for applying, _ in self._applying.values()]

    async def _apply(self, task: Replayed, deliveries: Share, read: _Read, start: int) -> bool:
        """Apply ``task``'s share of ``read`` from ``start`` (its checkpoint commits it)."""
        self._progress.applying(task, deliveries)
        try:
            return await task.apply_history(deliveries, read.end, start)
        finally:
            self._progress.applied(task)
            self._wake.set()

    def _reap(self) -> None:
        """Take the results of the shares applied: a failed member waits to retry, one
        at the store's head is released (what a member raised ends the feed)."""
        now = time.monotonic()
        for task, (applying, read) in list(self._applying.items()):
            if not applying.done():
                continue
            del self._applying[task]
            ok = not applying.cancelled() and applying.result()
            self._progress.note_stuck(task, not ok, read.rows)
            if not ok:  # an event failed under Redeliver: that member waits
                self._retry_at[task] = now + task.retry_pause_s()
            elif read.at_head:
                self._release(task, read)
        self._progress.finish(self._waiting)

    def _release(self, task: Replayed, read: _Read) -> bool:
        """Release ``task`` when it applied everything up to the end of ``read``, a read
        at the store's head (a ``fresh`` catch-up: only a read issued after its call)."""
        if task not in self._waiting or task.history_position() < read.end:
            return False
        if self._after.get(task, -1) >= read.number:
            return False
        self._caught_up(task)
        return True

    def _issue(self) -> int:
        """Number a read about to start: it sees everything stored before now."""
        self._issued += 1
        return self._issued

    def _evict(self) -> None:
        """Forget the chunks read that no member needs any more (and keep a few)."""
        members = [*self._waiting, *self._following]
        low = min((t.history_position() for t in members), default=None)
        for start, read in sorted(self._reads.items()):
            if low is None or read.end <= low or len(self._reads) > KEPT_READS:
                del self._reads[start]

    def _discard_reads(self) -> None:
        self._reads.clear()
        _discard(self._ahead)
        self._ahead = None

    def _members(self) -> list[Replayed]:
        """The tasks to feed now: catching up or following, and not waiting to retry."""
        now = time.monotonic()
        for task, due in list(self._retry_at.items()):
            if due <= now or task.stopped:
                del self._retry_at[task]
        for task, future in list(self._waiting.items()):
            if task.stopped and not future.done():
                self._progress.leave(task, caught_up=False)
                future.set_result(None)  # it takes no more events here: its wait ends
        waiting = [t for t in self._waiting if t.catching_up and t not in self._retry_at]
        following = [t for t in self._following if t.live and t not in self._retry_at]
        self._following.difference_update([t for t in self._following if t.stopped])
        return waiting + following

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
        for i, (_, sid, _, _) in enumerate(rows):
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
            self._progress.leave(task, caught_up=True)
            future.set_result(None)

    def status(self) -> dict[str, object]:
        return {
            "head": self.head,
            "catching_up": len(self._waiting),
            "reads": self.reads,
            "progress": self._progress.status(),
        }


def _by_kind(members: list[Replayed]) -> list[list[Replayed]]:
    """``members`` as live followers (the store is their live source), whole partitions
    catching up, then lanes building beside live ones: a partition goes live as soon as
    it is done, and neither waits for a build's read."""
    live = [t for t in members if t.live]
    whole = [t for t in members if not t.live and not t.building]
    groups = [live, whole, [t for t in members if t.building and not t.live]]
    return [group for group in groups if group]


class _Read:
    """One read of the store: its rows from ``start`` up to ``end`` (exclusive), whether
    it reached the head, and each partition's share (computed once per read)."""

    __slots__ = ("at_head", "end", "number", "rows", "shares", "start")

    def __init__(self, number: int, start: int, end: int, at_head: bool, rows: list[StoredRow]):
        self.number, self.start, self.end, self.at_head, self.rows = (
            number,
            start,
            end,
            at_head,
            rows,
        )
        self.shares: dict[tuple[int, Partitioner], list[list[int]]] = {}

    def share(
        self,
        n: int,
        by: Partitioner,
        partition: int,
        split: Callable[[list[StoredRow], int, Partitioner], list[list[int]]],
    ) -> list[int]:
        """The indexes of the rows of ``partition`` among ``n``, placed by ``by``."""
        shares = self.shares.get((n, by))
        if shares is None:
            shares = self.shares[n, by] = split(self.rows, n, by)
        return shares[partition]


def _discard(prefetch: tuple[int, int, asyncio.Task[list[StoredRow]]] | None) -> None:
    """Drop a read ahead that is not wanted, without leaving its error unretrieved."""
    if prefetch is not None:
        prefetch[2].cancel()
        prefetch[2].add_done_callback(lambda t: t.cancelled() or t.exception())
