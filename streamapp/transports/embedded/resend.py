"""The embedded worker's follower of the resend log: parked rows that ``streamapp store
parked replay`` sent back reach the lane that parked them (:mod:`streamapp.engine.resend`).

The log is read every :data:`POLL_S` seconds, to its end, from the lowest entry some
lane that parks has not settled; each entry goes to the task of its partition (its
stream id's, by the one partitioner, so a changed partition count still finds it). An
entry whose agent or topic is no longer in the app is skipped with a warning (the CLI
refuses to send such rows). Marks of lanes without tables live in the store's ledger
under :data:`MARK_PREFIX`, written after the lane ran the entries: at least once, like
every delivery to such an agent. What each entry came to is recorded in the log
(``streamapp store parked`` shows it), before the lanes' write; an entry run for the
first time carries ``streamapp-replayed`` (``parked row N``), so that a skip by stream
version of an event its table never applied is logged as a WARNING naming the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping

import orjson

from ...app import App
from ...engine.assignment import Assignment
from ...engine.resend import Applied, ResendState, ResentDelivery, apply_resent, mark_of
from ...engine.task import PartitionTask
from ...eventstore.base import EventStoreBackend, Resent
from ...failures.outcomes import parking
from ...failures.republish import PARK_AGENT, REPLAYED, parked_source, stripped
from ...logs import Gate
from ...records import DeliveryRecord

log = logging.getLogger("streamapp.eventstore")

POLL_S = 1.0
"""How often the resend log is read again (a replay run is applied within about this)."""
LIMIT = 500
"""Entries read at once."""
PAGES = 40
"""Reads of :data:`LIMIT` entries at most per step (the rest at the next)."""
MARK_PREFIX = "streamapp.resent/"
"""Ledger keys of the marks of lanes without tables (``{prefix}{agent}/{partition}``)."""
_WARNINGS = Gate(window_s=60.0)


class ResendFollower:
    """Applies the resend log to the tasks of an embedded worker (one per worker)."""

    def __init__(self, app: App, store: EventStoreBackend, assignment: Assignment) -> None:
        self.app, self.store, self.assignment = app, store, assignment
        self.states: dict[str, ResendState] = {}
        """Per task name: marks of lanes without tables, attempts of stuck entries."""
        self._persisted: dict[tuple[str, str], int] = {}
        self._after: int | None = None
        self._not_before: dict[str, float] = {}
        self._stopping = asyncio.Event()
        self._step: asyncio.Future[bool] | None = None

    @staticmethod
    def needed(app: App) -> bool:
        """True when an agent of ``app`` parks (else nothing can be sent back)."""
        return any(parking(agent.on_failure) is not None for agent in app.agents.values())

    async def run(self) -> None:
        """Follow the log until :meth:`stop`; a failed read or apply is tried again."""
        while not self._stopping.is_set():
            self._step = asyncio.ensure_future(self.step())
            try:
                more = await asyncio.shield(self._step)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if _WARNINGS.due("step"):
                    log.warning(
                        "parked rows sent back (streamapp store parked replay) wait: %r; "
                        "trying again every %.0fs (this warning: once a minute)",
                        exc,
                        POLL_S,
                    )
                more = False
            if not more:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), POLL_S)

    async def stop(self) -> None:
        """Stop between entries: the step in hand finishes (its work commits)."""
        self._stopping.set()
        step = self._step
        if step is not None and not step.done():
            await asyncio.gather(step, return_exceptions=True)

    async def step(self) -> bool:
        """Read the log to its end (at most :data:`PAGES` reads) and apply what came;
        True when more may wait at once."""
        tasks = [t for t in self.assignment.tasks.values() if _parks(t)]
        if not tasks:
            return False
        if self._after is None:
            await self._load_marks(tasks)
            self._after = self._lowest(tasks)
        after, unsettled, more = self._after, None, False
        for _ in range(PAGES):
            if self._stopping.is_set():
                return False
            entries = await self.store.resent(self.app.id, after, LIMIT)
            for task, mine in self._by_task(entries, tasks).items():
                applied = await self._apply(task, mine)
                if applied is not Applied.DONE:
                    more = more or applied is Applied.MORE
                    low = mine[0].id - 1
                    unsettled = low if unsettled is None else min(unsettled, low)
            if entries:
                after = entries[-1].id
            if len(entries) < LIMIT:
                break
        else:
            more = True  # a long log: the rest at the next step
        self._after = after if unsettled is None else unsettled
        return more

    async def _apply(self, task: PartitionTask, mine: list[ResentDelivery]) -> Applied:
        if time.monotonic() < self._not_before.get(task.name, 0.0):
            return Applied.WAIT
        state = self.states.setdefault(task.name, ResendState({}, {}))
        applied = await apply_resent(task, mine, state, self._record)
        failing = [a.pause_s() for a in state.attempts.values() if a.failed]
        if failing:  # Redeliver's back-off, as for a live delivery
            self._not_before[task.name] = time.monotonic() + max(failing)
        for agent, mark in state.marks.items():
            if self._persisted.get((task.name, agent)) != mark:
                key = f"{MARK_PREFIX}{agent}/{task.partition}"
                await self.store.put_ledger_record(self.app.id, key, orjson.dumps(mark))
                self._persisted[(task.name, agent)] = mark
        return applied

    async def _record(self, outcomes: Mapping[int, str]) -> None:
        await self.store.record_resent(self.app.id, outcomes)

    def _lowest(self, tasks: Iterable[PartitionTask]) -> int:
        marks = [
            mark_of(lane, self.states.get(task.name, ResendState({}, {})).marks)
            for task in tasks
            for lane in task.lanes
            if parking(lane.agent.on_failure) is not None
        ]
        return min(marks, default=0)

    async def _load_marks(self, tasks: list[PartitionTask]) -> None:
        by_key = dict(await self.store.ledger_records(self.app.id))
        for task in tasks:
            for lane in task.lanes:
                raw = by_key.get(f"{MARK_PREFIX}{lane.name}/{task.partition}")
                if not lane.agent.tables and raw is not None:
                    state = self.states.setdefault(task.name, ResendState({}, {}))
                    state.marks[lane.name] = self._persisted[(task.name, lane.name)] = int(
                        orjson.loads(raw)
                    )

    def _by_task(
        self, entries: list[Resent], tasks: list[PartitionTask]
    ) -> dict[PartitionTask, list[ResentDelivery]]:
        by_place = {(t.topic.name, t.partition): t for t in tasks}
        out: dict[PartitionTask, list[ResentDelivery]] = {}
        for entry in entries:
            parked = entry.parked
            source, agent = parked_source(parked.headers), parked.header(PARK_AGENT)
            topic = self.app.sources.get(source[0]) if source is not None else None
            if source is None or agent is None or parked.key is None:
                _skip(entry, "it has no streamapp-source, streamapp-agent or key")
                continue
            if topic is None:
                _skip(entry, f"its origin topic {source[0]!r} is not a topic of the app")
                continue
            task = by_place.get((topic.name, topic.partition_of(parked.key)))
            if task is None or agent.decode() not in {lane.name for lane in task.lanes}:
                _skip(entry, f"no agent {agent.decode()!r} of topic {topic.name} parks here")
                continue
            headers = stripped(parked.headers)
            if entry.outcome is None:  # run again (a rebuilt table): skips are no news
                headers.append((REPLAYED, f"parked row {parked.id}".encode()))
            delivery = DeliveryRecord(
                topic.name, task.partition, source[1], parked.key, parked.value, tuple(headers)
            )
            out.setdefault(task, []).append(ResentDelivery(entry.id, agent.decode(), delivery))
        return out


def _parks(task: PartitionTask) -> bool:
    return any(parking(lane.agent.on_failure) is not None for lane in task.lanes)


def _skip(entry: Resent, why: str) -> None:
    if _WARNINGS.due(("skip", entry.id)):
        log.warning(
            "parked row %d of %s sent back is skipped: %s",
            entry.parked.id,
            entry.parked.destination,
            why,
        )
