"""The partition task: the life of one source partition, the same for every transport.

Between assignment and revocation the task opens the partition's store, restores it
from its changelog, replays the event store when the agent has a history (catch-up),
hands over to live deliveries, runs batches through the agent, commits them in the one
documented order (:meth:`PartitionTask._commit`), rewinds with back-off when a commit
fails, and parks what the policy parks. The transport only gives it a
:class:`~streamapp.engine.port.PartitionPort` and, when state must survive a move, a
:class:`~streamapp.engine.port.Changelog`.

While the task works (a batch, a restore, a catch-up), its partition is paused at the
source, so the transport's poll loop keeps polling (heartbeats, other partitions).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import structured
from ..agent import Agent, BatchResult, run_batch
from ..errors import ConfigError, FencedError, StoreFormatError
from ..events import Event
from ..outcomes import FailurePolicy, Outcome, Redeliver
from ..settings import Settings
from ..tables.checkpoint import Checkpoint
from ..tables.partition import PartitionTables, spaces_for
from ..tables.store import Store
from .attempts import Attempts
from .delivery import STORE_POSITION_HEADER, Decoder, Delivery, Parker
from .metrics import NO_METRICS, TaskMetrics
from .pace import Pace, pause
from .phase import Phase
from .port import Changelog, PartitionPort

log = logging.getLogger("streamapp.partition")

StoreOpener = Callable[[list[str]], Store]
"""Opens the partition's store with these spaces (blocking: called in a thread)."""


