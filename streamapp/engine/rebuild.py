"""Corrupt local state, rebuilt in place (Kafka Streams' task-corrupted rule).

A store that finds itself corrupt while the partition is live, whoever read it (a
handler, a view, another agent's read, a restore), is wiped and filled again from its
source: its changelog (Kafka), or the event store (a replay). The batch in hand is
dropped and runs again afterwards; nothing is parked. While opening, the task wipes the
store instead and opens again (:meth:`~streamapp.engine.state.PartitionState.discard_damaged`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import FencedError, StoreCorruptError
from .backoff import Pace
from .lane import Lane
from .opening import take_durable_positions
from .phase import LiveState, Phase
from .replay import history_at
from .task_surface import TaskSurface

log = logging.getLogger("streamapp.partition")


def store_damaged(task: TaskSurface, lane: Lane, damage: StoreCorruptError) -> None:
    """``lane``'s store found itself corrupt (recorded by the task's state). A batch or
    an opening in progress sees the error and rebuilds; an idle live partition starts
    the rebuild now."""
    if task.phase is Phase.LIVE and not task.busy and not task.closing.is_set():
        task.set_live_state(LiveState.REBUILDING, was=LiveState.IDLE)  # nothing fed meanwhile
        task.port.pause()
        prior = task.batch
        task.run_batch(_rebuild_idle(task, prior), f"rebuild {task.name}")


async def _rebuild_idle(task: TaskSurface, prior: asyncio.Future[Any] | None) -> None:
    """The rebuild of a partition found corrupt outside a batch; then live again."""
    if prior is not None and not prior.done():
        await asyncio.wait([prior])  # the event-store feed's chunk in hand drops out
    async with task.turn:  # a building lane's part in hand commits first
        rebuilt = await rebuild_damaged(task)
    if not rebuilt:
        return
    task.set_live_state(LiveState.IDLE, was=LiveState.REBUILDING)
    task.port.resume()


async def rebuild_damaged(task: TaskSurface) -> bool:
    """While live: drop the batch in hand, wipe each store found corrupt and rebuild it
    in place (restore its changelog; or replay the event store), then take the positions
    that state makes durable. The source is not begun again: it rewinds to the next
    position. False when the partition cannot go on here."""
    if task.phase in (Phase.LOST, Phase.FAILED):
        return False  # fenced or failed meanwhile: the next owner rebuilds it
    state = task.state
    while state.damaged:
        damaged = state.take_damaged()
        for lane in task.lanes:
            lane.drop()
        task.transition_if_open(Phase.RESTORING)  # closed meanwhile: wiped, then it stops
        try:
            for lane, damage in damaged.items():
                await state.swap_store(lane, damage)
            state.make_views()
            await _refill(task, [lane for lane in damaged if lane.tables is not None])
        except StoreCorruptError as exc:
            if state.damaged and not task.closing.is_set():
                continue  # another corrupt store found while rebuilding: that one too
            task.fail(exc, f"{task.name}: {exc}")
            return False
        except FencedError as exc:
            task.mark_lost(exc)
            return False
        if task.closing.is_set():
            return False
    if task.phase is not Phase.LIVE:
        return False
    if task.next_position is not None:  # the dropped batch is fetched again
        task.rewind(task.next_position)
    return True


async def _refill(task: TaskSurface, rebuilt: list[Lane]) -> None:
    """Fill the rebuilt (empty) stores again, retrying what a broker or the event store
    fails with back-off; the phase is live again once done."""
    pace = Pace(task.closing)
    replay = task.replay
    while not task.closing.is_set():
        try:
            if task.transaction is not None:
                await task.transaction.reset()  # aborts what the dropped batch began
                await task.state.restore()
                task.transition_if_open(Phase.LIVE)  # closed meanwhile: stays closed
                await take_durable_positions(task)
                return
            replaying = [lane for lane in rebuilt if lane.replays]
            if replaying:
                replay.lanes = replaying
                task.transition_to(Phase.CATCHING_UP)
                await replay.run()
                done = {lane: lane.history_position() for lane in replaying}
                await task.commit(None, history_at(done, caught_up=True))
            live = [lane for lane in task.lanes if not lane.building]
            replay.lanes = live if replay.follows_store else []
            task.transition_if_open(Phase.LIVE)  # closed meanwhile: stays closed
            return
        except (StoreCorruptError, FencedError):
            raise
        except Exception as exc:
            log.error("%s: rebuild failed (%r); retrying in %.1fs", task.name, exc, pace.delay)
            task.transition_if_open(Phase.RESTORING)  # the loop ends once closed
            await pace.wait()
