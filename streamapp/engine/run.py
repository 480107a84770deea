"""Running a batch of deliveries through a partition task's lanes (:mod:`.lane`), one
delivery at a time, each through every lane in registration order:

- **Redeliver holds the partition for all** (as in Faust): when a lane leaves a
  delivery unsettled (Redeliver, or a park that was not confirmed), every lane still
  handles that delivery, then the batch stops there; the partition rewinds to it and,
  after the policy's pause, only the lanes that did not settle it run it again. The
  others wait, at most one delivery ahead. UNAVAILABLE (a read of a table partition not
  served here) stops the batch the same way, with no attempt counted.
- **Refused stops everything.** An agent that raises :class:`~streamapp.Refuse` stops
  the partition at that delivery for every lane (what comes before it commits; it is
  not settled), and the task reports it as fatal, so the worker stops and leaves.
- **The retry chain** (``Retry``) settles a failed delivery for its lane without holding
  the partition beyond the inline retries: the lane tries it again after each interval
  (a wait that a stop ends at once, leaving the delivery unsettled), then puts a copy
  for the retry or dead-letter topic (:mod:`streamapp.failures.retry_chain`) in its outbox, so
  the copy commits with the batch. A copy that comes back names its agent; the other
  lanes, which settled the original, skip it.
- **Blocking agents** (``blocking=True``) run their handler in the lane's own thread
  (:mod:`streamapp.engine.blocking`): the batch awaits each call, so a partition stays in
  order and one at a time while the loop runs the others. Before each handler call the
  lane names the delivery in :data:`~streamapp.engine.stall.DOING` for the stall watch.
- **Spans** (tracing on, :mod:`streamapp.tracing`): each delivery a lane handles is one
  span, from its handler's call to its failure policy's end, with the outcome and the
  attempt; tracing off, the lane's ``trace`` is None and a delivery costs that one test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..agents.agent import DELIVERED, UNVERSIONED, handle
from ..failures import retry_chain as chain
from ..failures.outcomes import Outcome, Retry
from ..records import Delivery
from .delivery import Decoder, decode_delivery
from .hold import RELEASE, behind, holds_streams, release_next
from .interfaces import TaskMetrics
from .lane import Lane
from .metrics import NO_METRICS
from .settle import settle_failed
from .stall import DOING

YIELD_EVERY_S = 0.02
"""A batch gives the event loop a turn this often: handlers that never await would
otherwise hold it for a whole batch (group heartbeats, views and other partitions wait)."""

SKIP = 2**63
"""The start of a lane that takes no part in a run (every delivery is below it)."""

Peek = Callable[[Delivery], tuple[str, int]]
"""A delivery's stream id and stream version, known without decoding it (a stored
event's columns): the stream-version guard then skips an applied event undecoded."""


@dataclass(slots=True)
class Run:
    """What a run of lanes over deliveries reached."""

    reached: list[int]
    """Per lane, the next position it needs."""
    stop: int | None = None
    """The position the run stopped at (None: every delivery was handled)."""
    failed: list[Lane] = field(default_factory=list)
    """Lanes that left the delivery at ``stop`` unsettled (the policy redelivers it)."""
    unavailable: bool = False
    """A lane found a table it reads unavailable at ``stop``."""
    refused: str | None = None
    """Why an agent refused the delivery at ``stop`` (:class:`~streamapp.Refuse`): the
    partition stops there for good."""

    def pause_s(self, metrics: TaskMetrics, unavailable_s: float) -> float:
        """The pause before the partition is fetched again after the run stopped: the
        failed lanes' back-off (each counts a redelivery), ``unavailable_s`` after an
        unavailable table, none after a cut."""
        for lane in self.failed:
            metrics.redelivery(lane.name)
        if self.failed:
            return max(lane.attempts.pause_s() for lane in self.failed)
        return unavailable_s if self.unavailable else 0.0

    @property
    def cut(self) -> bool:
        """Stopped by the time budget only."""
        return (
            self.stop is not None
            and not self.failed
            and not self.unavailable
            and self.refused is None
        )


