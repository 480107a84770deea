"""A worker's assignment built from real partition tasks over MemoryStores, for web tests.

No transport: a small in-memory port per partition, and deliveries encoded as Kafka
records (binary CloudEvents), run through :meth:`PartitionTask.process` as a source
would feed them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamapp import App, Event, Redeliver, Table, TableView
from streamapp.engine.assignment import Assignment
from streamapp.engine.delivery import Delivery, Message
from streamapp.engine.metrics import NO_METRICS, TaskMetrics
from streamapp.engine.task import PartitionTask, TaskConfig
from streamapp.kafka import codec
from streamapp.partitioner import partition_for
from streamapp.tables.store import MemoryStore, Store

PARTITIONS = 4


def orders_app(name: str = "webapp") -> App:
    """order_status keyed by order id; an ``order.boom`` event makes the handler raise."""
    app = App(name)
    status: Table[dict[str, Any]] = Table("order_status", help="order id -> status")

    @app.agent(app.topic("orders", partitions=PARTITIONS), tables=[status],
               on_failure=Redeliver(pause_s=0.0))  # fmt: skip
    async def project(event: Event, statuses: TableView[dict[str, Any]]) -> None:
        if event.type == "order.boom":
            raise RuntimeError("boom in the handler")
        assert event.stream_id is not None
        statuses[event.stream_id] = {"status": event.type.removeprefix("order.")}

    return app


class Port:
    """One in-memory partition: records, a read position, a pause flag."""

    absolute = True

    def __init__(self) -> None:
        self.records: list[Message] = []
        self.position = 0
        self.paused = False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def rewind(self, position: int) -> None:
        self.position = position

    async def settle(self, position: int, ahead: Any = None) -> None:
        self.position = max(self.position, position)

    async def committed(self) -> None:
        return None

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        if position is not None:
            self.position = position
        return self.position

    def end(self) -> int | None:
        return len(self.records)

    async def through(self, position: int) -> int:
        return position


async def _no_park(delivery: Delivery, reason: str) -> bool:
    return False


class World:
    """One worker's assignment over some partitions of ``app``'s one agent."""

    def __init__(self, app: App, metrics: TaskMetrics = NO_METRICS) -> None:
        self.app, self.metrics = app, metrics
        self.agent = next(iter(app.agents.values()))
        self.assignment = Assignment(app)
        self.ports: dict[int, Port] = {}
        self.stores: dict[int, Store] = {}

    def task(self, p: int) -> PartitionTask:
        return self.assignment.tasks[(self.agent.topic.name, p)]

    async def own(self, partitions: Iterable[int], *, open: bool = True) -> None:
        """Assign ``partitions`` to this worker; open them (live) unless ``open`` is False."""
        for p in partitions:
            port = self.ports[p] = Port()
            task = PartitionTask(
                self.agent,
                p,
                port,
                name=f"{self.agent.topic.name}[{p}]",
                config=TaskConfig(redeliver_pause_s=0.0),
                decode=lambda d: codec.decode(d.key, d.value, d.headers),
                park=lambda agent: _no_park,
                open_store=lambda agent, spaces, p=p: self._store(p, spaces),
                metrics=self.metrics,
            )
            self.assignment.tasks[(self.agent.topic.name, p)] = task
            if open:
                await task.open()
        self.assignment.rebalancing = False

    def _store(self, p: int, spaces: list[str]) -> Store:
        if p not in self.stores:
            self.stores[p] = MemoryStore(spaces)
        return self.stores[p]

    def partition_of(self, key: str) -> int:
        return partition_for(key.encode(), self.agent.topic.partitions)

    def append(self, *events: Event) -> None:
        """Put events on their partitions' records (not processed yet); events of
        partitions this worker does not own go to another worker (dropped here)."""
        for event in events:
            key, value, headers = codec.encode(event)
            p = self.partition_of(event.stream_id or "")
            port = self.ports.get(p)
            if port is None:
                continue
            port.records.append(
                Message(self.agent.topic.name, p, len(port.records), key, value, tuple(headers))
            )

    async def process(self) -> None:
        """Feed every owned partition its pending records once, as a source would."""
        for p, port in self.ports.items():
            if port.position < len(port.records):
                await self.task(p).process(port.records[port.position :])

    async def send(self, *events: Event) -> None:
        self.append(*events)
        await self.process()


def order(key: str, status: str = "placed", version: int | None = None) -> Event:
    return Event.create(f"order.{status}", stream_id=key, data={}, version=version)
