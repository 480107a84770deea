"""The port contract's harness: each transport's real partition port, driven as the task
drives it, with its real delivery path, and a probe in place of the partition task.

A :class:`Member` owns some partitions of one topic for a while (a consumer in a group,
a connection with a channel per partition queue, a broker's partitions): it holds the
transport's :class:`~streamapp.engine.interfaces.PartitionPort` of each partition and what
the transport handed to the task, in order. Closing a member without settling is what a
worker that stops (or dies) leaves behind; the next member opened on the same partitions
is the next owner. Nothing in a contract test knows which transport runs it.

:class:`SinkHarness` does the same for each transport's confirmed publisher.

The interfaces under test are imported here, in one place: the port protocol
(:mod:`streamapp.engine.interfaces`), the delivery the task receives and the message a
sink publishes (:mod:`streamapp.records`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple

import aio_pika
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp import App, Event
from streamapp.catchup.feed import StoreFeed
from streamapp.codecs import structured
from streamapp.engine.interfaces import PartitionPort
from streamapp.engine.phase import Phase
from streamapp.eventstore import EventStoreBackend, open_store
from streamapp.records import Delivery
from streamapp.records import DeliveryRecord as Record
from streamapp.records import Message as Outgoing
from streamapp.testing import MemoryBroker
from streamapp.testing.broker import _MemoryPort
from streamapp.topics import TopicSpec, partition_for
from streamapp.transports.embedded.source import _StorePort
from streamapp.transports.kafka.commits import OffsetCommits
from streamapp.transports.kafka.port import KafkaPartitionPort
from streamapp.transports.kafka.sink import KafkaSink
from streamapp.transports.rabbitmq.port import RabbitPartitionPort
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.topology import create_topology, queue_name
from streamapp.transports.rabbitmq.wire import from_message
from tests.support.records import read_to_end
from tests.support.waits import until

TOPIC_PARTITIONS = 2


class Member(ABC):
    """One owner of some partitions: their ports and what was handed to the task."""

    def __init__(self, partitions: Sequence[int]) -> None:
        self.partitions = list(partitions)
        self.handed: dict[int, list[Delivery]] = {p: [] for p in partitions}
        self._taken: dict[int, int] = dict.fromkeys(partitions, 0)

    @abstractmethod
    def port(self, partition: int) -> PartitionPort:
        """The transport's port of ``partition``."""

    async def begin(self, partition: int, position: int | None, *, stateful: bool = True) -> int:
        """Start live delivery of ``partition`` as the task does (``begin``, ``resume``)."""
        start = await self.port(partition).begin(position, stateful=stateful)
        self.moved(partition, start)
        self.port(partition).resume()
        return start

    def rewind(self, partition: int, position: int) -> None:
        self.port(partition).rewind(position)
        self.moved(partition, position)

    def moved(self, partition: int, position: int) -> None:  # noqa: B027
        """The task moved where ``partition`` is read (a transport that reads from the
        port's position, as the memory broker does, follows it)."""

    async def pump(self) -> None:  # noqa: B027
        """One round of the transport's delivery path (a fetch loop that runs on its own
        does nothing here)."""

    async def take(self, partition: int, n: int, stalled_s: float = 20.0) -> list[Delivery]:
        """The next ``n`` deliveries of ``partition`` handed to the task; fails once none
        came for ``stalled_s``."""
        start = self._taken[partition]
        handed = self.handed[partition]

        async def enough() -> bool:
            if len(handed) < start + n:
                await self.pump()
            return len(handed) >= start + n

        await until(
            enough,
            what=f"{n} deliveries of partition {partition} handed",
            progress=lambda: len(handed),
            stalled_s=stalled_s,
            poll_s=0.02,
            detail=lambda: f"{len(handed) - start} of {n} handed",
        )
        self._taken[partition] = start + n
        return handed[start : start + n]

    def untaken(self, partition: int) -> list[Delivery]:
        """Handed to the task and not yet taken by the test."""
        return self.handed[partition][self._taken[partition] :]

    def receive(self, deliveries: Sequence[Delivery]) -> bool:
        """The probe in place of the task: takes every delivery handed (the task would
        pause the partition and process them)."""
        for d in deliveries:
            self.handed[d.partition].append(d)
        return True

    @abstractmethod
    async def close(self) -> None:
        """Stop owning the partitions, settling nothing more (what a stop leaves)."""


