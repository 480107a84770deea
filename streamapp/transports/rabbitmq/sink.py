"""RabbitMQ sink: confirmed, mandatory, persistent publishes, routed by partition.

A message for topic ``T`` goes to exchange ``T`` with routing key = the partition of its
key (:func:`~streamapp.topics.partition_for` over ``T``'s partition count, by
``T``'s partitioner), so it lands in queue ``T.{p}`` (see
:mod:`streamapp.transports.rabbitmq.topology`). The channel has publisher confirms and
``on_return_raises`` (an unroutable message is an error, not a silent success,
PITFALLS.md), every attempt has its own ``message_id``, and every publish has a deadline
(robust publishes otherwise wait for a reconnection forever).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aio_pika.exceptions import DeliveryError
from aio_pika.exceptions import PublishError as Returned
from aiormq.exceptions import ChannelNotFoundEntity

from ...engine.interfaces import SinkMetrics
from ...engine.metrics import NO_SINK_METRICS
from ...errors import PublishError
from ...records import Message, Receipt, refuse_headers
from ...settings.settings import Settings
from ...topics import Partitioner, TopicSpec, partition_for
from .connection import connect
from .wire import to_properties


class RabbitSink:
    """Publishes to the app's exchanges; a publish returns once the broker confirmed it.
    ``metrics`` counts the messages not confirmed, per exchange and outcome (returned,
    nacked, timed_out, failed)."""

    def __init__(
        self,
        settings: Settings,
        partitions: Mapping[str, int],
        *,
        timeout_s: float | None = None,
        metrics: SinkMetrics = NO_SINK_METRICS,
        topics: Mapping[str, TopicSpec] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.partitions = dict(partitions)
        """Partition count of each topic this sink may publish to."""
        self.partitioners = {name: spec.partitioner for name, spec in (topics or {}).items()}
        """How a message without a partition is placed, per declared topic (``topics``:
        the app's, ``app.topic(..., partitioner=...)``); murmur2 for the others."""
        self.timeout_s = settings.publish_timeout_s if timeout_s is None else timeout_s
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None

    async def start(self) -> None:
        self._connection = await connect(self.settings, "RabbitMQ sink")
        await self._open_channel()

    async def _open_channel(self) -> None:
        assert self._connection is not None
        self._channel = await self._connection.channel(
            publisher_confirms=True, on_return_raises=True
        )

    async def _ready(self) -> None:
        """A fresh channel when the broker closed ours (e.g. a publish to a missing
        exchange closes it with 404; a lost connection is the robust client's business)."""
        channel, connection = self._channel, self._connection
        closed = channel is not None and channel.is_closed
        if closed and connection is not None and not connection.is_closed:
            await self._open_channel()

    async def stop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            await connection.close()

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> None:
        """Publish and wait for the broker's confirm. PublishError when the message is
        returned (no queue bound), nacked, or not confirmed within ``timeout_s``;
        ReservedNameError for a chain or ``streamapp-`` header (:mod:`streamapp.records`)."""
        refuse_headers(headers, f"publish to exchange {topic!r}")
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._ready()
                await self._send(topic, value, key, headers, partition)
        except PublishError:
            raise
        except Exception as exc:
            self.metrics.publish_failed("rabbitmq", topic, _outcome(exc))
            raise self._error(topic, self._route(topic, key, partition), exc) from exc

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        """Publish every message (all in flight on one channel, in order), then wait for
        all confirms. The batch fails when no confirm comes for ``timeout_s`` (a stall,
        however long the batch) or a message is returned or nacked: PublishError, and
        some may have been written (publish the batch again; duplicates possible)."""
        try:
            await asyncio.wait_for(self._ready(), self.timeout_s)
        except Exception as exc:
            for m in messages:
                self.metrics.publish_failed("rabbitmq", m.topic, _outcome(exc))
            raise PublishError(f"no RabbitMQ channel to publish on: {exc!r}") from exc
        bound = self.timeout_s * (1 + len(messages) // 1000)  # each one's, from now
        sends = [
            asyncio.ensure_future(
                self._send(m.topic, m.value, m.key, m.headers, m.partition, bound)
            )
            for m in messages
        ]
        progress = asyncio.Event()
        left = len(sends)
        failed: list[asyncio.Future[int]] = []

        def confirmed(send: asyncio.Future[int]) -> None:
            nonlocal left
            left -= 1
            if send.cancelled() or send.exception() is not None:
                failed.append(send)
            progress.set()

        for send in sends:
            send.add_done_callback(confirmed)
        try:
            while left and not failed:
                progress.clear()
                async with asyncio.timeout(self.timeout_s):
                    await progress.wait()
            if failed:
                failed[0].result()  # raises the first failure
        except BaseException as exc:
            unconfirmed = left  # before the cancels below count themselves done
            if isinstance(exc, TimeoutError):  # the sends still waiting: no confirm came
                for m, send in zip(messages, sends, strict=True):
                    if not send.done():
                        self.metrics.publish_failed("rabbitmq", m.topic, "timed_out")
            for send in sends:
                send.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            if isinstance(exc, PublishError | asyncio.CancelledError):
                raise
            raise PublishError(
                f"batch of {len(messages)} messages: {unconfirmed} not confirmed, none for "
                f"{self.timeout_s:g}s (setting publish_timeout_s): {exc!r}"
            ) from exc
        return [Receipt(m.topic, s.result()) for m, s in zip(messages, sends, strict=True)]

    async def _send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        partition: int | None,
        timeout_s: float | None = None,
    ) -> int:
        routing = self._route(topic, key, partition)
        try:
            if self._channel is None:
                raise PublishError(
                    f"publish to exchange {topic!r}: the RabbitMQ sink is not started"
                )
            channel = cast(aiormq.Channel, await self._channel.get_underlay_channel())
            # The client channel itself, with wait=False: aio-pika's publish holds the
            # channel's lock until the frame is written, one message per write, which
            # serialises a pipelined batch. The confirm is still awaited.
            await channel.basic_publish(
                value or b"",
                exchange=topic,
                routing_key=str(routing),
                properties=to_properties(key, headers),
                mandatory=True,
                timeout=timeout_s or self.timeout_s,
                wait=False,
            )
        except asyncio.CancelledError:
            raise
        except PublishError:
            self.metrics.publish_failed("rabbitmq", topic, "failed")
            raise
        except Exception as exc:
            self.metrics.publish_failed("rabbitmq", topic, _outcome(exc))
            raise self._error(topic, routing, exc) from exc
        return routing

    def _route(self, topic: str, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            return partition
        n = self.partitions.get(topic)
        if n is None:
            raise PublishError(
                f"exchange {topic!r}: the sink does not know its partition count (not a "
                "topic of this app); declare it in the app"
            )
        by = self.partitioners.get(topic, Partitioner.MURMUR2)
        return 0 if key is None else partition_for(key, n, by)

    def _error(self, topic: str, routing: int, exc: BaseException) -> PublishError:

        where = f"exchange {topic!r} routing key {str(routing)!r}"
        if isinstance(exc, Returned):
            why = (
                "returned unroutable: no queue is bound for this routing key; create the "
                "topology with `STREAMAPP_BROKER=rabbitmq streamapp topics create`"
            )
        elif isinstance(exc, DeliveryError):
            why = "nacked by the broker"
        elif isinstance(exc, ChannelNotFoundEntity):
            why = "the exchange does not exist; create it with `streamapp topics create`"
        elif isinstance(exc, TimeoutError):
            why = f"not confirmed within {self.timeout_s:g}s (setting publish_timeout_s)"
        else:
            why = f"failed: {exc!r}"
        return PublishError(f"publish to {where} {why}; the outcome is unknown, publish again")


def _outcome(exc: BaseException) -> str:
    """The metrics' outcome of a publish error (``PUBLISH_OUTCOMES``, engine/metrics)."""
    if isinstance(exc, Returned):
        return "returned"
    if isinstance(exc, DeliveryError):
        return "nacked"
    if isinstance(exc, TimeoutError):
        return "timed_out"
    return "failed"
