"""The event store as the only source (``STREAMAPP_BROKER=none``): the embedded mode.

No broker runs. One worker owns every partition of every agent; each partition replays
the store (catch-up), then keeps following it through the worker's one
:class:`~streamapp.catchup.StoreFeed`, so events appended while the worker runs reach
the tables within about a poll interval. State lives in the local RocksDB stores only:
a lost store is rebuilt by replaying the store from position 1. A second worker for the
same app and store is refused (a lock held for the worker's life).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ..app import App
from ..catchup import StoreFeed
from ..engine.assignment import Assignment
from ..engine.delivery import Delivery
from ..engine.metrics import NO_METRICS, TaskMetrics
from ..engine.parking import parker
from ..engine.task import PartitionTask, TaskConfig, decode_stored
from ..events import Event
from ..settings import Settings
from ..tables.store import RocksStore, Store

log = logging.getLogger("streamapp.eventstore")


class _StorePort:
    """A partition fed by the store: the feed follows it once it is live."""

    def __init__(self, feed: StoreFeed) -> None:
        self.feed = feed
        self.task: PartitionTask | None = None

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def rewind(self, position: int) -> None:
        pass

    async def settle(self, position: int) -> None:
        pass  # the checkpoint in the table is the only position

    def end(self) -> int | None:
        return None  # store positions are global: no per-partition end

    async def begin(self, position: int | None, *, stateful: bool) -> int:
        task = self.task
        assert task is not None
        if not stateful:  # no state to build: new events only, like a new consumer group
            task.history_next = await self.feed.store.head() + 1
        self.feed.follow(task)
        return task.history_position()


def _decode(delivery: Delivery) -> Event:
    return decode_stored(delivery)


class StoreSource:
    """Every partition of every agent, fed from the event store."""

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
        self._config = TaskConfig(
            max_batch_records=settings.max_batch_records,
            batch_budget_s=settings.batch_budget_ms / 1000,
            redeliver_pause_s=settings.poll_timeout_ms / 1000,
            close_budget_s=settings.rebalance_timeout_ms / 2000,
        )

    async def start(self) -> None:
        await self._lock.__aenter__()  # raises when another worker holds it
        self._locked = True
        for agent in self.app.agents.values():
            for p in range(agent.topic.partitions):
                task = self._task(agent.name, p)
                self.assignment.tasks[(agent.topic.name, p)] = task
                task.start()
        self.assignment.rebalancing = False

    def _task(self, agent_name: str, p: int) -> PartitionTask:
        agent = self.app.agents[agent_name]
        settings = self.settings
        name = f"{agent.topic.name}[{p}]"
        path = Path(settings.data_dir) / self.app.id / agent.name / str(p)
        timeout = settings.store_open_timeout_s

        def open_store(spaces: list[str]) -> Store:
            return RocksStore(path, spaces, open_timeout_s=timeout)

        port = _StorePort(self.feed)
        task = PartitionTask(
            agent,
            p,
            port,
            name=name,
            config=self._config,
            decode=_decode,
            park=parker(None, agent, name),
            open_store=open_store,
            history=self.feed,
            metrics=self.metrics,
        )
        port.task = task
        return task

    async def stop(self) -> None:
        tasks = list(self.assignment.tasks.values())
        self.assignment.tasks.clear()
        for task in tasks:
            self.feed.forget(task)
        await asyncio.gather(*(t.close() for t in tasks), return_exceptions=True)
        if self._locked:
            self._locked = False
            await self._lock.__aexit__(None, None, None)

    async def wait(self) -> None:
        await self.feed.wait()
