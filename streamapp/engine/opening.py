"""Opening a partition: open and restore its stores, catch up, start the live source
where the state stands (:mod:`streamapp.engine.start_plan` decides where), retrying with
back-off; and a task kept over a rebalance (suspend, then rejoin)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from ..errors import ConfigError, FencedError, StoreCorruptError, StoreFormatError
from .backoff import Pace
from .interfaces import Committed
from .lane import Lane
from .lane_build import LaneBuild, building_lanes
from .phase import LiveState, Phase
from .provenance import check_state
from .start_plan import LaneStart, place, plan_start
from .task_surface import TaskSurface

log = logging.getLogger("streamapp.partition")


async def suspend_partition(task: TaskSurface) -> bool:
    """The group revokes the partition, and may hand it back in the same rebalance:
    finish the batch in hand (it commits) and keep stores and transaction open. False
    when the task cannot be kept (not live, or its batch did not finish): the caller
    closes it then. A kept task takes no deliveries until it rejoins."""
    if task.phase is not Phase.LIVE or task.lanes_building:
        return False  # a building lane resumes from its checkpoint when reopened
    task.hold_ahead()  # the batch in hand ends after itself
    batch = task.batch
    if batch is not None and not batch.done():
        try:
            await asyncio.wait_for(asyncio.shield(batch), task.config.close_budget_s)
        except Exception as exc:
            log.warning("%s: batch did not finish on revoke (%r): closed", task.name, exc)
            return False
    # not lost, failed or closed meanwhile, and no other work began after the batch
    kept = task.phase is Phase.LIVE and task.live_state is LiveState.IDLE
    if kept:  # nothing is fed while suspended
        task.set_live_state(LiveState.SUSPENDED, was=LiveState.IDLE)
        task.transition_to(Phase.SUSPENDED)
    return kept


async def rejoin_partition(task: TaskSurface, *, continuous: bool = False) -> None:
    """The kept task's way back (see :meth:`TaskSurface.rejoin`)."""
    try:
        if task.transaction is not None:
            # Another worker may have held the partition between the revoke and now
            # (this one out of the group meanwhile): the reset checks the lease again
            # and starts a writer that can commit, and what that worker committed is
            # restored from the changelogs (the group refuses its offsets after the
            # move: an older generation; txn_writer's module says what remains). Not
            # when the group gave it back in the very next generation: no one else
            # held it, and the stores are the state of its last commit.
            if not continuous:
                await task.transaction.reset()
                await restore_tail(task)
        else:  # no tables, no sends: the group's committed offset is the position
            start = await task.port.begin(None, stateful=False)
            for lane in task.lanes:
                lane.next = lane.committed = start
            task.place(start)
    except asyncio.CancelledError:
        raise
    except FencedError as exc:
        task.mark_lost(exc)
        return
    except Exception as exc:
        log.warning("%s: kept open, but cannot go on (%r): opened again", task.name, exc)
        task.set_live_state(LiveState.IDLE, was=LiveState.REJOINING)  # fed once live again
        await task.state.release()
        if task.transition_if_open(Phase.RESTORING):  # a close may have come meanwhile
            await open_partition(task)
        return
    if task.closing.is_set() or task.phase is not Phase.LIVE:
        return
    if task.next_position is not None:
        task.rewind(task.next_position)
    task.set_live_state(LiveState.IDLE, was=LiveState.REJOINING)
    task.port.resume()
    log.debug(
        "live %s again at position %s (kept open; %s)",
        task.name,
        task.next_position,
        "held by no one else meanwhile" if continuous else "fenced, the tail restored",
    )


async def open_partition(task: TaskSurface) -> None:
    """Open, restore, catch up and go live, retrying with back-off: a partition is
    never left paused without an owner task (a lock still held, a broker hiccup)."""
    pace = Pace(task.closing)
    while task.phase in (Phase.RESTORING, Phase.CATCHING_UP):
        try:
            began = time.monotonic()
            await task.state.open()
            opened = time.monotonic()
            await check_state(task)  # refuses state made from another source
            building = building_lanes(task)
            for lane in task.lanes:
                if lane in building:  # a close may have come while checking
                    task.transition_if_open(Phase.CATCHING_UP, lane)
                else:
                    lane.building = False
            await task.replay.catch_up()
            caught_up = time.monotonic()
            await go_live(task)
            start_builds(task, building)
            log.debug(  # where a fail-over's time goes (docs/operations.md, promotion)
                "%s opened in %.3fs: stores, fence and restore %.3fs, catch-up %.3fs, "
                "live start %.3fs",
                task.name,
                time.monotonic() - began,
                opened - began,
                caught_up - opened,
                time.monotonic() - caught_up,
            )
            return
        except asyncio.CancelledError:
            raise
        except FencedError as exc:
            task.mark_lost(exc)
            return
        except StoreCorruptError as exc:
            await task.state.release()
            await task.state.discard_damaged(exc)  # raises when it cannot be rebuilt
            if task.closing.is_set():
                return
            task.transition_to(Phase.RESTORING)  # at once: opened empty, then restored
        except (ConfigError, StoreFormatError):
            raise  # no retry helps: the opening task reports it and the partition is lost
        except Exception as exc:
            log.error("%s: opening failed (%r); retrying in %.1fs", task.name, exc, pace.delay)
            await task.state.release()
            if task.closing.is_set():
                return
            task.transition_to(Phase.RESTORING)
            await pace.wait()


