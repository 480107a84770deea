"""The event store as the only source (``STREAMAPP_BROKER=none``): the embedded mode.

No broker runs. One worker owns every partition of every agent; each partition replays
the store (catch-up), then keeps following it through the worker's one
:class:`~streamapp.catchup.StoreFeed`, so events appended while the worker runs reach
the tables within about a poll interval. State lives in the local RocksDB stores only:
a lost store is rebuilt by replaying the store from position 1. A second worker for the
same app and store is refused (a lock held for the worker's life).

Parking (``on_failure=Park(destination)``) has no broker to publish to: a parked copy is
a row of ``streamapp_parked`` in the store's own database (:class:`StoreParking`), read
back with ``streamapp store parked``. The position in its ``streamapp-source`` header is
the event's global store position. ``streamapp store parked replay`` sends rows back:
the worker applies them through the lane that parked them (:mod:`.resend`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from ...agents.agent import Agent
from ...app import App
from ...catchup.feed import StoreFeed
from ...engine.assignment import Assignment
from ...engine.factory import TaskFactory
from ...engine.interfaces import NO_LANES, Committed, TaskMetrics
from ...engine.metrics import NO_METRICS
from ...engine.parking import parker
from ...engine.replay import decode_stored
from ...engine.task import PartitionTask
from ...engine.task_config import TaskConfig
from ...eventstore.base import EventStoreBackend
from ...records import Message, Receipt
from ...settings.settings import Settings
from ...tables.store import Store, rocks_opener
from .resend import ResendFollower

log = logging.getLogger("streamapp.eventstore")


class _StorePort:
    """A partition fed by the store: the feed follows it once it is live."""

    absolute = True

    def __init__(self, feed: StoreFeed) -> None:
        self.feed = feed
        self.task: PartitionTask | None = None

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def rewind(self, position: int) -> None:
        pass

    async def settle(self, position: int, ahead: Mapping[str, int] = NO_LANES) -> None:
        pass  # the checkpoint in the table is the only position

    async def committed(self) -> Committed | None:
        return None

    def end(self) -> int | None:
        return None  # store positions are global: no per-partition end

    async def through(self, position: int) -> int:
        return position

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        task = self.task
        assert task is not None
        # Agents without tables start with new events only, like a new consumer group.
        task.replay.start_following(await self.feed.store.head())
        self.feed.follow(task.replay)
        return task.replay.history_position()


class StoreParking:
    """The store as the engine's parking :class:`~streamapp.engine.interfaces.Sink`: a
    park is a committed row of ``streamapp_parked`` (the destination is the policy's, as
    a Kafka topic would be). Nothing to connect: the store is open already."""

    def __init__(self, store: EventStoreBackend) -> None:
        self.store = store

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> None:
        await self.store.park(topic, value, key=key, headers=headers)

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        for m in messages:
            await self.store.park(m.topic, m.value, key=m.key, headers=m.headers)
        return [Receipt(m.topic) for m in messages]


@runtime_checkable
class _TakeoverAware(Protocol):
    """A worker lock that can be taken over while held (PostgreSQL: its session was lost
    and another worker took the lock before this one took it again)."""

    taken_over: asyncio.Event
    error: BaseException | None


class StoreSource:
    """Every partition of every agent, fed from the event store. A worker lock taken
    over by another worker stops this one (``wait`` raises its error)."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        feed: StoreFeed,
        lock: contextlib.AbstractAsyncContextManager[None],
        metrics: TaskMetrics = NO_METRICS,
    ) -> None:
        self.app, self.settings, self.feed, self.metrics = app, settings, feed, metrics
        self.assignment = Assignment(app)
        self._lock = lock
        self._locked = False
        self._parking = StoreParking(feed.store)
        self._factory = TaskFactory(
            config=replace(TaskConfig.from_settings(settings), store_is_source=True),
            decode=decode_stored,
            park=lambda agent, name: parker(self._parking, agent, name),
            history=feed,
            metrics=metrics,
            locate=self.assignment.read_store,
            on_fatal=self._fail,
        )
        self._failed: BaseException | None = None
        self._fatal = asyncio.Event()
        self._lock_watch: asyncio.Task[None] | None = None
        self._resends: tuple[ResendFollower, asyncio.Task[None]] | None = None

    async def start(self) -> None:
        await self._lock.__aenter__()  # raises when another worker holds it
        self._locked = True
        if isinstance(self._lock, _TakeoverAware):
            self._lock_watch = asyncio.create_task(self._taken_over(self._lock))
        for topic in self.app.sources.values():
            for p in range(topic.partitions):
                task = self._task(topic.name, p)
                self.assignment.tasks[(topic.name, p)] = task
                task.start()
        self.assignment.rebalancing = False
        if ResendFollower.needed(self.app):  # parked rows sent back (store parked replay)
            follower = ResendFollower(self.app, self.feed.store, self.assignment)
            runs = asyncio.create_task(follower.run(), name="parked rows sent back")
            self._resends = follower, runs

    def _task(self, topic: str, p: int) -> PartitionTask:
        settings, app = self.settings, self.app
        name = f"{topic}[{p}]"
        port = _StorePort(self.feed)

        def open_store(agent: Agent, spaces: list[str]) -> Store:
            return rocks_opener(settings, app.id, agent.name, p)(spaces)

        task = self._factory.create(app.agents_of(topic), p, port, name=name, open_store=open_store)
        port.task = task
        return task

    async def stop(self) -> None:
        if self._resends is not None:  # between entries: the one in hand commits
            follower, runs = self._resends
            await follower.stop()
            runs.cancel()
            await asyncio.gather(runs, return_exceptions=True)
        tasks = list(self.assignment.tasks.values())
        self.assignment.tasks.clear()
        for task in tasks:
            self.feed.forget(task.replay)
        await asyncio.gather(*(t.close() for t in tasks), return_exceptions=True)
        if self._lock_watch is not None:
            self._lock_watch.cancel()
        if self._locked:
            self._locked = False
            await self._lock.__aexit__(None, None, None)

    async def wait(self) -> None:
        """Until the feed ends; raises when a partition cannot go on (an agent refused)."""
        feed = asyncio.ensure_future(self.feed.wait())
        fatal = asyncio.ensure_future(self._fatal.wait())
        try:
            await asyncio.wait({feed, fatal}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            fatal.cancel()
        if self._failed is not None:  # the feed goes on until the worker stops it
            raise self._failed
        await feed

    async def _taken_over(self, lock: _TakeoverAware) -> None:
        await lock.taken_over.wait()
        self._fail(lock.error or RuntimeError("the worker lock was taken over"))

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
        self._fatal.set()