async def run_lanes(
    lanes: Sequence[Lane],
    starts: Sequence[int],
    records: Sequence[Delivery],
    decode: Decoder,
    budget_s: float,
    *,
    metrics: TaskMetrics = NO_METRICS,
    peek: Peek | None = None,
) -> Run:
    """Run ``records`` (one partition, in order) through every lane from its start.

    Stops after the first delivery a lane leaves unsettled (every lane handles it first),
    or before a delivery once ``budget_s`` is spent, so the caller can commit what every
    lane reached and rewind to the lowest. Outcomes are counted per lane; a lane's failed
    attempts of a delivery are counted in its :class:`Attempts` (a bounded Redeliver's
    fallback applies once they are spent). With ``peek``, a lane with tables skips a
    delivery whose stream version it applied before decoding it (the guard's DUPLICATE,
    as :func:`~streamapp.agents.agent.handle` would give).
    """
    run = Run(list(starts))
    chained = len(lanes) > 1 and any(isinstance(lane.agent.on_failure, Retry) for lane in lanes)
    task = asyncio.current_task()
    try:
        if len(lanes) == 1:
            return await _run_one(lanes[0], records, decode, budget_s, metrics, run, task, peek)
        return await _run(lanes, records, decode, budget_s, metrics, run, task, chained, peek)
    finally:
        if task is not None:
            DOING.pop(task, None)
        for lane in lanes:
            if lane.trace is not None:
                lane.trace.abandon()  # a span the run left open (it raised)


async def _run(
    lanes: Sequence[Lane],
    records: Sequence[Delivery],
    decode: Decoder,
    budget_s: float,
    metrics: TaskMetrics,
    run: Run,
    task: asyncio.Task[Any] | None,
    chained: bool,
    peek: Peek | None,
) -> Run:
    reached = run.reached
    now = time.monotonic()
    deadline, next_yield = now + budget_s, now + YIELD_EVERY_S
    counts: list[dict[Outcome, int]] = [{} for _ in lanes]
    delivered = [0] * len(lanes)  # the common cases, counted without hashing an enum
    unversioned = [0] * len(lanes)
    spent = [0.0] * len(lanes)
    doing: dict[Any, Any] = DOING if task is not None else {}
    holding_of = [holds_streams(lane) for lane in lanes]
    for i, record in enumerate(records):
        if i:
            now = time.monotonic()
            if now > deadline:
                run.stop = record.position  # out of time
                break
            if now > next_yield:  # let heartbeats, views and other partitions in
                await asyncio.sleep(0)
                next_yield = time.monotonic() + YIELD_EVERY_S
        position = record.position
        item: Any = None
        owner = chain.header(record.headers, chain.AGENT) if chained else None
        known = None if peek is None else peek(record)
        for k, lane in enumerate(lanes):
            if reached[k] > position:
                continue  # settled by this lane already
            if owner is not None and owner != lane.name.encode():
                reached[k] = position + 1  # a retry copy for another agent of the topic
                continue
            tables = lane.tables
            if (
                known is not None
                and tables is not None
                and tables.applied_version(known[0]) >= known[1]
            ):
                counts[k][Outcome.FILTERED] = counts[k].get(Outcome.FILTERED, 0) + 1
                reached[k] = position + 1  # the guard's skip, undecoded
                continue
            if item is None:
                item = decode_delivery(decode, record)
            holding, parked = holding_of[k], None
            if holding is not None:
                parked = await behind(lane, holding, record, item, metrics, decode, counts[k])
                if parked is not None and parked is not RELEASE:
                    counts[k][Outcome.HELD] = counts[k].get(Outcome.HELD, 0) + 1
                    if parked:
                        reached[k] = position + 1
                    else:
                        lane.attempts.failed_at(position, "parking behind its held stream failed")
                        run.failed.append(lane)
                    continue
            doing[task] = (lane.name, record, item)  # what the stall watch names
            started = time.perf_counter()
            if (trace := lane.trace) is not None:
                trace.start(record, item, attempt_of(lane, record))
            handled = await handle(
                lane.agent,
                item,
                tables,
                lane.views,
                lane.outbox,
                lane.send,
                lane.run,
                checked=known,
            )
            spent[k] += time.perf_counter() - started
            if handled is DELIVERED or handled is UNVERSIONED:
                if trace is not None:
                    trace.end(handled, True)
                delivered[k] += 1
                unversioned[k] += handled is UNVERSIONED
                if parked is RELEASE and holding is not None:
                    await release_next(lane, holding, item, decode, counts[k], metrics)
                reached[k] = position + 1
                continue
            settled, handled = await settle_failed(lane, record, item, handled, counts[k], metrics)
            if trace is not None:
                trace.end(handled, settled)
            if settled:
                if parked is RELEASE and holding is not None and handled.outcome.settles:
                    await release_next(lane, holding, item, decode, counts[k], metrics)
                reached[k] = position + 1
            elif handled.outcome is Outcome.UNAVAILABLE:
                run.unavailable = True
            elif handled.outcome is Outcome.REFUSED:
                run.refused = run.refused or (
                    f"agent {lane.name!r} refused {record.topic}[{record.partition}]"
                    f"@{record.position}: {handled.reason}"
                )
            else:
                run.failed.append(lane)
        if run.failed or run.unavailable or run.refused:
            run.stop = position
            break
    for k, lane in enumerate(lanes):
        _count(lane, counts[k], delivered[k], unversioned[k], spent[k], metrics)
    return run


