"""The embedded worker's follower of the resend log: parked rows that ``streamapp store
parked replay`` sent back reach the lane that parked them (:mod:`streamapp.engine.resend`).

The log is read every :data:`POLL_S` seconds from the lowest mark of the lanes that
park; each entry goes to the task of its partition (its stream id's, by the one
partitioner, so a changed partition count still finds it). An entry whose agent or topic
is no longer in the app is skipped with a warning (the CLI refuses to send such rows).
Marks of lanes without tables live in the store's ledger under :data:`MARK_PREFIX`,
written after the lane applied: at least once, like every delivery to such an agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import orjson

from ..app import App
from ..engine.assignment import Assignment
from ..engine.resend import ResentDelivery, apply_resent, mark_of
from ..engine.task import PartitionTask
from ..eventstore.base import EventStoreBackend, Resent
from ..outcomes import parking
from ..partitioner import partition_for
from ..records import DeliveryRecord
from ..republish import PARK_AGENT, parked_source, stripped

log = logging.getLogger("streamapp.eventstore")

POLL_S = 1.0
"""How often the resend log is read again (a replay run is applied within about this)."""
LIMIT = 500
"""Entries read at once."""
MARK_PREFIX = "streamapp.resent/"
"""Ledger keys of the marks of lanes without tables (``{prefix}{agent}/{partition}``)."""


class ResendFollower:
    """Applies the resend log to the tasks of an embedded worker (one per worker)."""

    def __init__(self, app: App, store: EventStoreBackend, assignment: Assignment) -> None:
        self.app, self.store, self.assignment = app, store, assignment
        self.marks: dict[str, dict[str, int]] = {}
        """Marks of lanes without tables, by task name, then agent."""
        self._after: int | None = None
        self._warned: set[int] = set()

    @staticmethod
    def needed(app: App) -> bool:
        """True when an agent of ``app`` parks (else nothing can be sent back)."""
        return any(parking(agent.on_failure) is not None for agent in app.agents.values())

    async def run(self) -> None:
        """Follow the log until cancelled; a failed read or apply is tried again."""
        while True:
            try:
                more = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("parked rows sent back: %r; trying again in %.0fs", exc, POLL_S)
                more = False
            if not more:
                await asyncio.sleep(POLL_S)

    async def step(self) -> bool:
        """One read of the log and its entries applied; True when more may wait."""
        tasks = [t for t in self.assignment.tasks.values() if self._parks(t)]
        if not tasks:
            return False
        if self._after is None:
            await self._load_marks(tasks)
        after = self._lowest(tasks) if self._after is None else self._after
        entries = await self.store.resent(self.app.id, after, LIMIT)
        if not entries:
            self._after = after
            return False
        complete = True
        for task, mine in self._by_task(entries, tasks).items():
            marks = self.marks.setdefault(task.name, {})
            before = dict(marks)
            if not await apply_resent(task, mine, marks):
                complete = False
            for agent, mark in marks.items():
                if before.get(agent) != mark:
                    key = f"{MARK_PREFIX}{agent}/{task.partition}"
                    await self.store.put_ledger_record(self.app.id, key, orjson.dumps(mark))
        if complete:
            self._after = entries[-1].id
        return complete and len(entries) == LIMIT

    def _parks(self, task: PartitionTask) -> bool:
        return any(parking(lane.agent.on_failure) is not None for lane in task.lanes)

    def _lowest(self, tasks: Iterable[PartitionTask]) -> int:
        marks = [
            mark_of(lane, self.marks.get(task.name, {}))
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
                    self.marks.setdefault(task.name, {})[lane.name] = int(orjson.loads(raw))

    def _by_task(
        self, entries: list[Resent], tasks: list[PartitionTask]
    ) -> dict[PartitionTask, list[ResentDelivery]]:
        by_place = {(t.topic.name, t.partition): t for t in tasks}
        out: dict[PartitionTask, list[ResentDelivery]] = {}
        for entry in entries:
            parked = entry.parked
            source, agent = parked_source(parked.headers), parked.header(PARK_AGENT)
            topic = self.app.sources.get(source[0]) if source is not None else None
            if source is None or agent is None or topic is None or parked.key is None:
                self._skip(entry, "its origin is not a topic of the app")
                continue
            task = by_place.get((topic.name, partition_for(parked.key, topic.partitions)))
            if task is None:
                continue
            delivery = DeliveryRecord(
                topic.name,
                task.partition,
                source[1],
                parked.key,
                parked.value,
                tuple(stripped(parked.headers)),
            )
            out.setdefault(task, []).append(ResentDelivery(entry.id, agent.decode(), delivery))
        return out

    def _skip(self, entry: Resent, why: str) -> None:
        if entry.id not in self._warned:
            self._warned.add(entry.id)
            log.warning(
                "parked row %d of %s sent back is skipped: %s",
                entry.parked.id,
                entry.parked.destination,
                why,
            )
