"""The replay of one partition from the event store: catch-up, gap closing, following
the store (Kafka Streams' ``StoreChangelogReader``, for the event store).

The worker's one event-store reader (:class:`~streamapp.catchup.StoreFeed`, a
:class:`~.task_surface.HistoryFeed`) sees a partition only through
:class:`~.task_surface.Replayed` (both importable from here too). The task owns its
:class:`Replay` and says when it replays.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from ..codecs import structured
from ..errors import ConfigError, FencedError, StoreCorruptError
from ..events import Event
from ..failures.outcomes import Outcome
from ..records import Delivery
from ..tables.checkpoint import Checkpoint
from .attempts import Attempts
from .delivery import STORE_POSITION_HEADER
from .lane import Lane
from .phase import Phase
from .run import SKIP, run_lanes
from .status import outcomes_of
from .task_surface import HistoryFeed, TaskSurface
from .task_surface import Replayed as Replayed  # importable from here, as before

log = logging.getLogger("streamapp.partition")


class Replay:
    """One task's replay of the event store (a :class:`Replayed` for the feed)."""

    def __init__(self, task: TaskSurface, history: HistoryFeed | None) -> None:
        self._task, self.history = task, history
        self.name, self.topic, self.partition = task.name, task.topic, task.partition
        self.lanes: list[Lane] = []
        """The lanes the event store feeds: catching up, or following the store."""
        self.follows_store = False
        """True when the event store is this task's live source (STREAMAPP_BROKER=none)."""
        self.check_gap = False
        """Before the next live batch, replay what the store holds below its first store
        position (see :meth:`recheck`)."""

    # Replayed ------------------------------------------------------------------------
    @property
    def replayed(self) -> int:
        return self._task.counts.replayed

    @property
    def catching_up(self) -> bool:
        return self._task.phase is Phase.CATCHING_UP

    @property
    def live(self) -> bool:
        return self._task.phase is Phase.LIVE

    @property
    def building(self) -> bool:
        return False

    @property
    def stopped(self) -> bool:
        return self._task.phase.stopped

    def history_position(self) -> int:
        lanes = self.lanes or [lane for lane in self._task.lanes if not lane.building]
        return min(lane.history_position() for lane in lanes or self._task.lanes)

    def retry_pause_s(self) -> float:
        """The longest pause of the lanes failing at the event."""
        failing = [lane.attempts.pause_s() for lane in self._task.lanes if lane.attempts.failed]
        return max(failing, default=self._task.config.redeliver_pause_s)

    def failing(self) -> list[Attempts]:
        applied = self.history_position()  # the failing event is at or after it
        return [
            lane.attempts
            for lane in self._task.lanes
            if lane.attempts.position is not None and lane.attempts.position >= applied
        ]

    def stuck(self, on: dict[str, object] | None) -> None:
        self._task.counts.stuck_on = on

    def follow(self, on: bool) -> None:
        self.follows_store = on

    def start_following(self, head: int) -> None:
        """The event store is the live source from now on (``STREAMAPP_BROKER=none``):
        agents without tables start after ``head``, the others at their checkpoint."""
        self.follows_store = True
        for lane in self._task.lanes:
            if lane.tables is None:
                lane.history_next = head + 1

    async def apply_history(
        self, deliveries: Sequence[Delivery], next_position: int, start: int
    ) -> bool:
        """Apply stored events of this partition, read from ``start`` up to
        ``next_position`` (exclusive), and commit with the store position. A lane below
        ``start`` (a build that joined the store's followers after the share was cut) is
        left where it stands: the share does not hold its events. False when an event
        failed under Redeliver: the position stops before it, and the feed tries again
        after :meth:`retry_pause_s`; once a bounded Redeliver's attempts are spent, its
        fallback applies as to live deliveries."""
        task = self._task
        live_from_store = task.phase is Phase.LIVE and self.follows_store
        if task.phase is not Phase.CATCHING_UP and not live_from_store:
            return False  # handed over (or closed): the live source feeds it now
        work = asyncio.ensure_future(
            self._apply_live(deliveries, next_position, start, live_from_store)
        )
        task.track(work)
        try:
            ok = await asyncio.shield(work)
        except FencedError as exc:
            task.mark_lost(exc)
            return False
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the feed itself is stopping
            return False  # close() gave up on this chunk: the checkpoint holds
        except StoreCorruptError:
            for lane in task.lanes:
                lane.drop()
            return False  # the store told the task: it is rebuilt, then fed again
        except Exception as exc:  # a failed commit: the checkpoint still holds
            log.error("%s: replayed batch failed (%r); it is read again", self.name, exc)
            await task.recover()
            return False
        return ok

    async def _apply_live(
        self, deliveries: Sequence[Delivery], next_position: int, start: int, live: bool
    ) -> bool:
        """:meth:`_apply`; live from the store, in turns with a lane building beside
        (a catch-up or a rebuild has the partition to itself: no turn, the rebuild may
        hold it)."""
        if not live:
            return await self._apply(deliveries, next_position, start)
        async with self._task.turn:
            return await self._apply(deliveries, next_position, start)

    async def _apply(self, deliveries: Sequence[Delivery], next_position: int, start: int) -> bool:
        """Commits in parts of at most ``batch_budget_s`` each, as live batches do: a slow
        handler never holds a whole store chunk (up to 10,000 events) uncommitted."""
        task = self._task
        lanes = [lane for lane in self.lanes or task.lanes if lane.history_position() >= start]
        if not lanes:
            return True  # every lane is behind the share: the next one starts lower
        budget = task.config.batch_budget_s
        while True:
            done, deliveries = await apply_part(task, lanes, deliveries, next_position, budget)
            if done is not None:
                return done

    # what the task replays -------------------------------------------------------------
    async def catch_up(self) -> None:
        """At the open: replay the lanes not caught up (every lane that replays: a history,
        or the store as the only source; all of them where each open replays) up to the
        store's head, and mark them caught up."""
        task = self._task
        replay_all = task.config.replay_on_open
        lanes = [
            lane
            for lane in task.lanes
            if lane.replays
            and lane.tables is not None
            and not lane.building  # it catches up on its own (engine.build)
            and (replay_all or not lane.tables.checkpoint.caught_up)
        ]
        if not lanes:
            return
        if self.history is None:
            raise ConfigError(
                f"agent {lanes[0].name!r} declares a history, but this worker has no "
                "event store feed for it (setting event_store)"
            )
        self.lanes = lanes
        task.transition_if_open(Phase.CATCHING_UP)  # closed while opening: run() ends at once
        await self.run()
        if task.phase is not Phase.CATCHING_UP:
            return
        done = {lane: lane.history_position() for lane in lanes}
        marked = asyncio.ensure_future(task.commit(None, history_at(done, caught_up=True)))
        try:
            await asyncio.shield(marked)
        finally:  # a close meanwhile waits for the marker: its line tells what is durable
            if not marked.done():
                await asyncio.wait([marked])
            if not marked.cancelled() and marked.exception() is None:
                position = min(done.values()) - 1
                log.debug("%s caught up at store position %s", self.name, position)

    def recheck(self) -> None:
        """The source may have changed hands (see :meth:`PartitionTask.recheck`)."""
        self.check_gap = any(lane.tracks for lane in self._task.lanes)

    async def close_gap(self, deliveries: Sequence[Delivery]) -> None:
        """Before a live batch: replay what the store holds below its first store
        position, when that is beyond the partition's own."""
        task = self._task
        lanes = [
            lane
            for lane in task.lanes
            if lane.tracks and lane.tables is not None and not lane.building
        ]
        first = store_position(deliveries[:1])
        if not lanes or first is None or self.history is None:
            return
        if first <= min(lane.history_position() for lane in lanes):
            return
        before = outcomes_of(task.lanes).get(Outcome.DELIVERED, 0)
        self.lanes = lanes
        async with task.turn:  # a building lane's part in hand commits first
            task.transition_if_open(Phase.CATCHING_UP)  # closed meanwhile: run() ends at once
        await self.run()  # a close ends the wait (the feed drops it)
        if task.phase is not Phase.CATCHING_UP or task.closing.is_set():
            return
        done = {lane: lane.history_position() for lane in lanes}
        await task.commit(None, history_at(done))
        self.lanes = []
        task.transition_if_open(Phase.LIVE)  # closed while committing: stays closed
        applied = outcomes_of(task.lanes).get(Outcome.DELIVERED, 0) - before
        if applied:
            log.info(
                "%s: the first live event is at store position %d, beyond this partition's "
                "own: replayed the store up to its head first (%d applied; some may have "
                "been taken from the queue by another consumer)",
                self.name,
                first,
                applied,
            )

    async def run(self) -> None:
        """The event-store feed's catch-up of :attr:`lanes`; a corrupt store found
        meanwhile ends it with that error, a close ends it quietly."""
        assert self.history is not None
        task = self._task
        replay = asyncio.ensure_future(self.history.catch_up(self))
        found = asyncio.ensure_future(task.state.damage_found.wait())
        closing = asyncio.ensure_future(task.closing.wait())
        waits = (replay, found, closing)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                if not waiting.done():
                    waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        for damage in task.state.damaged.values():
            raise StoreCorruptError(str(damage), path=damage.path, status=damage.status)
        if replay.done() and not replay.cancelled():
            replay.result()  # what the feed raised, if anything


