"""Standby replicas (setting ``standby_replicas``): warm copies of other workers' stores.

A standby of a source partition keeps, on this worker, the local stores of every agent
of its topic that has tables, and applies their changelogs as the owner commits them:
``read_committed`` (an aborted or open transaction is never applied), in the chunks a
restore writes (:class:`~streamapp.tables.changelog.RestoreChunk`: the records and the
changelog position after them in one atomic RocksDB write). It never writes to Kafka and
never runs an agent: it is never the partition's owner, and the assignor never makes it
a standby of a partition this worker owns (:mod:`streamapp.transports.kafka.assignor`).

Its stores are the ones the partition's task opens here (same directory, same
``memory_limit_mb`` cache, :func:`~streamapp.tables.store.rocks_opener`), so a promotion
is the ordinary open of a store already open: the standby stops following and hands its
stores over (:class:`PromotedStores`; no close, which flushes, and no reopen), then the
task checks it owns the partition (the owner's lease), restores from the store's
changelog position (only the tail the standby had not applied) and checks what the
state was made from (:mod:`streamapp.engine.provenance`). Before a standby answers a
``?stale_ok=1`` view it is checked alike, once it has caught up: lineage (a store of a
changelog deleted and made again is wiped, :mod:`.lineage`), then provenance (another
partition count, table version or event store: it refuses and never answers).

Active partitions first: a standby applies nothing while a partition this worker owns is
restoring (its opening: stores, fence, changelog tail), as Kafka Streams updates standby
tasks only once no active task restores. A fail-over hands the lost partitions' new
standbys out in the same assignment that promotes the old ones, and their restores (a
whole store each) would otherwise take the event loop in turns with the openings that
make the lost keys answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ...agents.agent import Agent
from ...app import App
from ...engine.assignment import StandbyCopy
from ...engine.provenance import StoreIdentity, check_tables
from ...engine.state import close_store
from ...errors import SourceError, StateMismatchError, StoreError
from ...tables.changelog import RestoreChunk
from ...tables.partition import PartitionTables, spaces_for
from ...tables.store import Store
from .changelog_read import CommittedReader
from .lineage import mismatch

log = logging.getLogger("streamapp.standby")

CHUNK = 20_000
"""Changelog records per standby write (atomic, with the position after them)."""
END_EVERY_S = 1.0
"""How often a standby reads its changelog's end (its lag) while records come."""
RETRY_S = 2.0
"""The pause before a standby that failed (the broker away) starts following again."""
YIELD_S = 0.05
"""How often a standby that gives way to an active partition's restore looks again."""

Opener = Callable[[Agent, int], Callable[[list[str]], Store]]
"""Opens an agent's store of a partition with these spaces (blocking)."""
Identity = Callable[[], Awaitable[StoreIdentity]]
"""The event store the worker reads, for the provenance check (agents with history)."""


class StandbyStore:
    """One agent's standby store of one partition, following its changelog."""

    def __init__(self, agent: Agent, partition: int, changelog: str) -> None:
        self.agent, self.partition = agent, partition
        self.tp = TopicPartition(changelog, partition)
        self.tables: PartitionTables | None = None
        """The store, once open (None while opening and once closed)."""
        self.lag: int | None = None
        """Changelog records not applied yet, at the last reading of its end (None: not
        known yet)."""
        self.behind_since: float | None = None
        """Monotonic time since which the standby is behind (None: caught up)."""
        self.applied = 0
        """Changelog records applied since this standby started."""
        self.checked = False
        """Lineage and provenance checked: it may answer ``?stale_ok=1`` views."""
        self.refused: str | None = None
        """Why this state is refused (another partition count, table version, event
        store): it never answers and stops following."""

    def lag_s(self) -> float | None:
        """Seconds since the standby was last caught up (0: caught up; None: unknown)."""
        if self.lag is None:
            return None
        since = self.behind_since
        return 0.0 if since is None else time.monotonic() - since

    def status(self) -> dict[str, Any]:
        lag_s = self.lag_s()
        return {
            "changelog": f"{self.tp.topic}[{self.tp.partition}]",
            "position": None if self.tables is None else self.tables.checkpoint.changelog,
            "lag": self.lag,
            "lag_s": None if lag_s is None else round(lag_s, 3),
            "applied": self.applied,
            "serving": self.checked and self.refused is None,
            **({"refused": self.refused} if self.refused else {}),
        }


