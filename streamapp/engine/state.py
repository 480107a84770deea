"""The partition's state: its lanes' stores, opened, restored, read, sized and released
(Kafka Streams' ``ProcessorStateManager``), and the damage they report.

A store that finds itself corrupt (whoever read it) is recorded here; the task decides
when it is rebuilt (:mod:`streamapp.engine.rebuild`): a store is wiped only where a
source can fill it again (its changelog, or the event store).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..agents.agent import Agent
from ..errors import StoreCorruptError, TableUnavailableError
from ..tables.partition import PartitionTables, spaces_for
from ..tables.reads import Locator, ReadView
from ..tables.store import Store, discard
from ..tables.table import Table
from ..topics import TopicSpec
from .interfaces import TaskMetrics, Transaction
from .lane import Lane
from .status import TaskCounts

log = logging.getLogger("streamapp.partition")

MAX_REBUILDS = 3
"""Corrupt local stores a task wipes and rebuilds in its life; one more stops the
partition here (a disk that keeps corrupting what is written to it)."""

StoreOpener = Callable[[Agent, list[str]], Store]
"""Opens an agent's store of the partition with these spaces (blocking: in a thread)."""
Damaged = Callable[[Lane, StoreCorruptError], None]
"""Told when a lane's store found itself corrupt."""