class PortHarness(ABC):
    """One topic of ``TOPIC_PARTITIONS`` partitions on one transport."""

    keeps_settled: bool
    """True when the transport keeps the settled position for the next owner itself
    (Kafka: the group's committed offset; RabbitMQ: acked messages are gone from the
    queue). False when the task's checkpoint is the only record (memory)."""

    def __init__(self) -> None:
        self.values: dict[int, list[bytes]] = {p: [] for p in range(TOPIC_PARTITIONS)}
        self.positions: dict[int, list[int]] = {p: [] for p in range(TOPIC_PARTITIONS)}
        """The transport's position of each record appended (absolute ports)."""
        self.members: list[Member] = []

    def position_of(self, partition: int, i: int) -> int:
        """The position of the ``i``-th record appended to ``partition``: its offset
        (Kafka, memory), its global store position (the event store); on a relative
        port (RabbitMQ), ``i``: the position it gets when delivery begins at 0."""
        return self.positions[partition][i]

    def ident(self, delivery: Delivery) -> bytes | None:
        """What identifies a delivery as the record appended (its value here)."""
        return delivery.value

    def idents(self, deliveries: Sequence[Delivery]) -> list[bytes | None]:
        return [self.ident(d) for d in deliveries]

    @abstractmethod
    async def start(self) -> None:
        """Make the topic."""

    async def stop(self) -> None:
        """Close every member still open, then whatever :meth:`start` opened."""
        for member in self.members:
            with contextlib.suppress(Exception):
                await member.close()

    async def append(self, partition: int, n: int) -> list[bytes]:
        """Append ``n`` records to ``partition``; their values, in order."""
        base = len(self.values[partition])
        values = [f"p{partition}-{base + i}".encode() for i in range(n)]
        self.positions[partition] += await self._append(partition, values)
        self.values[partition] += values
        return values

    @abstractmethod
    async def _append(self, partition: int, values: list[bytes]) -> list[int]:
        """Append ``values`` to ``partition`` in order; their positions."""

    async def open(self, partitions: Sequence[int] = (0, 1)) -> Member:
        """A new owner of ``partitions`` (nothing begun yet)."""
        member = await self._open(partitions)
        self.members.append(member)
        return member

    @abstractmethod
    async def _open(self, partitions: Sequence[int]) -> Member: ...


# Kafka ------------------------------------------------------------------------------
class KafkaMember(Member):
    """A consumer of the app's group with the partitions assigned, its ports, the
    coalesced offset commits the source uses, and the source's fetch loop."""

    def __init__(self, harness: KafkaPortHarness, partitions: Sequence[int]) -> None:
        super().__init__(partitions)
        self.harness = harness
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=harness.bootstrap,
            group_id=harness.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        self.admin = AIOKafkaAdminClient(bootstrap_servers=harness.bootstrap)
        self.commits = OffsetCommits(self.consumer)
        self.tps = {p: TopicPartition(harness.topic, p) for p in partitions}
        self.ports: dict[int, KafkaPartitionPort] = {}
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        await self.admin.start()
        self.consumer.assign(list(self.tps.values()))
        for p, tp in self.tps.items():
            self.consumer.pause(tp)  # as the task does until it begins
            self.ports[p] = KafkaPartitionPort(
                self.consumer,
                tp,
                "earliest",
                admin=self.admin,
                group_id=self.harness.group,
                commits=self.commits,
            )
        self._loop = asyncio.create_task(self._fetch(), name="port contract fetch")

    async def _fetch(self) -> None:
        """The source's poll loop: what ``getmany`` returns goes to the task."""
        while True:
            fetched = await self.consumer.getmany(timeout_ms=100)
            for records in fetched.values():
                self.receive(
                    [
                        Record(r.topic, r.partition, r.offset, r.key, r.value, r.headers)
                        for r in records
                    ]
                )

    def port(self, partition: int) -> PartitionPort:
        return self.ports[partition]

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        await self.commits.close()  # as the source does before the consumer stops
        await self.consumer.stop()
        await self.admin.close()


class KafkaPortHarness(PortHarness):
    keeps_settled = True

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        ns = f"port-{uuid.uuid4().hex[:10]}"
        self.topic, self.group = f"{ns}-in", f"{ns}-app"
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(self.topic, TOPIC_PARTITIONS, 1)])
        finally:
            await admin.close()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True
        )
        await self._producer.start()

    async def stop(self) -> None:
        await super().stop()
        if self._producer is not None:
            await self._producer.stop()

    async def _append(self, partition: int, values: list[bytes]) -> list[int]:
        assert self._producer is not None, "start first"
        sent = [
            await self._producer.send_and_wait(self.topic, value, partition=partition)
            for value in values
        ]
        return [int(m.offset) for m in sent]

    async def _open(self, partitions: Sequence[int]) -> Member:
        member = KafkaMember(self, partitions)
        await member.start()
        return member