class StandbyReplica:
    """The standby stores of one source partition (every agent of its topic with
    tables), each following its changelog in a task of its own."""

    def __init__(
        self,
        source: TopicPartition,
        agents: Iterable[Agent],
        app: App,
        *,
        bootstrap: str,
        opener: Opener,
        identity: Identity | None,
        restoring: Callable[[], bool] = lambda: False,
    ) -> None:
        self.source, self.bootstrap = source, bootstrap
        self._restoring = restoring
        """True while a partition this worker owns restores: this standby waits."""
        self.name = f"{source.topic}[{source.partition}]"
        self._opener, self._identity, self._app = opener, identity, app
        self.stores = [
            StandbyStore(agent, source.partition, changelog)
            for agent in agents
            if (changelog := app.changelog_topic(agent)) is not None
        ]
        self._tasks = [
            asyncio.create_task(self._run(store), name=f"standby {self.name} {store.agent.name}")
            for store in self.stores
        ]
        self._handing: dict[str, Store] | None = None

    def copy(self, table: str) -> StandbyCopy | None:
        """The checked copy of the table labelled ``table``, with its lag (None: not
        here, not checked yet, or refused)."""
        for store in self.stores:
            tables = store.tables
            if tables is None or not store.checked or store.refused is not None:
                continue
            if any(t.label == table for t in store.agent.tables):
                return StandbyCopy(tables, store.lag or 0, store.lag_s() or 0.0)
        return None

    def lag(self) -> int:
        """The records the furthest-behind store of this partition is behind (-1: not
        known yet): what the assignor weighs (:class:`.assignor.Holdings`)."""
        lags = [s.lag for s in self.stores]
        if any(lag is None for lag in lags):
            return -1
        return max((lag for lag in lags if lag is not None), default=0)

    def status(self) -> dict[str, Any]:
        return {"agents": {s.agent.name: s.status() for s in self.stores}}

    async def close(self) -> None:
        """Stop following and close every store (its lock free once this returns)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def hand_over(self) -> dict[str, Store]:
        """Stop following and hand each agent's store over open, by agent name: the
        partition's task opens here next and takes it as it is, with no close (a flush)
        and no open in between. A store refused, failed or still opening is closed."""
        self._handing = {}
        await self.close()
        return self._handing

    async def _run(self, store: StandbyStore) -> None:
        agent = store.agent
        open_store = self._opener(agent, store.partition)
        opening = asyncio.ensure_future(asyncio.to_thread(open_store, spaces_for(agent.tables)))
        try:  # the open may wait for the previous holder's lock: off the loop
            raw = await asyncio.shield(opening)
        except asyncio.CancelledError:  # dropped meanwhile: close the store once open
            opening.add_done_callback(_close_when_opened)
            raise
        except StoreError as exc:
            log.warning("standby %s of agent %s does not open: %s", self.name, agent.name, exc)
            store.refused = str(exc)
            return
        try:
            store.tables = PartitionTables(
                agent.tables, raw, store.partition, agent.topic, where=f"standby {self.name}"
            )
            while store.refused is None:
                try:
                    await self._follow(store, store.tables)
                except (KafkaError, OSError, SourceError) as exc:
                    log.warning(
                        "standby %s of agent %s: %r; following again in %.0fs",
                        self.name,
                        agent.name,
                        exc,
                        RETRY_S,
                    )
                    await asyncio.sleep(RETRY_S)
        except Exception as exc:  # a store error, or a bug: this standby stops, nothing else
            log.error("standby %s of agent %s stopped: %r", self.name, agent.name, exc)
            store.refused = str(exc)
        finally:
            store.tables = None
            if self._handing is not None and store.refused is None:
                self._handing[agent.name] = raw  # between two writes: its own checkpoint's
            else:
                await close_store(raw)

    async def _follow(self, store: StandbyStore, tables: PartitionTables) -> None:
        tp = store.tp
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )
        try:
            await consumer.start()
            consumer.assign([tp])
            consumer.pause(tp)  # read by the CommittedReader
            end = (await consumer.end_offsets([tp]))[tp]
            why = await mismatch(consumer, tp, tables.checkpoint, end, 30.0)
            if why is not None:
                log.warning(
                    "standby %s: its store is not of changelog %s: %s; wiped", self.name, tp, why
                )
                tables.wipe()
            reader = CommittedReader(consumer, tp)
            position, read_end = tables.checkpoint.changelog, time.monotonic()
            while True:
                await self._give_way()
                batches, after = await reader.fetch(position)
                chunk = RestoreChunk(tables)
                for batch, next_offset in batches:
                    chunk.apply_records(batch, position)
                    position = next_offset
                    if chunk.taken >= CHUNK:
                        store.applied += _write(chunk, tables, position)
                        await asyncio.sleep(0)
                        await self._give_way()
                        chunk = RestoreChunk(tables)
                if chunk.taken or after != tables.checkpoint.changelog:
                    store.applied += _write(chunk, tables, after)
                position = after
                if not batches or time.monotonic() - read_end >= END_EVERY_S:
                    end, read_end = (await consumer.end_offsets([tp]))[tp], time.monotonic()
                self._behind(store, max(0, end - position))
                if not store.checked and (store.lag == 0 or tables.checkpoint.changelog > 0):
                    await self._check(store, tables)
                    if store.refused is not None:
                        return
                await asyncio.sleep(0)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _give_way(self) -> None:
        """Wait while a partition this worker owns restores (see the module): looked at
        every :data:`YIELD_S`, as a task's phase moves in many places and signals none."""
        while self._restoring():  # noqa: ASYNC110
            await asyncio.sleep(YIELD_S)

    @staticmethod
    def _behind(store: StandbyStore, lag: int) -> None:
        if lag == 0:
            store.behind_since = None
        elif store.lag == 0 or store.behind_since is None:
            store.behind_since = time.monotonic()
        store.lag = lag

    async def _check(self, store: StandbyStore, tables: PartitionTables) -> None:
        """What a partition's open checks (:func:`~streamapp.engine.provenance.check_tables`):
        a state of another partition count, table version or event store is refused."""
        agent = store.agent
        identity = None
        if agent.history is not None and self._identity is not None:
            identity = await self._identity()
        try:
            check_tables(agent, tables, agent.topic, store.partition, identity)
        except StateMismatchError as exc:
            log.error(
                "standby %s of agent %s refused, never served: %s", self.name, agent.name, exc
            )
            store.refused = str(exc)
            return
        store.checked = True