class PartitionState:
    """The stores of one partition's lanes."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        partition: int,
        source: TopicSpec,
        *,
        name: str,
        open_store: StoreOpener | None,
        transaction: Transaction | None,
        locate: Locator,
        metrics: TaskMetrics,
        counts: TaskCounts,
        replayable: bool,
        on_damage: Damaged,
    ) -> None:
        self.lanes, self.partition, self.source = lanes, partition, source
        """The lanes' topic: their tables are partitioned like it."""
        self.name, self._open_store, self._transaction = name, open_store, transaction
        self._locate, self._metrics, self._counts = locate, metrics, counts
        self._replayable = replayable
        """The worker has an event-store feed (a store with history can be rebuilt)."""
        self._on_damage = on_damage
        self.damaged: dict[Lane, StoreCorruptError] = {}
        """Lanes whose store was found corrupt, not yet rebuilt."""
        self.damage_found = asyncio.Event()

    def tables_for(self, table: str) -> PartitionTables | None:
        """The tables (of this partition) of the agent that writes the table labelled
        ``table`` (``Table.label``), once open."""
        for lane in self.lanes:
            if lane.tables is not None and any(t.label == table for t in lane.agent.tables):
                return lane.tables
        return None

    def table_sizes(self) -> dict[str, int]:
        """Keys per table of this partition, where the store knows cheaply."""
        out = {}
        for lane in self.lanes:
            tables = lane.tables
            if tables is None:
                continue
            for table in tables.tables:
                n = tables.store.count(table.data_space)
                if n is not None:
                    out[table.label] = n
        return out

    # open, restore, release --------------------------------------------------------
    async def open(self) -> None:
        """Open every lane's store while the transaction opens (the owner's lease
        checked, the worker's transactional writer started: broker round trips, while a
        store open holds the GIL), restore the changelogs once both are done (a
        transaction another worker left open on one is waited out first), then make the
        lanes' views."""
        fencing = None
        if self._transaction is not None:
            fencing = asyncio.ensure_future(self._transaction.open())
        try:
            for lane in self.lanes:
                if lane.agent.tables and self._open_store is not None:
                    lane.tables = await self.open_one(lane)
        except BaseException:
            if fencing is not None:  # release() then closes what it started
                fencing.cancel()
                await asyncio.gather(fencing, return_exceptions=True)
            raise
        if fencing is not None:
            await fencing  # owned and confirmed before anything is restored
            await self.restore()
        self.make_views()

    async def restore(self, *, counted: bool = True) -> int:
        """Restore what the changelogs hold beyond each open store; records restored."""
        assert self._transaction is not None
        total = 0
        for lane in self.lanes:
            if lane.tables is not None:
                restored = await self._transaction.restore(lane.agent, lane.tables)
                total += restored
                if counted:
                    self._counts.restored += restored
                    self._metrics.restored(lane.name, restored)
        return total

    async def open_one(self, lane: Lane) -> PartitionTables:
        assert self._open_store is not None
        agent = lane.agent
        spaces = spaces_for(agent.tables)
        opening = asyncio.ensure_future(asyncio.to_thread(self._open_store, agent, spaces))
        try:  # the open may wait for a previous owner's lock: off the loop
            store = await asyncio.shield(opening)
        except asyncio.CancelledError:  # closed meanwhile: close the store once open
            opening.add_done_callback(_close_when_opened)
            raise
        except StoreCorruptError as exc:
            self.damaged.setdefault(lane, exc)
            raise
        try:
            where = self.name if len(self.lanes) == 1 else f"{self.name} of agent {agent.name}"
            tables = PartitionTables(agent.tables, store, self.partition, self.source, where=where)
        except BaseException as exc:
            if isinstance(exc, StoreCorruptError):
                self.damaged.setdefault(lane, exc)
            store.close()
            raise
        store.watch(lambda damage: self._store_damaged(lane, damage))
        return tables

    def make_views(self) -> None:
        for lane in self.lanes:
            lane.views = [self._view(lane, table) for table in lane.agent.views]

    def _view(self, lane: Lane, table: Table[Any]) -> Any:
        if lane.tables is not None and table in lane.agent.tables:
            return lane.tables.view(table.label)
        sibling = any(table in other.agent.tables for other in self.lanes)
        locate = self._sibling_store if sibling else self._locate
        return ReadView(table, self.partition, self.source, locate)

    def _sibling_store(self, table: Table[Any], partition: int) -> Store:
        """The committed store of a table another agent of this task writes (in any
        phase: this task's own replay may read it)."""
        tables = self.tables_for(table.label)
        if tables is None:
            raise TableUnavailableError(f"table {table.label!r} partition {partition} is closed")
        return tables.store

    async def release(self) -> None:
        """Close the transaction and the stores, whatever fails on the way."""
        stores = [lane.tables.store for lane in self.lanes if lane.tables is not None]
        for lane in self.lanes:
            lane.tables, lane.views = None, []
            lane.release()
        try:
            if self._transaction is not None:
                await self._transaction.close()
        except Exception as exc:
            log.warning("%s: closing the transaction failed: %r", self.name, exc)
        finally:
            for store in stores:
                await close_store(store)

    # corrupt local state (Kafka Streams' task-corrupted rule) ----------------------------
    def _store_damaged(self, lane: Lane, damage: StoreCorruptError) -> None:
        self.damaged.setdefault(lane, damage)
        self.damage_found.set()
        self._on_damage(lane, damage)

    def take_damaged(self) -> dict[Lane, StoreCorruptError]:
        """The stores found corrupt so far (forgotten here: the caller rebuilds them)."""
        damaged, self.damaged = self.damaged, {}
        self.damage_found.clear()
        return damaged

    async def discard_damaged(self, error: StoreCorruptError) -> None:
        """While opening (stores released): remove every store found corrupt, so that
        the next try opens it empty and restores or replays it in full."""
        damaged = self.take_damaged()
        if not damaged:
            raise error  # from no store of this task: nothing to wipe here
        for lane, damage in damaged.items():
            self._check_rebuild(lane, damage)
            self._warn_rebuild(lane, damage)
            await asyncio.to_thread(discard, damage.path)
            lane.history_next = 1
            self._counts.rebuilt += 1

    async def swap_store(self, lane: Lane, damage: StoreCorruptError) -> None:
        """Close ``lane``'s corrupt store, remove it, and open it empty."""
        self._check_rebuild(lane, damage)
        self._warn_rebuild(lane, damage)
        tables, lane.tables = lane.tables, None
        if tables is not None:
            tables.store.close()
        await asyncio.to_thread(discard, damage.path)
        self._counts.rebuilt += 1
        lane.history_next = 1
        lane.tables = await self.open_one(lane)

    def _check_rebuild(self, lane: Lane, damage: StoreCorruptError) -> None:
        """Raise (the partition stops here, naming the store and the fix) when ``lane``'s
        store cannot be rebuilt from a source, or the disk keeps corrupting stores."""
        where = f"agent {lane.name!r} of {self.name}"
        rebuilt = self._counts.rebuilt
        if rebuilt >= MAX_REBUILDS:
            raise StoreCorruptError(
                f"{damage}. {rebuilt} corrupt local stores of {self.name} were wiped and "
                f"rebuilt already: the disk under {damage.path} keeps corrupting them. Check "
                "it (or give the worker a --data-dir on another disk), then start it again",
                path=damage.path,
                status=damage.status,
            )
        if self._transaction is None and (not lane.replays or not self._replayable):
            raise StoreCorruptError(
                f"{damage}. The state of {where} has no changelog on this transport and no "
                "event-store history to be rebuilt from: declare history=FromEventStore() "
                f"on the agent, restore {damage.path} from a backup, or remove it to start "
                "the partition empty (its state is then lost)",
                path=damage.path,
                status=damage.status,
            )

    def _warn_rebuild(self, lane: Lane, damage: StoreCorruptError) -> None:
        source = (
            "restored from its changelog" if self._transaction else "rebuilt from the event store"
        )
        log.warning(
            "%s: the local store of agent %s at %s is corrupt (%s): it is wiped and %s; "
            "the batch in hand is dropped and runs again afterwards (nothing is parked)",
            self.name,
            lane.name,
            damage.path,
            damage.status,
            source,
        )


async def close_store(store: Store) -> None:
    """Close ``store`` in a thread and wait until it is closed: a RocksDB close flushes,
    and on a full disk it retries for seconds, which must not stop the event loop (the
    views, ``/readyz``, the group's heartbeats). It is waited for to the end (a
    cancelled caller still lets it finish), so its directory's lock is free before the
    partition can open there again; nothing reads the store meanwhile (its lane let it
    go first)."""
    closing = asyncio.ensure_future(asyncio.to_thread(store.close))
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await asyncio.gather(closing, return_exceptions=True)
        raise


def _close_when_opened(opening: asyncio.Future[Store]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