# RabbitMQ ---------------------------------------------------------------------------
class RabbitMember(Member):
    """A robust connection and a port (its own channel) per partition queue; the port
    hands deliveries to the task itself."""

    def __init__(self, harness: RabbitPortHarness, partitions: Sequence[int]) -> None:
        super().__init__(partitions)
        self.harness = harness
        self.connection: Any = None
        self.ports: dict[int, RabbitPartitionPort] = {}
        self.failed: list[BaseException] = []

    async def start(self) -> None:
        self.connection = await aio_pika.connect_robust(self.harness.amqp_url)
        for p in self.partitions:
            self.ports[p] = RabbitPartitionPort(
                self.connection,
                self.harness.topic,
                p,
                queue_name(self.harness.topic, p),
                prefetch=100,
                requeue_interval_s=0.1,
                feed=self.receive,
                fail=self.failed.append,
            )

    def port(self, partition: int) -> PartitionPort:
        return self.ports[partition]

    async def close(self) -> None:
        for port in self.ports.values():
            await port.close()
        if self.connection is not None:
            await self.connection.close()
            self.connection = None


class RabbitPortHarness(PortHarness):
    keeps_settled = True

    def __init__(self, amqp_url: str) -> None:
        super().__init__()
        self.amqp_url = amqp_url
        ns = f"port-{uuid.uuid4().hex[:10]}"
        self.app = App(f"{ns}-app", broker="rabbitmq", amqp_url=amqp_url)
        self.topic = f"{ns}-in"
        source = self.app.topic(self.topic, partitions=TOPIC_PARTITIONS)

        @self.app.agent(source)
        async def probe(event: Any) -> None:  # the topology is the app's: one agent
            pass

        self._sink: RabbitSink | None = None

    async def start(self) -> None:
        settings = self.app.settings()
        await create_topology(self.app, settings)
        self._sink = RabbitSink(settings, {self.topic: TOPIC_PARTITIONS})
        await self._sink.start()

    async def stop(self) -> None:
        await super().stop()
        if self._sink is not None:
            await self._sink.stop()

    async def _append(self, partition: int, values: list[bytes]) -> list[int]:
        assert self._sink is not None, "start first"
        for value in values:
            await self._sink.publish(self.topic, value, key=value, partition=partition)
        base = len(self.positions[partition])
        return list(range(base, base + len(values)))  # relative: numbered from begin

    async def _open(self, partitions: Sequence[int]) -> Member:
        member = RabbitMember(self, partitions)
        await member.start()
        return member


# the memory broker ------------------------------------------------------------------
class MemoryMember(Member):
    """The memory broker's ports over its partition lists. As the broker drains a
    partition, a round hands the records from the port's position on; after that, the
    next round goes on after them until the task moves the port (begin, rewind). The
    broker drains inside ``process()`` only, so it has no pause to honour."""

    def __init__(self, harness: MemoryPortHarness, partitions: Sequence[int]) -> None:
        super().__init__(partitions)
        self.ports = {p: _MemoryPort(harness.records[p]) for p in partitions}
        self._next = dict.fromkeys(partitions, 0)

    def port(self, partition: int) -> PartitionPort:
        return self.ports[partition]

    def moved(self, partition: int, position: int) -> None:
        self._next[partition] = self.ports[partition].position  # as the broker reads it

    async def pump(self) -> None:
        for p, port in self.ports.items():
            records = port.records[self._next[p] :]
            if records and self.receive(records):
                self._next[p] = records[-1].position + 1

    async def close(self) -> None:
        self.ports = {}


class MemoryPortHarness(PortHarness):
    keeps_settled = False

    def __init__(self) -> None:
        super().__init__()
        self.records: list[list[Record]] = [[] for _ in range(TOPIC_PARTITIONS)]

    async def start(self) -> None:
        pass

    async def _append(self, partition: int, values: list[bytes]) -> list[int]:
        part = self.records[partition]
        for value in values:
            part.append(Record("in", partition, len(part), value, value, ()))
        return [r.position for r in part[-len(values) :]]

    async def _open(self, partitions: Sequence[int]) -> Member:
        return MemoryMember(self, partitions)


