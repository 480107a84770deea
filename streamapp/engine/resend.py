"""Parked deliveries sent back to the lane that parked them (``streamapp store parked
replay``, the embedded mode's replay of what it parked).

A parked row sent back is an entry of the event store's resend log, numbered in send
order. A lane runs the entries of its own agent and partition above its mark, in order,
through the same policy as any delivery (one that fails again is parked again), and the
mark moves to the last one it settled *in the same store write* as their effects: the
checkpoint's ``resent``. So after a crash the lane is before or after each entry, never
half way, and an entry is applied once however often the log is read. A lane without
tables has no checkpoint; its caller keeps its mark (at least once). The other lanes of
the partition skip the entries (they settled the original when it was parked).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..records import Delivery
from .lane import SKIP, Lane, run_lanes
from .phase import Phase
from .replay import decode_stored

if TYPE_CHECKING:
    from .task import PartitionTask

log = logging.getLogger("streamapp.partition")

BUDGET_S = 0.05
"""The longest one entry's handler may take before the next waits for another turn."""


class ResentDelivery(NamedTuple):
    """An entry of the resend log for one lane: its number, the agent that parked it and
    the delivery as it first came (the park's own headers stripped)."""

    id: int
    agent: str
    delivery: Delivery


def mark_of(lane: Lane, marks: MutableMapping[str, int]) -> int:
    """The last entry ``lane`` has handled: its checkpoint's, else ``marks``'."""
    tables = lane.tables
    return tables.checkpoint.resent if tables is not None else marks.get(lane.name, 0)


async def apply_resent(
    task: PartitionTask, entries: Sequence[ResentDelivery], marks: MutableMapping[str, int]
) -> bool:
    """Run ``entries`` (this partition's, in log order) through the lanes that parked
    them, between live batches (the task's ``turn``), and commit each lane's mark with
    their effects. ``marks`` holds the marks of lanes without tables (updated here).

    True once every entry is settled; False when some wait: the task is not live, a lane
    builds, or an entry was left unsettled (Redeliver: it runs again at the next call).
    """
    if not _live(task):
        return False
    async with task.turn:
        if not _live(task):  # closed or failed while waiting for the turn
            return False
        done: dict[Lane, int] = {}
        complete, refused = True, None
        for k, lane in enumerate(task.lanes):
            mark = mark_of(lane, marks)
            mine = [e for e in entries if e.agent == lane.name and e.id > mark]
            if not mine:
                continue
            if lane.building:
                complete = False
                continue
            for entry in mine:
                starts = [SKIP] * len(task.lanes)
                starts[k] = entry.delivery.position
                run = await run_lanes(
                    task.lanes,
                    starts,
                    [entry.delivery],
                    decode_stored,
                    BUDGET_S,
                    metrics=task.metrics,
                )
                if run.stop is not None:
                    complete, refused = False, run.refused
                    break
                done[lane] = entry.id
            if refused is not None:
                break
        if done:
            try:
                await task._commit(
                    None,
                    lambda lane, cp: cp.advanced(resent=done[lane]) if lane in done else cp,
                )
            except Exception:
                for lane in task.lanes:
                    lane.drop()
                raise
            for lane, last in done.items():
                if lane.tables is None:
                    marks[lane.name] = last
                log.info(
                    "%s: agent %s applied parked rows sent back (through entry %d)",
                    task.name,
                    lane.name,
                    last,
                )
    if refused is not None:
        task._refused(refused)
    return complete


def _live(task: PartitionTask) -> bool:
    return task.phase is Phase.LIVE