def start_builds(task: TaskSurface, lanes: list[Lane]) -> None:
    """The lanes behind catch up on their own from now on (:mod:`~.build`)."""
    if not lanes or task.phase is not Phase.LIVE or task.history is None:
        return
    build = LaneBuild(task, lanes, task.history)
    task.builds.append(build)
    build.start()


async def go_live(task: TaskSurface) -> None:
    """Start live delivery where the lanes' state stands (see
    :mod:`~streamapp.engine.start_plan`), then resume the partition."""
    if task.phase not in (Phase.RESTORING, Phase.CATCHING_UP):
        return
    live = [lane for lane in task.lanes if not lane.building]  # building: engine.build
    lanes = await lane_starts(task, live)
    plan = plan_start(lanes, absolute=task.port.absolute)
    begun = await task.port.begin(plan.begin_at, stateful=plan.stateful, earliest=plan.earliest)
    placed = place(lanes, begun, absolute=task.port.absolute)
    if placed.rewind_to is not None:
        task.port.rewind(placed.rewind_to)
    if task.closing.is_set():  # closed while the source began: stay closed
        return
    start = placed.start
    task.replay.lanes = live if task.replay.follows_store else []
    for lane in task.lanes:
        lane.next = lane.committed = None
    for lane, position in zip(live, placed.positions, strict=True):
        lane.next = lane.committed = position
    task.place(start, start=True)  # nothing dropped before it is owed a rewind
    task.replay.recheck()
    if plan.settle:  # the group may be behind the tables (a replay, an older streamapp)
        await task.port.settle(start, task.committer.ahead(start))
    task.transition_if_open(Phase.LIVE)  # a close may have come while settling
    task.port.resume()
    log.debug("live %s at position %d", task.name, start)


async def lane_starts(task: TaskSurface, lanes: Sequence[Lane]) -> list[LaneStart]:
    """What each of ``lanes`` knows of its live position: its checkpoint, the replay's
    live start, or (lanes without tables) the group's committed position."""
    committed: Committed | None = None
    stateless = any(lane.tables is None for lane in lanes)
    if stateless and (len(task.lanes) > 1 or task.transaction is not None):
        # Read after the open: the lease checked, the changelogs' open transactions
        # waited out (a zombie's pending offsets: txn_writer's module says what is not).
        committed = await task.port.committed()
    history_start: int | None = None
    starts: list[LaneStart] = []
    for lane in lanes:
        tables, replays = lane.tables, lane.replays
        if tables is None:
            position = None
            if committed is not None:
                position = committed.ahead.get(lane.name, committed.position)
            starts.append(LaneStart(False, replays, position))
            continue
        if tables.checkpoint.live is not None:
            starts.append(LaneStart(True, replays, tables.checkpoint.live, durable=True))
            continue
        if replays and task.history is not None:
            if history_start is None:
                history_start = await task.history.live_start(task.replay)
            if history_start is not None:  # the replay holds the rest
                starts.append(LaneStart(True, replays, history_start, durable=True))
                continue
        starts.append(LaneStart(True, replays))
    return starts


async def restore_tail(task: TaskSurface) -> None:
    """Restore what the changelogs committed beyond the stores, and move live lanes to
    the positions that makes durable (see :func:`~streamapp.engine.recover.recover`)."""
    restored = await task.state.restore(counted=False)
    if restored:
        log.warning(
            "%s: the failed transaction committed after all: %d changelog records "
            "restored; its batch is not run again",
            task.name,
            restored,
        )
    await take_durable_positions(task)


async def take_durable_positions(task: TaskSurface) -> None:
    """Move live lanes to the positions their restored checkpoints make durable."""
    if task.phase is not Phase.LIVE or task.next_position is None:
        return  # a replay reads the restored checkpoints' store positions
    live = [lane for lane in task.lanes if not lane.building]
    starts = await lane_starts(task, live)
    for lane, known in zip(live, starts, strict=True):
        position = known.position
        if position is not None and (lane.committed is None or position > lane.committed):
            lane.next = lane.committed = position
    held = [lane.committed for lane in task.lanes if lane.committed is not None]
    if held:
        task.place(max(task.next_position, min(held)))