# the event store alone --------------------------------------------------------------
class _FollowingTask:
    """What the store's feed drives in place of a partition task: it takes the events of
    its partition from its checkpoint on (``history_position``) and commits each chunk
    by moving the checkpoint past it. The checkpoint is the task's (its table), so it is
    where the task settles, rewinds and begins: the store port keeps no position."""

    def __init__(self, member: StoreMember, topic: TopicSpec, partition: int) -> None:
        self.member, self.topic, self.partition = member, topic, partition
        self.name = f"{topic.name}[{partition}]"
        self.phase = Phase.LIVE
        self.follows_store = False
        self.stuck_on: dict[str, object] | None = None
        self.replayed = 0
        self.lanes: list[Any] = []
        self.checkpoint = 1
        """The next store position this partition needs (1: nothing applied)."""

    # what the feed and the store port ask of a partition
    @property
    def replay(self) -> _FollowingTask:
        return self

    @property
    def catching_up(self) -> bool:
        return False

    @property
    def live(self) -> bool:
        return self.phase is Phase.LIVE

    @property
    def building(self) -> bool:
        return False

    @property
    def stopped(self) -> bool:
        return self.phase is Phase.CLOSED

    def follow(self, on: bool) -> None:
        self.follows_store = on

    def failing(self) -> list[Any]:
        return []

    def stuck(self, on: dict[str, object] | None) -> None:
        self.stuck_on = on

    def history_position(self) -> int:
        return self.checkpoint

    def start_following(self, head: int) -> None:
        self.follows_store = True  # a task with tables: from its checkpoint, not the head

    def retry_pause_s(self) -> float:
        return 0.1

    async def apply_history(
        self, deliveries: Sequence[Delivery], next_position: int, start: int
    ) -> bool:
        if self.phase is not Phase.LIVE:
            return False
        self.member.receive(list(deliveries))
        self.replayed += len(deliveries)
        self.checkpoint = next_position
        return True


class StoreMember(Member):
    """The worker's partitions over the event store: the store port of each, and the
    store's one feed following them."""

    def __init__(self, harness: StorePortHarness, partitions: Sequence[int]) -> None:
        super().__init__(partitions)
        self.feed = harness.feed
        self.tasks = {p: _FollowingTask(self, harness.spec, p) for p in partitions}
        self.ports: dict[int, _StorePort] = {}
        for p, task in self.tasks.items():
            port = _StorePort(harness.feed)
            port.task = task  # type: ignore[assignment]
            self.ports[p] = port

    def port(self, partition: int) -> PartitionPort:
        return self.ports[partition]

    async def begin(self, partition: int, position: int | None, *, stateful: bool = True) -> int:
        """The task opens its table first: ``position`` is its checkpoint."""
        self.tasks[partition].checkpoint = 1 if position is None else position
        return await super().begin(partition, position, stateful=stateful)

    def moved(self, partition: int, position: int) -> None:
        self.tasks[partition].checkpoint = position

    async def close(self) -> None:
        for task in self.tasks.values():
            task.phase = Phase.CLOSED
            self.feed.forget(task)  # type: ignore[arg-type]


class StorePortHarness(PortHarness):
    """``STREAMAPP_BROKER=none``: the store is the source; one stream per partition."""

    keeps_settled = False

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.spec = TopicSpec("in", TOPIC_PARTITIONS)
        self._store: EventStoreBackend | None = None
        self._feed: StoreFeed | None = None
        self._streams = {p: key_for(p) for p in range(TOPIC_PARTITIONS)}

    @property
    def feed(self) -> StoreFeed:
        assert self._feed is not None, "start first"
        return self._feed

    async def start(self) -> None:
        self._store = await open_store(self.url)
        self._feed = StoreFeed(self._store, poll_s=0.05)
        self._feed.start()

    async def stop(self) -> None:
        await super().stop()
        if self._feed is not None:
            await self._feed.stop()
        if self._store is not None:
            await self._store.close()

    async def _append(self, partition: int, values: list[bytes]) -> list[int]:
        assert self._store is not None, "start first"
        sid = self._streams[partition]
        out = []
        for value in values:
            event = Event.create("add", stream_id=sid, data={}, id=value.decode())
            out.append((await self._store.append(sid, [event])).position)
        return out

    def ident(self, delivery: Delivery) -> bytes | None:
        """The stored row is the structured event: its id is the value appended."""
        return structured.from_json(delivery.value or b"").id.encode()

    async def _open(self, partitions: Sequence[int]) -> Member:
        return StoreMember(self, partitions)