async def apply_part(
    task: TaskSurface,
    lanes: Sequence[Lane],
    deliveries: Sequence[Delivery],
    next_position: int,
    budget_s: float,
) -> tuple[bool | None, Sequence[Delivery]]:
    """Run stored ``deliveries`` (in position order, read up to ``next_position``)
    through ``lanes`` (the task's other lanes skip them) for at most ``budget_s``, and
    commit what they reached with its store positions. Returns True once every delivery
    is applied, False when one failed (Redeliver), a lane refused or the task closes,
    and None with the rest when the budget ran out first (the caller goes on with it)."""
    if not deliveries:  # nothing of this partition: advance without a commit
        for lane in lanes:
            lane.history_next = max(lane.history_next, next_position)
        return True, deliveries
    metrics = task.metrics
    starts = [lane.history_position() if lane in lanes else SKIP for lane in task.lanes]
    run = await run_lanes(
        task.lanes, starts, deliveries, decode_stored, budget_s, metrics=metrics, peek=_stored
    )
    done = {
        lane: max(lane.history_position(), next_position if run.stop is None else reached)
        for lane, reached in zip(task.lanes, run.reached, strict=True)
        if lane in lanes
    }
    if run.stop is None or run.reached != starts:
        await task.commit(None, history_at(done))
        for lane, position in done.items():
            lane.history_next = max(lane.history_next, position)
            lane.attempts.settled(position)
    low = min(done.values())
    settled = below(deliveries, low)
    task.counts.replayed += settled
    for lane in lanes:
        lane.replayed += settled
        metrics.replayed(lane.name, settled)
    for lane in run.failed:
        metrics.redelivery(lane.name)
    if run.refused is not None:
        task.refuse(run.refused)
        return False, deliveries
    if run.stop is None:
        return True, deliveries
    if not run.cut or task.closing.is_set():
        return False, deliveries
    return None, deliveries[settled:]  # out of budget: go on with the rest


def below(deliveries: Sequence[Delivery], position: int) -> int:
    """How many of ``deliveries`` (in position order, as stored) lie below ``position``:
    a binary search (a share of a stored chunk makes a delivery per item read)."""
    return bisect_left(deliveries, position, key=_position)


def _position(delivery: Delivery) -> int:
    return delivery.position


_stored: Callable[[Any], tuple[str, int]] = attrgetter("stream_id", "version")
"""A stored delivery's stream id and version, from the store's columns
(:class:`~.stored.StoredDelivery`): the guard skips what its tables applied undecoded."""


def history_at(
    done: dict[Lane, int], *, caught_up: bool = False
) -> Callable[[Lane, Checkpoint], Checkpoint]:
    """Checkpoints advanced to the store positions in ``done`` (other lanes' unchanged)."""

    def advanced(lane: Lane, cp: Checkpoint) -> Checkpoint:
        if lane not in done:
            return cp
        cp = cp.advanced(history=done[lane])
        return cp.advanced(caught_up=True) if caught_up else cp

    return advanced


def store_position(deliveries: Sequence[Delivery]) -> int | None:
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