async def _run_one(
    lane: Lane,
    records: Sequence[Delivery],
    decode: Decoder,
    budget_s: float,
    metrics: TaskMetrics,
    run: Run,
    task: asyncio.Task[Any] | None,
    peek: Peek | None,
) -> Run:
    """:func:`_run` for one lane (no copies of other agents to tell apart): the same
    outcomes and stops, fewer calls per delivery. Its ``spent`` is the run's time but the
    turns it gives the loop and its failure policy's (a park, an inline retry)."""
    started = now = time.monotonic()
    elsewhere = 0.0
    deadline, next_yield = now + budget_s, now + YIELD_EVERY_S
    counts: dict[Outcome, int] = {}
    delivered = unversioned = 0
    doing: dict[Any, Any] = DOING if task is not None else {}
    agent, tables, views, outbox, send, runner = (
        lane.agent, lane.tables, lane.views, lane.outbox, lane.send, lane.run
    )  # fmt: skip
    reached = run.reached[0]
    holding = holds_streams(lane)
    trace = lane.trace
    guard = (peek, tables.applied_version) if peek is not None and tables is not None else None
    checked: tuple[str, int] | None = None
    for i, record in enumerate(records):
        if i:
            now = time.monotonic()
            if now > deadline:
                run.stop = record.position  # out of time
                break
            if now > next_yield:  # let heartbeats, views and other partitions in
                await asyncio.sleep(0)
                next_yield = time.monotonic()
                elsewhere += next_yield - now
                next_yield += YIELD_EVERY_S
        position = record.position
        if reached > position:
            continue  # settled already
        if guard is not None:
            checked = guard[0](record)
            if guard[1](checked[0]) >= checked[1]:  # the guard's skip, undecoded
                counts[Outcome.FILTERED] = counts.get(Outcome.FILTERED, 0) + 1
                reached = position + 1
                continue
        item = decode_delivery(decode, record)
        parked = None
        if holding is not None:
            parked = await behind(lane, holding, record, item, metrics, decode, counts)
            if parked is not None and parked is not RELEASE:
                counts[Outcome.HELD] = counts.get(Outcome.HELD, 0) + 1
                if parked:
                    reached = position + 1
                    continue
                lane.attempts.failed_at(position, "parking behind its held stream failed")
                run.failed.append(lane)
                run.stop = position
                break
        doing[task] = (lane.name, record, item)  # what the stall watch names
        if trace is not None:
            trace.start(record, item, attempt_of(lane, record))
        handled = await handle(agent, item, tables, views, outbox, send, runner, checked=checked)
        if handled is DELIVERED or handled is UNVERSIONED:
            if trace is not None:
                trace.end(handled, True)
            delivered += 1
            if handled is UNVERSIONED:
                unversioned += 1
            if parked is RELEASE and holding is not None:
                await release_next(lane, holding, item, decode, counts, metrics)
            reached = position + 1
            continue
        policy_started = time.monotonic()
        settled, handled = await settle_failed(lane, record, item, handled, counts, metrics)
        elsewhere += time.monotonic() - policy_started
        if trace is not None:
            trace.end(handled, settled)
        if settled:
            if parked is RELEASE and holding is not None and handled.outcome.settles:
                await release_next(lane, holding, item, decode, counts, metrics)
            reached = position + 1
            continue
        if handled.outcome is Outcome.UNAVAILABLE:
            run.unavailable = True
        elif handled.outcome is Outcome.REFUSED:
            run.refused = (
                f"agent {lane.name!r} refused {record.topic}[{record.partition}]"
                f"@{record.position}: {handled.reason}"
            )
        else:
            run.failed.append(lane)
        run.stop = position
        break
    run.reached[0] = reached
    spent = time.monotonic() - started - elsewhere
    _count(lane, counts, delivered, unversioned, spent, metrics)
    return run


def attempt_of(lane: Lane, record: Delivery) -> int:
    """Which attempt at ``record`` this is for ``lane`` (1: the first): its failed
    attempts so far, counted by the lane (Redeliver) or carried by a retry copy."""
    return lane.attempts.before(record) + chain.chain_state(record.headers)[0] + 1


def _count(
    lane: Lane,
    got: dict[Outcome, int],
    delivered: int,
    unversioned: int,
    spent: float,
    metrics: TaskMetrics,
) -> None:
    """A run's outcomes of ``lane``, into its counts and the metrics."""
    if delivered:
        got[Outcome.DELIVERED] = got.get(Outcome.DELIVERED, 0) + delivered
    for outcome, n in got.items():
        lane.outcomes[outcome] = lane.outcomes.get(outcome, 0) + n
    size = sum(got.values())
    if size:
        metrics.batch(lane.name, size, spent, got)
    if unversioned:
        lane.unversioned += unversioned
        metrics.unversioned(lane.name, unversioned)