def key_for(partition: int) -> str:
    """A stream id of ``partition`` (of ``TOPIC_PARTITIONS``)."""
    return next(
        k
        for k in (f"s{i}" for i in range(1000))
        if partition_for(k.encode(), TOPIC_PARTITIONS) == partition
    )


# sinks ------------------------------------------------------------------------------
class Sent(NamedTuple):
    """One record read back from the sink's topic."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


class SinkHarness(ABC):
    """A transport's confirmed publisher (:class:`~streamapp.engine.interfaces.Sink`) over one topic
    of ``TOPIC_PARTITIONS`` partitions, and a reader of what reached the topic."""

    topic: str

    def message(
        self,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> Outgoing:
        """One message to the topic, as the engine hands it to ``publish_many``."""
        return Outgoing(self.topic, value, key=key, headers=headers, partition=partition)

    @property
    @abstractmethod
    def sink(self) -> Any:
        """The transport's publisher, started."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def read(self) -> list[Sent]:
        """Every record of the topic, partition by partition, in order."""


class KafkaSinkHarness(SinkHarness):
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.topic = f"sink-{uuid.uuid4().hex[:10]}"
        self._sink = KafkaSink(bootstrap, timeout_s=10.0)

    @property
    def sink(self) -> Any:
        return self._sink

    async def start(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(self.topic, TOPIC_PARTITIONS, 1)])
        finally:
            await admin.close()
        await self._sink.start()

    async def stop(self) -> None:
        await self._sink.stop()

    async def read(self) -> list[Sent]:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(TOPIC_PARTITIONS)]
            got = await read_to_end(consumer, tps)
        finally:
            await consumer.stop()
        return [Sent(r.partition, r.key, r.value, dict(r.headers)) for r in got]


class RabbitSinkHarness(SinkHarness):
    def __init__(self, amqp_url: str) -> None:
        self.amqp_url = amqp_url
        ns = f"sink-{uuid.uuid4().hex[:10]}"
        self.app = App(f"{ns}-app", broker="rabbitmq", amqp_url=amqp_url)
        self.topic = f"{ns}-out"
        source = self.app.topic(f"{ns}-in", partitions=TOPIC_PARTITIONS)
        out = self.app.topic(self.topic, partitions=TOPIC_PARTITIONS)

        @self.app.agent(source, sinks=[out])
        async def probe(event: Any, *, send: Any) -> None:  # the app's topology: the topic
            pass

        self._sink: RabbitSink | None = None

    @property
    def sink(self) -> Any:
        assert self._sink is not None, "start first"
        return self._sink

    async def start(self) -> None:
        settings = self.app.settings()
        await create_topology(self.app, settings)
        self._sink = RabbitSink(settings, {self.topic: TOPIC_PARTITIONS})
        await self._sink.start()

    async def stop(self) -> None:
        if self._sink is not None:
            await self._sink.stop()

    async def read(self) -> list[Sent]:
        out: list[Sent] = []
        connection = await aio_pika.connect(self.amqp_url)
        try:  # read without acking: closing the channel puts them back
            channel = await connection.channel()
            for p in range(TOPIC_PARTITIONS):
                queue = await channel.declare_queue(queue_name(self.topic, p), passive=True)
                while (message := await queue.get(no_ack=False, fail=False)) is not None:
                    key, value, headers = from_message(
                        message.body, message.headers, message.content_type
                    )
                    out.append(Sent(p, key, value, dict(headers)))
        finally:
            await connection.close()
        return out


class MemorySinkHarness(SinkHarness):
    """The memory broker as the sink of derived events (``publish_many``) and parks."""

    def __init__(self) -> None:
        self.topic = "out"
        self.app = App("sink-memory")
        source = self.app.topic("in", partitions=TOPIC_PARTITIONS)
        out = self.app.topic(self.topic, partitions=TOPIC_PARTITIONS)

        @self.app.agent(source, sinks=[out])
        async def probe(event: Any, *, send: Any) -> None:
            pass

        self.broker = MemoryBroker(self.app)

    @property
    def sink(self) -> Any:
        return self.broker

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def read(self) -> list[Sent]:
        return [
            Sent(r.partition, r.key, r.value, dict(r.headers))
            for r in self.broker.records(self.topic)
        ]
