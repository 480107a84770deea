"""RabbitMQ source: consumes the partition queues this worker owns, one task each.

At start it checks the topology (passive declares: a missing exchange or queue is named,
with the command that makes it), then joins the app's group (:mod:`.members`: the
protocol over RabbitMQ, or the partitions pinned by setting ``amqp_partitions``) and
starts a :class:`~streamapp.engine.task.PartitionTask` per partition it takes, over a
:class:`RabbitPartitionPort`. There is no changelog on RabbitMQ: a partition's state is
its local store, brought up to date at every open by the event-store replay from the
checkpoint's store position (the agent's ``history=FromEventStore()``), so a partition
that was applied elsewhere meanwhile is exact before its first live message; a
partition with neither local state nor history is refused, never started empty.

Derived events (``sinks=[...]``) and the retry chain's copies (``{topic}-retry``,
``{topic}-dlq``) are confirmed publishes made before the batch's store write and acks:
at least once (a crash between them publishes them again; a failed publish leaves the
batch unwritten and unacked, so it runs again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import Callable

from aio_pika.abc import AbstractRobustConnection

from ...agents.agent import Agent
from ...app import App
from ...codecs import amqp as codec
from ...engine.assignment import Assignment
from ...engine.factory import TaskFactory
from ...engine.interfaces import TaskMetrics
from ...engine.lease import Lease
from ...engine.metrics import NO_METRICS
from ...engine.parking import parker
from ...engine.served import local_tables
from ...engine.task import PartitionTask
from ...engine.task_config import TaskConfig
from ...engine.task_surface import HistoryFeed
from ...errors import SourceError
from ...events import Event
from ...records import Delivery, DeliveryRecord
from ...settings.settings import Settings
from ...tables.store import Store, rocks_opener
from ...topics import TopicSpec
from .connection import connect, safe_url, with_startup_retry
from .members import RabbitMembership
from .membership import Membership, Partitions
from .pinned import StaticMembership
from .port import RabbitPartitionPort
from .sink import RabbitSink
from .stalled import StalledPartitions
from .topology import chain_queue_counts, check_topology, queue_name

log = logging.getLogger("streamapp.rabbitmq")


def decode(delivery: Delivery) -> Event:
    return codec.decode(delivery.value, delivery.headers)


def decode_bytes(delivery: Delivery) -> Event:
    return codec.decode(delivery.value, delivery.headers, parse_json=False)


class RabbitSource:
    """Feeds the app's agents from their partition queues."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        sink: RabbitSink,
        app_ref: str,
        history: HistoryFeed | None = None,
        *,
        member_id: str = "",
        views_url: Callable[[], str | None] = lambda: None,
        metrics: TaskMetrics = NO_METRICS,
    ) -> None:
        self.app, self.settings, self.sink, self.app_ref = app, settings, sink, app_ref
        self.history, self.metrics = history, metrics
        self.member_id = member_id or f"{socket.gethostname()}:{os.getpid()}"
        self._views_url = views_url
        self.membership: Membership | None = None
        self.assignment = Assignment(app)
        self.ports: dict[tuple[str, int], RabbitPartitionPort] = {}
        self._topics = app.sources
        self._factory = TaskFactory(
            config=dataclasses.replace(TaskConfig.from_settings(settings), replay_on_open=True),
            decode=decode,
            decode_bytes=decode_bytes,
            park=lambda agent, name: parker(self.sink, agent, name),
            history=history,
            metrics=metrics,
            encode=codec.encode,
            publish=self.sink.publish_many,
            locate=self.assignment.read_store,
            on_fatal=self._fail,
        )
        self.stalls = StalledPartitions(lambda: self.ports)
        self.assignment.stall_sources.append(self.stalls.stalled)
        self._connection: AbstractRobustConnection | None = None
        self._failed: asyncio.Future[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        """Connect, check the topology, take the owned partitions."""
        self._failed = asyncio.get_running_loop().create_future()
        robust = self.settings.amqp_reconnect
        self._connection = await connect(self.settings, "RabbitMQ source", robust=robust)
        if not robust:
            self._connection.close_callbacks.add(self._connection_lost)
        connection, policy = self._connection, self.settings.delayed_policy
        await with_startup_retry(  # a topology made meanwhile (topics create) is waited for
            self.settings,
            "RabbitMQ topology check",
            lambda: check_topology(connection, self.app, self.app_ref, policy),
        )
        counts = await chain_queue_counts(connection, self.app, policy)
        self.sink.partitions.update(counts)  # dead letters and parks routed over their queues
        if self.settings.owned_partitions() is not None:
            self.membership = StaticMembership(self.app, self.settings)
        else:
            group = RabbitMembership(
                self._connection,
                self.app,
                self.settings,
                self.member_id,
                self._views_url,
                on_change=self._settled,
                tables=lambda: local_tables(self.assignment, self.member_id),
                lease=Lease(self.settings.owner_lease()),
            )
            self.assignment.lease = group.lease
            self.assignment.directory = group
            self.membership = group
        await self.membership.start(self._acquire, self._release)
        self.stalls.start()
        self._settled()

    def _connection_lost(self, _: object, exc: BaseException | None = None) -> None:
        if self._stopping:
            return
        self._fail(
            SourceError(
                f"the connection to RabbitMQ at {safe_url(self.settings.amqp_url)} was lost "
                f"({exc!r}) and setting amqp_reconnect (STREAMAPP_AMQP_RECONNECT) is off: the "
                "worker stops; unacked deliveries go back to their queues. Restart it, or "
                "turn amqp_reconnect on to resume by itself."
            )
        )

    def _settled(self) -> None:
        membership = self.membership
        self.assignment.rebalancing = membership is None or not membership.settled

    async def stop(self) -> None:
        """Leave the group: batches in hand finish (they commit and ack), then channels
        close; what was not acked goes back to the queues."""
        self.assignment.rebalancing = True
        self._stopping = True
        await self.stalls.stop()
        if self.membership is not None:
            await self.membership.stop()
        await self._release(list(self.assignment.tasks))
        if self._connection is not None:
            await self._connection.close()
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(None)

    async def wait(self) -> None:
        """Until stopped; raises when a partition cannot run: refused (no state to start
        from), or its consumer cancelled by the broker (its queue deleted)."""
        if self._failed is not None:
            await self._failed

    def _fail(self, exc: BaseException) -> None:
        """A partition cannot run here at all: the worker stops with ``exc``."""
        if self._failed is not None and not self._failed.done():
            self._failed.set_exception(exc)

    def _acquire(self, owned: Partitions) -> None:
        for topic, p in owned:
            log.info("owns %s[%d]", topic, p)
            task = self._task(self._topics[topic], p)
            self.assignment.tasks[(topic, p)] = task
            task.start()
        self._settled()

    def _task(self, spec: TopicSpec, p: int) -> PartitionTask:
        settings, topic = self.settings, spec.name
        name = f"{topic}[{p}]"

        def open_store(agent: Agent, spaces: list[str]) -> Store:
            return rocks_opener(settings, self.app.id, agent.name, p)(spaces)

        assert self._connection is not None
        task: PartitionTask

        def feed(deliveries: list[DeliveryRecord]) -> bool:
            """Deliveries received: the task's next batch, or the batch after the one in
            hand (what arrives while a batch runs and commits runs next, in one batch, as
            on Kafka: :mod:`streamapp.engine.ahead`); False: kept by the port for later."""
            if task.accepting:
                task.feed(deliveries, prefetch=True)
                return True
            if task.queueing:
                task.ahead.add(deliveries)
                return True
            return False

        port = RabbitPartitionPort(
            self._connection,
            topic,
            p,
            queue_name(topic, p),
            prefetch=settings.amqp_prefetch,
            requeue_interval_s=settings.poll_timeout_ms / 1000,
            feed=feed,
            fail=self._fail,
            app_ref=self.app_ref,
        )
        self.ports[(topic, p)] = port
        task = self._factory.create(
            self.app.agents_of(topic), p, port, name=name, open_store=open_store
        )
        port.on_renewed = task.recheck
        return task

    async def _release(self, partitions: Partitions) -> None:
        tasks = self.assignment.tasks
        for key in partitions:
            task, port = tasks.pop(key, None), self.ports.pop(key, None)
            try:
                if task is not None:
                    await task.close()
            except Exception as exc:
                log.error("closing %s failed: %r", key, exc)
            finally:
                if port is not None:
                    await port.close()
        self._settled()