class HistoryFeed(Protocol):
    """Replays the event store into tasks that catch up (one reader per worker)."""

    async def catch_up(self, task: PartitionTask) -> None:
        """Return once ``task``'s tables hold every stored event of its partition up to
        the store's head (the feed calls :meth:`PartitionTask.apply_history`)."""

    async def live_start(self, task: PartitionTask) -> int | None:
        """Where the live source should start after the handover (None: unknown)."""
        ...


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """The settings a task reads (see :class:`~streamapp.settings.Settings`)."""

    max_batch_records: int = 2000
    batch_budget_s: float = 10.0
    redeliver_pause_s: float = 0.5
    redeliver_backoff_max_s: float = 30.0
    """Pauses before redeliveries of one delivery double up to this."""
    close_budget_s: float = 30.0
    policy_pauses: bool = True
    """Honour ``Redeliver(pause_s=...)``; the memory broker retries at once instead."""
    replay_on_open: bool = False
    """Replay the event store from the checkpoint's store position at every open, caught
    up or not: RabbitMQ keeps no changelog, so a partition that was away may have been
    applied by another worker meanwhile (live deliveries carrying their store position,
    :data:`STORE_POSITION_HEADER`, keep that replay short)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> TaskConfig:
        return cls(
            max_batch_records=settings.max_batch_records,
            batch_budget_s=settings.batch_budget_ms / 1000,
            redeliver_pause_s=settings.poll_timeout_ms / 1000,
            redeliver_backoff_max_s=settings.redeliver_backoff_max_ms / 1000,
            close_budget_s=settings.rebalance_timeout_ms / 2000,
        )

    def first_pause_s(self, policy: FailurePolicy) -> float:
        """The pause before the first redelivery under ``policy``."""
        if isinstance(policy, Redeliver) and policy.pause_s is not None and self.policy_pauses:
            return policy.pause_s
        return self.redeliver_pause_s


class PartitionTask:
    """Processes one partition of one agent's source."""

    def __init__(
        self,
        agent: Agent,
        partition: int,
        port: PartitionPort,
        *,
        name: str,
        config: TaskConfig,
        decode: Decoder,
        park: Parker,
        open_store: StoreOpener | None = None,
        changelog: Changelog | None = None,
        history: HistoryFeed | None = None,
        metrics: TaskMetrics = NO_METRICS,
    ) -> None:
        self.agent, self.partition, self.port, self.name = agent, partition, port, name
        self.config, self._decode, self._park_with = config, decode, park
        self.metrics = metrics
        self._open_store, self.changelog, self.history = open_store, changelog, history
        self.phase = Phase.RESTORING
        self.busy = False
        self.tables: PartitionTables | None = None
        self.next_position: int | None = None
        self.start_position: int | None = None
        self.processed = 0
        self.restored = 0
        self.replayed = 0
        self.unversioned = 0
        """Events applied without ``streamversion`` (at-least-once: see BatchResult)."""
        self._tracks = self.config.replay_on_open and agent.history is not None
        """Live deliveries advance the checkpoint's store position (their header)."""
        self._check_gap = False
        """Before the next live batch, replay what the store holds below its first store
        position (see :meth:`recheck`)."""
        self.history_next = 1
        """The next store position known here: ahead of the checkpoint when chunks had
        nothing for this partition (not worth a commit), or for a task without tables."""
        self.follows_store = False
        """True when the event store is this task's live source (STREAMAPP_BROKER=none)."""
        self.outcomes: dict[Outcome, int] = {}
        """Outcomes of every delivery handled, live and replayed."""
        self.attempts = Attempts(
            config.first_pause_s(agent.on_failure), config.redeliver_backoff_max_s
        )
        """Failed attempts of the delivery this partition is stuck at (Redeliver's bound)."""
        self._opening: asyncio.Task[None] | None = None
        self._batch: asyncio.Future[Any] | None = None
        self._reseek = False
        self._closing = asyncio.Event()

    # lifecycle -------------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        """True when live deliveries may be fed (live and idle)."""
        return self.phase is Phase.LIVE and not self.busy

    def start(self) -> None:
        """Pause the partition, then open, restore and catch up in the background."""
        self.port.pause()
        self._opening = asyncio.create_task(self.open(), name=f"open {self.name}")
        self._opening.add_done_callback(self._opening_done)

    def _opening_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s: cannot open: %s; the partition stays paused", self.name, task.exception()
            )
            self.phase = Phase.LOST

    async def open(self) -> None:
        """Open, restore, catch up and go live, retrying with back-off: a partition is
        never left paused without an owner task (a lock still held, a broker hiccup)."""
        pace = Pace(self._closing)
        while self.phase in (Phase.RESTORING, Phase.CATCHING_UP):
            try:
                await self._open_tables()
                await self._catch_up()
                await self._go_live()
                return
            except asyncio.CancelledError:
                raise
            except FencedError as exc:
                self._lost(exc)
                return
            except (ConfigError, StoreFormatError):
                raise  # no retry helps: the opening task reports it and the partition is lost
            except Exception as exc:
                log.error("%s: opening failed (%r); retrying in %.1fs", self.name, exc, pace.delay)
                await self._release()
                if self._closing.is_set():
                    return
                self.phase = Phase.RESTORING
                await pace.wait()

    async def close(self) -> None:
        """Finish the batch in hand (it commits), then close the changelog and store."""
        self.phase = Phase.CLOSED
        self._closing.set()  # ends a redelivery pause and stops between chunks
        batch = self._batch
        if batch is not None and not batch.done():
            budget = self.config.close_budget_s
            try:
                await asyncio.wait_for(asyncio.shield(batch), budget)
            except Exception as exc:
                log.warning("%s: batch did not finish in %.0fs: %r", self.name, budget, exc)
        for task in (self._opening, batch):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._release()
        log.info("closed %s at position %s", self.name, self.next_position)

    async def _release(self) -> None:
        """Close the changelog and the store, whatever fails on the way."""
        tables, self.tables = self.tables, None
        try:
            if self.changelog is not None:
                await self.changelog.close()
        except Exception as exc:
            log.warning("%s: closing the changelog failed: %r", self.name, exc)
        finally:
            if tables is not None:
                tables.store.close()

    def _lost(self, exc: BaseException) -> None:
        self.phase = Phase.LOST
        log.error(
            "%s: another worker took the partition over (%r); this worker no longer owns it "
            "and leaves it paused until the group revokes it",
            self.name,
            exc,
        )

    # opening -----------------------------------------------------------------------
    async def _open_tables(self) -> None:
        agent = self.agent
        if not agent.tables or self._open_store is None:
            return
        opener = self._open_store
        opening = asyncio.ensure_future(asyncio.to_thread(opener, spaces_for(agent.tables)))
        try:  # the open may wait for a previous owner's lock: off the loop
            store = await asyncio.shield(opening)
        except asyncio.CancelledError:  # closed meanwhile: close the store once open
            opening.add_done_callback(_close_when_opened)
            raise
        try:
            self.tables = PartitionTables(
                agent.tables, store, self.partition, agent.topic.partitions, where=self.name
            )
        except BaseException:
            store.close()
            raise
        if self.changelog is not None:
            self.restored = await self.changelog.open(self.tables)
            self.metrics.restored(agent.name, self.restored)

    async def _catch_up(self) -> None:
        tables = self.tables
        if self.agent.history is None or tables is None:
            return
        if tables.checkpoint.caught_up and not self.config.replay_on_open:
            return
        if self.history is None:
            raise ConfigError(
                f"agent {self.agent.name!r} declares a history, but this worker has no "
                "event store feed for it (setting event_store)"
            )
        self.phase = Phase.CATCHING_UP
        await self.history.catch_up(self)
        if self.phase is not Phase.CATCHING_UP:
            return
        await self._commit(
            tables.checkpoint.advanced(caught_up=True, history=self.history_position()), None
        )
        log.info("%s caught up at store position %s", self.name, tables.checkpoint.history)

    async def _go_live(self) -> None:
        """Start live delivery where this partition's state stands, then resume it."""
        if self.phase not in (Phase.RESTORING, Phase.CATCHING_UP):
            return
        tables = self.tables
        if tables is None:
            start = await self.port.begin(None, stateful=False)
        else:
            position = tables.checkpoint.live
            from_history = position is None and self.agent.history is not None
            if from_history and self.history is not None:
                position = await self.history.live_start(self)
            start = await self.port.begin(position, stateful=True, earliest=from_history)
        if self._closing.is_set():  # closed while the source began: stay closed
            return
        self.next_position = self.start_position = start
        self._reseek = False
        self._check_gap = self._tracks
        self.phase = Phase.LIVE
        self.port.resume()
        log.info("live %s at position %d", self.name, start)

    # live deliveries -----------------------------------------------------------------
    def feed(self, deliveries: Sequence[Delivery]) -> None:
        """Take fetched deliveries: process them in the background, partition paused."""
        start = self.next_position or 0
        if deliveries and deliveries[0].position < start:  # already applied (a seek raced)
            deliveries = [d for d in deliveries if d.position >= start]
        if not deliveries:
            return
        self.busy = True
        self.port.pause()
        self._batch = asyncio.create_task(self.process(deliveries), name=f"batch {self.name}")
        self._batch.add_done_callback(self._batch_done)

    def recheck(self) -> None:
        """The source may have changed hands under this task (a queue with single active
        consumer, after an open or a reconnect): before the next live batch, events of
        this partition stored below that batch's first store position, which another
        consumer may have taken and acked, are replayed from the store."""
        self._check_gap = self._tracks

    async def _close_gap(self, deliveries: Sequence[Delivery]) -> None:
        first = _store_position(deliveries[:1])
        if first is None or first <= self.history_position() or self.history is None:
            return
        tables = self.tables
        assert tables is not None
        before = self.outcomes.get(Outcome.DELIVERED, 0)
        self.phase = Phase.CATCHING_UP
        replay = asyncio.ensure_future(self.history.catch_up(self))
        closing = asyncio.ensure_future(self._closing.wait())
        await asyncio.wait({replay, closing}, return_when=asyncio.FIRST_COMPLETED)
        for waiting in (replay, closing):  # a close ends the wait (the feed drops it)
            if not waiting.done():
                waiting.cancel()
        await asyncio.gather(replay, closing, return_exceptions=True)
        if self.phase is not Phase.CATCHING_UP or self._closing.is_set():
            return
        await self._commit(tables.checkpoint.advanced(history=self.history_position()), None)
        self.phase = Phase.LIVE
        applied = self.outcomes.get(Outcome.DELIVERED, 0) - before
        if applied:
            log.info(
                "%s: the first live event is at store position %d, beyond this partition's "
                "own: replayed the store up to its head first (%d applied; some may have "
                "been taken from the queue by another consumer)",
                self.name,
                first,
                applied,
            )

    def dropped(self) -> None:
        """Deliveries arrived while not accepting: rewind before resuming."""
        self._reseek = True

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: batch task died: %r", self.name, task.exception())
            self.phase = Phase.LOST

    async def process(self, deliveries: Sequence[Delivery]) -> None:
        """Run live ``deliveries`` (in order) through the agent, commit, then resume."""
        config = self.config
        wait_s = 0.0
        try:
            if self._check_gap:
                self._check_gap = False
                await self._close_gap(deliveries)
            size = config.max_batch_records
            for i in range(0, len(deliveries), size):
                if self.phase is not Phase.LIVE:  # closed: the next owner starts at our checkpoint
                    return
                chunk = deliveries[i : i + size]
                result = await self._run(chunk, self._decode, config.batch_budget_s)
                if result.settled:
                    position = chunk[result.settled - 1].position + 1
                    stored = _store_position(chunk[: result.settled]) if self._tracks else None
                    await self._commit_live(position, result.settled, stored)
                if result.settled < len(chunk):
                    self._rewind(chunk[result.settled].position)
                    if result.redeliver:
                        self.metrics.redelivery(self.agent.name)
                        wait_s = self.attempts.pause_s()
                    break
        except FencedError as exc:
            self._lost(exc)
            return
        except Exception as exc:
            log.error("%s: batch failed, rewinding to %s: %r", self.name, self.next_position, exc)
            if not await self._recover():
                return
            wait_s = config.redeliver_pause_s
        await pause(self._closing, wait_s)
        if self.phase is not Phase.LIVE:
            return
        if self._reseek and self.next_position is not None:
            self._rewind(self.next_position)
        self.busy = False
        self.port.resume()

    async def _run(self, chunk: Sequence[Delivery], decode: Decoder, budget: float) -> BatchResult:
        started = time.perf_counter()
        attempts = self.attempts
        result = await run_batch(
            self.agent,
            chunk,
            self.tables,
            decode,
            self._park,
            budget,
            failed_before=attempts.before,
        )
        if result.failure is not None:
            attempts.failed_at(chunk[result.settled].position, result.failure.reason)
        outcomes = self.outcomes
        for outcome, n in result.counts.items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
        if result.unversioned:
            self.unversioned += result.unversioned
            self.metrics.unversioned(self.agent.name, result.unversioned)
        handled = result.settled + (result.failure is not None)
        self.metrics.batch(self.agent.name, handled, time.perf_counter() - started, result.counts)
        return result

    async def _park(self, delivery: Delivery, reason: str) -> bool:
        parked = await self._park_with(delivery, reason)
        if parked:
            self.metrics.parked(self.agent.name)
        return parked

    async def _commit_live(self, position: int, settled: int, stored: int | None = None) -> None:
        tables = self.tables
        cp = tables.checkpoint.advanced(live=position) if tables is not None else Checkpoint()
        if stored is not None and tables is not None and stored >= (cp.history or 1):
            cp = cp.advanced(history=stored + 1)
        await self._commit(cp, position)
        self.attempts.settled(position)
        self.next_position = position
        self.processed += settled

    def _rewind(self, position: int) -> None:
        self.port.rewind(position)
        self._reseek = False

    # event-store history -----------------------------------------------------------
    def history_position(self) -> int:
        """The next event-store position this partition needs (1: nothing replayed)."""
        tables = self.tables
        if tables is None:
            return self.history_next
        return max(tables.checkpoint.history or 1, self.history_next)

    async def apply_history(self, deliveries: Sequence[Delivery], next_position: int) -> bool:
        """Apply stored events of this partition, read up to ``next_position`` (exclusive),
        and commit with the store position. False when an event failed under Redeliver:
        the position stops before it, and the feed tries again after
        ``self.attempts.pause_s()``; once a bounded Redeliver's attempts are spent, its
        fallback applies as to live deliveries."""
        live_from_store = self.phase is Phase.LIVE and self.follows_store
        if self.phase is not Phase.CATCHING_UP and not live_from_store:
            return False  # handed over (or closed): the live source feeds it now
        work = asyncio.ensure_future(self._apply_history(deliveries, next_position))
        self._batch = work
        try:
            ok = await asyncio.shield(work)
        except FencedError as exc:
            self._lost(exc)
            return False
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the feed itself is stopping
            return False  # close() gave up on this chunk: the checkpoint holds
        except Exception as exc:  # a failed commit: the checkpoint still holds
            log.error("%s: replayed batch failed (%r); it is read again", self.name, exc)
            await self._recover()
            return False
        return ok

    async def _apply_history(self, deliveries: Sequence[Delivery], next_position: int) -> bool:
        """Commits in parts of at most ``batch_budget_s`` each, as live batches do: a slow
        handler never holds a whole store chunk (up to 10,000 events) uncommitted."""
        if not deliveries:  # nothing of this partition: advance without a commit
            self.history_next = max(self.history_next, next_position)
            return True
        budget = self.config.batch_budget_s
        while True:
            result = await self._run(deliveries, decode_stored, budget)
            cut = result.settled < len(deliveries)
            done = deliveries[result.settled].position if cut else next_position
            tables = self.tables
            if result.settled or not cut:
                if tables is not None:
                    await self._commit(tables.checkpoint.advanced(history=done), None)
                self.attempts.settled(done)
                self.history_next = done
            self.replayed += result.settled
            self.metrics.replayed(self.agent.name, result.settled)
            if result.redeliver:
                self.metrics.redelivery(self.agent.name)
            if not cut:
                return True
            if result.failure is not None or self._closing.is_set():
                return False
            deliveries = deliveries[result.settled :]  # out of budget: commit, go on

    # the commit order --------------------------------------------------------------
    async def _commit(self, checkpoint: Checkpoint, settle_at: int | None) -> None:
        """Commit the open batch with ``checkpoint``. The one commit order of streamapp:

        1. the changelog gets the batch's changes and checkpoint, atomically (on Kafka a
           transaction; a new owner restores only committed batches);
        2. the store gets the same changes and checkpoint in one atomic write;
        3. the source settles up to ``settle_at`` (offset commit, acks).

        A crash between 1 and 2 leaves the store behind its changelog: the next open
        restores the tail. A crash between 2 and 3 leaves the source behind the store:
        the checkpoint says where to resume, and the stream-version guard skips what a
        redelivery repeats. Nothing is settled before it is durable in the table.
        """
        started = time.perf_counter()
        tables = self.tables
        if tables is not None:
            batch = tables.take_batch(checkpoint)
            position = await self.changelog.write(batch) if self.changelog is not None else None
            # Synchronous on purpose: rocksdict holds the GIL while writing, so a thread
            # would not free the loop, and a write must never race the store's close.
            tables.write(batch, position)
        if settle_at is not None:
            await self.port.settle(settle_at)
        self.metrics.commit(self.agent.name, time.perf_counter() - started)

    async def _recover(self) -> bool:
        """After a failed commit: drop the batch, reset the changelog writer, rewind to
        the checkpoint. Retries with back-off while the partition is ours."""
        pace = Pace(self._closing)
        while self.phase in (Phase.LIVE, Phase.CATCHING_UP):
            try:
                if self.tables is not None:
                    self.tables.drop_batch()
                if self.changelog is not None:
                    await self.changelog.reset()
                if self.next_position is not None and self.phase is Phase.LIVE:
                    self._rewind(self.next_position)
                return True
            except FencedError as exc:
                self._lost(exc)
                return False
            except Exception as exc:
                log.error("%s: rewind failed (%r); retrying in %.1fs", self.name, exc, pace.delay)
                await pace.wait()
        return False

    @property
    def lag(self) -> int | None:
        """Live deliveries of this partition not yet committed, when the transport knows
        the partition's end cheaply (None: unknown, or not live yet)."""
        end = self.port.end()
        if end is None or self.next_position is None:
            return None
        return max(end - self.next_position, 0)

    def table_sizes(self) -> dict[str, int]:
        """Keys per table of this partition, where the store knows cheaply."""
        tables = self.tables
        if tables is None:
            return {}
        out = {}
        for table in tables.tables:
            n = tables.store.count(table.data_space)
            if n is not None:
                out[table.name] = n
        return out

    def status(self) -> dict[str, object]:
        cp = self.tables.checkpoint if self.tables is not None else None
        return {
            "agent": self.agent.name,
            "topic": self.agent.topic.name,
            "partition": self.partition,
            "phase": self.phase.value,
            "busy": self.busy,
            "start_position": self.start_position,
            "next_position": self.next_position,
            "lag": self.lag,
            "processed": self.processed,
            "restored": self.restored,
            "replayed": self.replayed,
            "unversioned": self.unversioned,
            "outcomes": {o.value: n for o, n in sorted(self.outcomes.items(), key=_by_value)},
            "store_position": None if cp is None else cp.history,
            "caught_up": None if cp is None else cp.caught_up,
            "checkpoint": None if cp is None else cp.live,
        }


def _by_value(item: tuple[Outcome, int]) -> str:
    return item[0].value


def _store_position(deliveries: Sequence[Delivery]) -> int | None:
    """The highest event-store position the forwarder stamped on ``deliveries``."""
    best: int | None = None
    for delivery in deliveries:
        for name, value in delivery.headers:
            if name == STORE_POSITION_HEADER:
                try:
                    position = int(value)
                except ValueError:
                    break
                if best is None or position > best:
                    best = position
                break
    return best


def decode_stored(delivery: Delivery) -> Event:
    """A stored event: structured JSON in the delivery's value."""
    return structured.from_stored(delivery.value or b"")


def _close_when_opened(opening: asyncio.Future[Store]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
