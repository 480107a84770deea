"""A lane that catches up on its own while the partition's other lanes stay live.

A new table version (``Table("t", version=2)``, written by a new agent on the topic of
the agent writing version 1) joins a partition task whose lanes are live already: it
opens (restoring its own changelog, on Kafka) with the others, but its checkpoint is not
caught up. Holding the partition for its replay would stop the live lanes, so it builds
here instead (:class:`LaneBuild`): the worker's one event-store feed hands it its share
of each chunk from the lane's own store position, while the live lanes take live
deliveries and commit. Live runs skip a building lane and the source settles below the
slowest *live* lane only: a building lane never holds the source. Its replay commits in
parts of :data:`PART_S` taken between live batches (the task's ``turn``), so the live
lanes wait at most one part; a restart or a partition move finds its checkpoint (its
changelog, restored) and builds on from there.

The handover, and why no event is lost: every live event was in the store before the
forwarder published it. Once the feed reached the store's head for the lane, the lane
notes the live lanes' position ``L`` (every event below it was delivered, so stored,
before now), then waits for one more read of the store *issued after that* (the feed's
``fresh`` catch-up): that read covers every event below ``L``. The lane then goes live at
``L``: on an absolute source (Kafka) the partition rewinds to ``L`` and only the joining
lane runs what the others had already done; on a queue (RabbitMQ, which cannot rewind
what it acked) the partition is held (no live batch) for one more read of the store, and
the lane goes live where the partition stands; with the store as the live
source (``STREAMAPP_BROKER=none``) it simply joins the store's followers, whose positions
are the store's own. Events seen by both the replay and live deliveries are applied once
by the per-key stream-version rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..errors import FencedError, StoreCorruptError
from ..records import Delivery
from ..topics import TopicSpec
from .attempts import Attempts
from .lane import Lane
from .phase import LiveState, Phase
from .replay import apply_part, history_at
from .task_surface import HistoryFeed, TaskSurface

log = logging.getLogger("streamapp.partition")

PART_S = 0.05
"""The longest a building lane's replay holds the partition between two live batches."""
JOIN_POLL_S = 0.01
"""How often the handover looks for the partition idle between live batches."""


def building_lanes(task: TaskSurface) -> list[Lane]:
    """The lanes of ``task`` that catch up on their own: they need a replay (a history or
    the store as the only source, tables, a checkpoint not caught up) while another lane
    with tables already stands live (caught up, or with a live position). Without such a
    lane the task catches up as a whole first, as a new app does."""
    behind: list[Lane] = []
    standing = False
    for lane in task.lanes:
        tables = lane.tables
        if tables is None:
            continue
        cp = tables.checkpoint
        if lane.replays and not cp.caught_up:
            behind.append(lane)
        elif cp.caught_up or cp.live is not None:
            standing = True
    return behind if standing and task.history is not None else []


