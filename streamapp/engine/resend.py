"""Parked deliveries sent back to the lane that parked them (``streamapp store parked
replay``, the embedded mode's replay of what it parked).

A parked row sent back is an entry of the event store's resend log, numbered in send
order. A lane runs the entries of its own agent and partition above its mark, in order,
through the same policy as any delivery (one that fails again is parked again; its
Redeliver attempts are counted apart from the live deliveries'), and the mark moves to
the last one it settled *in the same store write* as their table effects: the
checkpoint's ``resent``. So after a crash a lane's tables are before or after each
entry, never half way, and an entry's effects are applied once however often the log
is read. A lane without tables has no checkpoint; its caller keeps its mark (at least
once). The other lanes of the partition skip the entries: they settled the original.

Entries run between live batches (the task's ``turn``), at most :data:`BUDGET_S` at a
time, like a building lane's replay parts. What each entry came to (applied, filtered,
parked again) goes to the caller's ``record`` before the lanes' write, so that it is
durable beside the log whenever the mark has moved past the entry (a crash between the
two runs the entry again, and its first outcome stands).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..errors import StoreCorruptError
from ..eventstore.base import APPLIED, FILTERED, PARKED_AGAIN
from ..failures.outcomes import Outcome
from ..records import Delivery
from .attempts import Attempts
from .lane import Lane
from .phase import Phase
from .rebuild import rebuild_damaged
from .replay import decode_stored
from .run import SKIP, run_lanes

if TYPE_CHECKING:
    from .task import PartitionTask

log = logging.getLogger("streamapp.partition")

BUDGET_S = 0.05
"""The longest entries run before the turn goes back to live batches (then on)."""


class ResentDelivery(NamedTuple):
    """An entry of the resend log for one lane: its number, the agent that parked it and
    the delivery as it first came (the park's own headers stripped)."""

    id: int
    agent: str
    delivery: Delivery


class Applied(enum.Enum):
    DONE = "done"
    """Every entry is settled."""
    MORE = "more"
    """Out of budget: call again now with the same entries."""
    WAIT = "wait"
    """Some wait (the task is not live, a lane builds, an entry is left unsettled):
    call again after a pause."""


class ResendState(NamedTuple):
    """What a caller keeps per task: marks of lanes without tables, and each lane's
    attempts of the entry it is stuck on (apart from its live deliveries')."""

    marks: MutableMapping[str, int]
    attempts: MutableMapping[str, Attempts]


Record = Callable[[Mapping[int, str]], Awaitable[None]]
"""Keeps what entries came to (entry number to outcome), durably, before the lanes' write."""


def mark_of(lane: Lane, marks: MutableMapping[str, int]) -> int:
    """The last entry ``lane`` has handled: its checkpoint's, else ``marks``'."""
    tables = lane.tables
    return tables.checkpoint.resent if tables is not None else marks.get(lane.name, 0)


async def apply_resent(
    task: PartitionTask,
    entries: Sequence[ResentDelivery],
    state: ResendState,
    record: Record | None = None,
) -> Applied:
    """Run ``entries`` (this partition's, in log order) through the lanes that parked
    them, give what each came to to ``record`` and commit each lane's mark with their
    effects (see the module docstring)."""
    if not _live(task):
        return Applied.WAIT
    async with task.turn:
        if not _live(task):  # closed or failed while waiting for the turn
            return Applied.WAIT
        try:
            return await _apply(task, entries, state, record)
        except StoreCorruptError:
            for lane in task.lanes:
                lane.drop()
            if task.state.damaged:
                await rebuild_damaged(task)
            return Applied.WAIT
        except BaseException:  # a cancel included: nothing of it stays in the batch
            for lane in task.lanes:
                lane.drop()
            raise


async def _apply(
    task: PartitionTask,
    entries: Sequence[ResentDelivery],
    state: ResendState,
    record: Record | None,
) -> Applied:
    deadline = time.monotonic() + BUDGET_S
    done: dict[Lane, int] = {}
    outcomes: dict[int, str] = {}
    before = {lane: dict(lane.outcomes) for lane in task.lanes}
    result, refused = Applied.DONE, None
    for k, lane in enumerate(task.lanes):
        mine = [e for e in entries if e.agent == lane.name and e.id > mark_of(lane, state.marks)]
        if not mine:
            continue
        if lane.building:
            result = Applied.WAIT
            continue
        live = lane.attempts
        config = live.first_pause_s, live.max_pause_s
        lane.attempts = state.attempts.setdefault(lane.name, Attempts(*config))
        try:
            for entry in mine:
                if time.monotonic() > deadline:
                    result = Applied.MORE if result is Applied.DONE else result
                    break
                starts = [SKIP] * len(task.lanes)
                starts[k] = entry.delivery.position
                counted = dict(lane.outcomes)
                run = await run_lanes(
                    task.lanes, starts, [entry.delivery], decode_stored, 1.0, metrics=task.metrics
                )
                if run.stop is not None:
                    result, refused = Applied.WAIT, run.refused
                    break
                lane.attempts.settled(entry.delivery.position + 1)
                done[lane] = entry.id
                outcomes[entry.id] = _came_to(lane.outcomes, counted)
        finally:
            lane.attempts = live
        if refused is not None or result is Applied.MORE:
            break
    if outcomes and record is not None:
        await record(outcomes)
    if done:
        await task.commit(
            None, lambda lane, cp: cp.advanced(resent=done[lane]) if lane in done else cp
        )
        for lane, last in done.items():
            if lane.tables is None:
                state.marks[lane.name] = last
            _log_outcomes(task, lane, before[lane], last)
    if refused is not None:
        task.refuse(refused)
    return result


def _came_to(now: Mapping[Outcome, int], before: Mapping[Outcome, int]) -> str:
    """What a settled entry came to, from its lane's counts around its run."""
    if now.get(Outcome.DELIVERED, 0) > before.get(Outcome.DELIVERED, 0):
        return APPLIED
    if now.get(Outcome.FILTERED, 0) > before.get(Outcome.FILTERED, 0):
        return FILTERED
    return PARKED_AGAIN  # settled, neither delivered nor filtered: its park was confirmed


def _log_outcomes(task: PartitionTask, lane: Lane, before: dict[Outcome, int], last: int) -> None:
    """What the rows sent back came to: applied, skipped (their stream had moved past
    them, see docs/failures.md), parked again."""
    got = {o.value: n - before.get(o, 0) for o, n in lane.outcomes.items() if n != before.get(o)}
    log.info(
        "%s: agent %s ran parked rows sent back (through entry %d): %s",
        task.name,
        lane.name,
        last,
        ", ".join(f"{n} {o}" for o, n in sorted(got.items())) or "nothing",
    )


def _live(task: PartitionTask) -> bool:
    return task.phase is Phase.LIVE
