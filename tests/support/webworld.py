"""A worker's assignment built from real partition tasks over MemoryStores, for web tests.

No transport: an in-memory port per partition (:class:`tests.support.doubles.MemoryPort`),
and deliveries encoded as Kafka records (binary CloudEvents), run through
:meth:`PartitionTask.process` as a source would feed them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamapp import App, Event, Redeliver, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.engine.assignment import Assignment
from streamapp.engine.delivery import Parker
from streamapp.engine.factory import TaskFactory
from streamapp.engine.interfaces import TaskMetrics
from streamapp.engine.metrics import NO_METRICS
from streamapp.engine.task import PartitionTask
from streamapp.engine.task_config import TaskConfig
from streamapp.records import DeliveryRecord
from streamapp.tables.store import MemoryStore, Store
from streamapp.topics import partition_for

from .doubles import MemoryPort, no_park

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


def versions_app(name: str = "webapp", versions: tuple[int, ...] = (1, 2)) -> App:
    """order_status in ``versions``, each written by its own agent of one topic: version
    N stores ``{"status": ..., "by": N}`` (the fold a new version changes)."""
    app = App(name)
    topic = app.topic("orders", partitions=PARTITIONS)
    for n in versions:
        table: Table[dict[str, Any]] = Table("order_status", version=n)
        app.agent(topic, tables=[table], name=f"project_v{n}")(_fold(n))
    return app


def _fold(n: int) -> Any:
    async def project(event: Event, statuses: TableView[dict[str, Any]]) -> None:
        assert event.stream_id is not None
        statuses[event.stream_id] = {"status": event.type.removeprefix("order."), "by": n}

    return project


class World:
    """One worker's assignment over some partitions of ``app``'s one agent."""

    def __init__(self, app: App, metrics: TaskMetrics = NO_METRICS, park: Parker = no_park) -> None:
        self.app, self.metrics, self.park = app, metrics, park
        self.agent = next(iter(app.agents.values()))
        self.assignment = Assignment(app)
        self.ports: dict[int, MemoryPort] = {}
        self.stores: dict[int, Store] = {}
        self.other_stores: dict[tuple[str, int], Store] = {}
        """The stores of the topic's other agents (other table versions)."""

    def task(self, p: int) -> PartitionTask:
        return self.assignment.tasks[(self.agent.topic.name, p)]

    async def own(self, partitions: Iterable[int], *, open: bool = True) -> None:
        """Assign ``partitions`` to this worker; open them (live) unless ``open`` is False."""
        for p in partitions:
            port = self.ports[p] = MemoryPort(bounded=True)
            task = TaskFactory(
                config=TaskConfig(redeliver_pause_s=0.0),
                decode=lambda d: codec.decode(d.key, d.value, d.headers),
                park=lambda agent, name: self.park,
                metrics=self.metrics,
            ).create(
                self.app.agents_of(self.agent.topic.name),
                p,
                port,
                name=f"{self.agent.topic.name}[{p}]",
                open_store=lambda agent, spaces, p=p: self._store(agent.name, p, spaces),
            )
            self.assignment.tasks[(self.agent.topic.name, p)] = task
            if open:
                await task.open()
        self.assignment.rebalancing = False

    def _store(self, agent: str, p: int, spaces: list[str]) -> Store:
        """Partition ``p``'s store of ``agent`` (``stores[p]``: the first agent's)."""
        if agent != self.agent.name:
            return self.other_stores.setdefault((agent, p), MemoryStore(spaces))
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
                DeliveryRecord(
                    self.agent.topic.name, p, len(port.records), key, value, tuple(headers)
                )
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