class LaneBuild:
    """The replay of a task's building lanes (a :class:`~.replay.Replayed` for the feed)."""

    def __init__(self, task: TaskSurface, lanes: Sequence[Lane], history: HistoryFeed) -> None:
        self._task, self.lanes, self.history = task, list(lanes), history
        agents = ", ".join(lane.name for lane in lanes)
        self.name = f"{task.name} (building {agents})"
        self.work: asyncio.Future[tuple[bool | None, Sequence[Delivery]]] | None = None
        """The part being applied (the task's close waits for it)."""
        self._runner: asyncio.Task[None] | None = None

    # Replayed ------------------------------------------------------------------------
    @property
    def topic(self) -> TopicSpec:
        return self._task.topic

    @property
    def partition(self) -> int:
        return self._task.partition

    @property
    def replayed(self) -> int:
        return sum(lane.replayed for lane in self.lanes)

    @property
    def catching_up(self) -> bool:
        return self._task.phase is Phase.LIVE and all(lane.building for lane in self.lanes)

    @property
    def live(self) -> bool:
        return False

    @property
    def building(self) -> bool:
        return True

    def _building(self) -> bool:
        return self.catching_up

    @property
    def stopped(self) -> bool:
        return self._task.phase.stopped or not any(lane.building for lane in self.lanes)

    def history_position(self) -> int:
        return min(lane.history_position() for lane in self.lanes)

    def retry_pause_s(self) -> float:
        failing = [lane.attempts.pause_s() for lane in self.lanes if lane.attempts.failed]
        return max(failing, default=self._task.config.redeliver_pause_s)

    def failing(self) -> list[Attempts]:
        applied = self.history_position()
        return [
            lane.attempts
            for lane in self.lanes
            if lane.attempts.position is not None and lane.attempts.position >= applied
        ]

    def stuck(self, on: dict[str, object] | None) -> None:
        self._task.counts.stuck_on = on

    def follow(self, on: bool) -> None:
        pass  # a building lane joins the task's own followers at its handover

    async def apply_history(
        self, deliveries: Sequence[Delivery], next_position: int, start: int
    ) -> bool:
        """Apply this share in parts of :data:`PART_S`, each between live batches (its
        lanes are the ones it was cut for: ``start`` holds for them)."""
        task = self._task
        while self.catching_up:
            if not await self._take_turn():
                return False
            try:
                part = apply_part(task, self.lanes, deliveries, next_position, PART_S)
                self.work = asyncio.ensure_future(part)
                try:
                    done, deliveries = await asyncio.shield(self.work)
                except FencedError as exc:
                    task.mark_lost(exc)
                    return False
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    return False
                except StoreCorruptError:
                    for lane in self.lanes:
                        lane.drop()
                    return False
                except Exception as exc:
                    log.error("%s: replayed batch failed (%r); it is read again", self.name, exc)
                    await task.recover()
                    return False
            finally:
                task.turn.release()
            if done is not None:
                return done
            await asyncio.sleep(0)  # a live batch waiting for the turn takes it now
        return False

    async def _take_turn(self) -> bool:
        """Wait for the partition between live batches; False once the lanes no longer
        build here (the task moved: a gap closing or a rebuild holds the turn and waits
        for the feed, which must not wait here meanwhile)."""
        turn = self._task.turn
        while True:
            try:
                await asyncio.wait_for(turn.acquire(), JOIN_POLL_S * 5)
            except TimeoutError:
                if not self.catching_up:
                    return False
                continue
            if self.catching_up:
                return True
            turn.release()
            return False

    # the build -----------------------------------------------------------------------
    def start(self) -> None:
        """Build in the background; the task is live meanwhile."""
        self._runner = asyncio.create_task(self._run(), name=f"build {self.name}")
        self._runner.add_done_callback(self._done)

    async def stop(self) -> None:
        """The task closes: stop the build (its checkpoint holds) and wait for the part
        in hand (it commits)."""
        runner = self._runner
        if runner is not None and not runner.done():
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    def _done(self, runner: asyncio.Task[None]) -> None:
        if not runner.cancelled() and (exc := runner.exception()) is not None:
            self._task.fail(exc, f"{self.name}: the build failed: {exc!r}")

    async def _run(self) -> None:
        task = self._task
        log.info("%s: catching up from store position %d", self.name, self.history_position())
        await self.history.catch_up(self)
        if not self._building():
            return
        joins_at = task.next_position  # every event below it is in the store by now
        await self.history.catch_up(self, fresh=True)  # a read issued after that covers it
        if not self._building():
            return
        task.joining += 1  # a batch ends after itself, not after what it fetched ahead
        try:
            while task.busy:  # between live batches: nothing runs, nothing is queued
                await asyncio.sleep(JOIN_POLL_S)
                if not self._building():
                    return
        finally:
            task.joining -= 1
        task.set_live_state(LiveState.JOINING, was=LiveState.IDLE)  # the source feeds nothing
        task.port.pause()
        try:
            if not task.port.absolute and not task.replay.follows_store:
                # A queue cannot give back what the live lanes acked: read the store
                # once more with the partition held, so nothing is delivered between
                # that read and the handover.
                await self.history.catch_up(self, fresh=True)
                joins_at = task.next_position
            async with task.turn:  # embedded: the store's followers commit in turns too
                if self._building():
                    await self._join(joins_at)
        finally:
            if task.phase is Phase.LIVE:
                if task.reseek and task.next_position is not None:
                    task.rewind(task.next_position)
                task.set_live_state(LiveState.IDLE, was=LiveState.JOINING)
                task.port.resume()

    async def _join(self, joins_at: int | None) -> None:
        """Go live beside the others (see the module's docstring)."""
        task = self._task
        if task.replay.follows_store:
            at = task.next_position
            task.replay.lanes = [*task.replay.lanes, *self.lanes]
        elif task.port.absolute and joins_at is not None:
            at = joins_at
            if task.next_position is not None and task.next_position > at:
                task.rewind(at)
                task.place(at)
        else:  # a queue: held since the last read (see _run)
            at = joins_at
        done = {lane: lane.history_position() for lane in self.lanes}
        caught_up = history_at(done, caught_up=True)
        await task.commit(
            None,
            lambda lane, cp: caught_up(lane, cp).advanced(live=at) if lane in done else cp,
        )
        for lane in self.lanes:
            lane.next = lane.committed = at
            task.transition_if_open(Phase.LIVE, lane)  # closed while committing: stays
        log.info(
            "%s: caught up at store position %d, live at position %s",
            self.name,
            min(done.values()) - 1,  # the last applied, as a store's head counts
            at,
        )
