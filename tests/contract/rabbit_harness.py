"""The agent contract over real RabbitMQ: an in-process Worker, observed from outside.

Each harness has its own app id and topic names. Two RabbitMQ rules shape it:

- Table state on RabbitMQ comes from the event store (no changelog; a partition with
  tables, no local state and no history is refused), so :meth:`RabbitHarness.start`
  gives every agent ``history=FromEventStore()`` over an empty SQLite store of its own:
  the catch-up is instant and live deliveries follow, as for any RabbitMQ app.
- The suite speaks Kafka's binary headers (``ce_*``, ``content-type``); here they travel
  as ``cloudEvents_*`` headers and the ``content_type`` property, and are read back so.

What went through an exchange is read by a *tap*: a queue of the harness's own, bound to
every exchange of the app with every partition's routing key, so it gets a copy of each
message routed there without taking anything from the worker's queues (``crossed``: a
retry queue's copies, consumed by the relay since). Dead-letter and parking exchanges
are left untapped: nothing consumes them (``crossed`` reads their queues), and a tap
bound there would route a park or a dead letter whose queue is gone, which must come
back unroutable (``mandatory``) instead.

``unsettled`` is routed to the source exchanges (sent, or republished by the relay, as
the tap counts them) minus acked: AMQP shows a queue's ready count but not its
unacknowledged one (the broker here runs without the management plugin), so acks are
counted where they are made, by the worker's partition ports.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp

from streamapp import App, FromEventStore
from streamapp.topics import TopicRole, partition_for
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.source import RabbitSource
from streamapp.transports.rabbitmq.topology import create_topology, plans, queue_name
from streamapp.transports.rabbitmq.wire import from_message
from streamapp.worker import Worker
from tests.support.waits import until

from .harness import AgentHarness, Parked, counter, read_view
from .kafka_harness import FAST


class RabbitHarness(AgentHarness):
    redeliver_pause_s = 1.0
    stateless_calls_exact = False
    due_order_kept = False

    def __init__(self, amqp_url: str, tmp: Path) -> None:
        super().__init__()
        self.amqp_url, self.tmp = amqp_url, tmp
        self.ns = f"contract-{uuid.uuid4().hex[:10]}-"
        self.worker: Worker | None = None
        self._sink: RabbitSink | None = None
        self._http: aiohttp.ClientSession | None = None
        self._sent = 0
        self._records: list[tuple[int, bytes | None]] = []
        """(position, value) of each record sent: positions are a per-partition delivery
        sequence that starts at 0 on a fresh partition (no redeliveries before a park)."""
        self._next: dict[tuple[str, int], int] = {}
        self._tap: aio_pika.abc.AbstractConnection | None = None
        self._tapped: list[tuple[str, Parked]] = []
        self._untapped: set[str] = set()
        """(exchange, message) of every message routed to the app's exchanges."""

    def new_app(self, **settings: Any) -> App:
        return App(
            f"{self.ns}app",
            broker="rabbitmq",
            amqp_url=self.amqp_url,
            event_store=f"sqlite:///{self.tmp / 'events.db'}",
            data_dir=self.tmp / "data",
            web_port=0,
            **{**FAST, **settings},
        )

    def name(self, base: str) -> str:
        return self.ns + base

    async def start(self, app: App) -> None:
        for name, agent in list(app.agents.items()):  # state comes from the event store
            replayed = dataclasses.replace(agent, history=FromEventStore())
            app.agents[name] = replayed
            app.tables.update({t.name: (replayed, t) for t in replayed.tables})
        self.app = app
        settings = app.settings()
        await create_topology(app, settings)
        wanted = plans(app, settings.delayed_policy)
        counts = {p.name: p.partitions for p in wanted}
        await self._narrow(counts)
        self._untapped = {
            p.name for p in wanted if p.role in (TopicRole.PARKING, TopicRole.DEAD_LETTER)
        }
        await self._open_tap({n: c for n, c in counts.items() if n not in self._untapped})
        self._sink = RabbitSink(settings, {p.name: p.partitions for p in wanted})
        await self._sink.start()
        self._http = aiohttp.ClientSession()
        worker = Worker(app, settings)
        await worker.start()
        self.worker = worker

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        try:
            if worker is not None:
                await worker.stop()
        finally:
            if self._sink is not None:
                await self._sink.stop()
            if self._http is not None:
                await self._http.close()
            if self._tap is not None:
                await self._tap.close()
            self._sink = self._http = self._tap = None

    async def _narrow(self, counts: dict[str, int]) -> None:
        """Leave the narrowed topics with their queue ``.0`` only (kept by topics create)."""
        if not self.narrowed:
            return
        connection = await aio_pika.connect(self.amqp_url)
        try:
            channel = await connection.channel()
            for topic in sorted(self.narrowed):
                for p in range(1, counts[topic]):
                    await channel.queue_delete(queue_name(topic, p))
        finally:
            await connection.close()

    async def _open_tap(self, exchanges: dict[str, int]) -> None:
        self._tap = await aio_pika.connect(self.amqp_url)
        channel = await self._tap.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        for exchange, partitions in exchanges.items():
            for p in range(partitions):
                await queue.bind(exchange, routing_key=str(p))

        async def received(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self._tapped.append((message.exchange or "", _parked(message)))
            await message.ack()

        await queue.consume(received)

    async def crossed(self, topic: str) -> list[Parked]:
        if topic in self._untapped:
            return await self.parked(topic)
        got = [m for exchange, m in self._tapped if exchange == topic]
        return sorted(got, key=lambda m: m.partition)  # stable: in order per partition

    def metric(self, name: str, agent: str) -> float | None:
        assert self.worker is not None, "start the app first"
        return counter(self.worker.metrics.render().decode(), name, agent)

    async def send_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> None:
        assert self._sink is not None, "start the app first"
        amqp = [("cloudEvents_" + n[3:] if n.startswith("ce_") else n, v) for n, v in headers]
        await self._sink.publish(topic or self.topic, value, key=key, headers=amqp)
        self._sent += 1
        name = topic or self.topic
        p = partition_for(key, self.partitions(name)) if key is not None else 0
        self._records.append((self._next.get((name, p), 0), value))
        self._next[(name, p)] = self._next.get((name, p), 0) + 1

    async def position_of(self, i: int) -> int:
        return self._records[i][0]

    async def value_of(self, i: int) -> bytes | None:
        return self._records[i][1]

    async def settle(self, stalled_s: float = 30.0) -> bool:
        async def settled() -> bool:
            return await self.unsettled() == 0

        return await until(
            settled, what="every record settled", progress=self.progress, stalled_s=stalled_s
        )

    async def unsettled(self) -> int:
        assert self.worker is not None, "start the app first"
        source = self.worker.source
        assert isinstance(source, RabbitSource)
        assert self.app is not None
        # Routed to the source exchanges: what the harness sent, and what the worker sent
        # there itself (the relay's republished retry copies), as the tap counts them.
        routed = sum(1 for exchange, _ in self._tapped if exchange in self.app.sources)
        return max(self._sent, routed) - sum(port.acked for port in source.ports.values())

    def redelivered(self) -> int:
        """Deliveries the worker received with the broker's redelivered flag."""
        assert self.worker is not None, "start the app first"
        source = self.worker.source
        assert isinstance(source, RabbitSource)
        return sum(port.redelivered for port in source.ports.values())

    async def table(self, name: str, key: str) -> Any:
        assert self._http is not None, "start the app first"
        assert self.worker is not None
        return await read_view(self._http, self.worker.web_port, name, key)

    async def parked(self, topic: str) -> list[Parked]:
        assert self.app is not None
        (plan,) = [p for p in plans(self.app) if p.name == topic]
        out: list[Parked] = []
        connection = await aio_pika.connect(self.amqp_url)
        try:  # read without acking: closing the channel puts them back
            channel = await connection.channel()
            for p in range(1 if topic in self.narrowed else plan.partitions):
                queue = await channel.declare_queue(queue_name(topic, p), passive=True)
                while (message := await queue.get(no_ack=False, fail=False)) is not None:
                    out.append(_parked(message, p))
        finally:
            await connection.close()
        return out


def _parked(message: aio_pika.abc.AbstractIncomingMessage, partition: int | None = None) -> Parked:
    """A message as the suite reads records: Kafka's header names (``ce_*``)."""
    key, value, headers = from_message(message.body, message.headers, message.content_type)
    kafka = {("ce_" + n[12:] if n.startswith("cloudEvents_") else n): v for n, v in headers}
    if partition is None:
        partition = int(message.routing_key or 0)
    return Parked(value, key, kafka, partition)