def _close_when_opened(opening: asyncio.Future[Store]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _write(chunk: RestoreChunk, tables: PartitionTables, position: int) -> int:
    chunk.write(tables, position)
    return chunk.taken


class Standbys:
    """This worker's standby replicas, by (topic, partition), as the assignor gives them."""

    def __init__(
        self,
        app: App,
        bootstrap: str,
        opener: Opener,
        identity: Identity | None,
        restoring: Callable[[], bool] = lambda: False,
    ) -> None:
        self.app, self.bootstrap, self._opener, self._identity = app, bootstrap, opener, identity
        self._restoring = restoring
        """True while a partition this worker owns restores (standbys wait meanwhile)."""
        self.replicas: dict[tuple[str, int], StandbyReplica] = {}

    def held(self) -> dict[TopicPartition, int]:
        """Each standby partition with the records it is behind (-1: not known yet)."""
        return {r.source: r.lag() for r in self.replicas.values()}

    async def promote(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int, str], Store]:
        """Stop the standbys of ``keys`` (their partitions' tasks open here now); their
        stores, open, by (topic, partition, agent name) (:meth:`StandbyReplica.hand_over`)."""
        taking = [self.replicas.pop(k) for k in set(keys) if k in self.replicas]
        handed = await asyncio.gather(*(r.hand_over() for r in taking))
        return {
            (replica.source.topic, replica.source.partition, agent): store
            for replica, stores in zip(taking, handed, strict=True)
            for agent, store in stores.items()
        }

    async def drop(self, keys: Iterable[tuple[str, int]]) -> None:
        """Close the standbys of ``keys``."""
        closing = [self.replicas.pop(k) for k in set(keys) if k in self.replicas]
        await asyncio.gather(*(r.close() for r in closing), return_exceptions=True)

    async def update(self, wanted: Iterable[TopicPartition]) -> None:
        """Keep standbys of ``wanted`` (topics of agents with tables) and of no other."""
        keys = {(tp.topic, tp.partition) for tp in wanted}
        await self.drop([k for k in self.replicas if k not in keys])
        for topic, partition in sorted(keys - set(self.replicas)):
            agents = [a for a in self.app.agents_of(topic) if a.tables]
            if agents:
                log.info("standby of %s[%d]", topic, partition)
                self.replicas[(topic, partition)] = StandbyReplica(
                    TopicPartition(topic, partition),
                    agents,
                    self.app,
                    bootstrap=self.bootstrap,
                    opener=self._opener,
                    identity=self._identity,
                    restoring=self._restoring,
                )

    def copy(self, topic: str, partition: int, table: str) -> StandbyCopy | None:
        replica = self.replicas.get((topic, partition))
        return None if replica is None else replica.copy(table)

    def status(self) -> dict[str, Any]:
        return {r.name: r.status() for _, r in sorted(self.replicas.items())}

    async def close(self) -> None:
        await self.drop(list(self.replicas))


class PromotedStores:
    """Promoted standbys' stores, open, until their partitions' tasks take them (the
    group gave the partition here: :meth:`Standbys.promote`). A task takes its store in
    its store-opening thread (``engine.state.open_one``), hence the lock; what no task
    took (closed before it opened) is closed at the next revoke or at the stop."""

    def __init__(self) -> None:
        self._stores: dict[tuple[str, int, str], Store] = {}
        self._lock = threading.Lock()

    def add(self, stores: dict[tuple[str, int, str], Store]) -> None:
        with self._lock:
            self._stores.update(stores)

    def take(self, topic: str, partition: int, agent: str) -> Store | None:
        with self._lock:
            return self._stores.pop((topic, partition, agent), None)

    async def close(self) -> None:
        with self._lock:  # an opening cancelled meanwhile may still take one: not these
            left, self._stores = self._stores, {}
        await asyncio.gather(*(close_store(store) for store in left.values()))
