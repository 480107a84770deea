"""The relay on RabbitMQ: republishes due retry and delay copies to their origin topics.

One per worker, when the app has retry topics (agents with ``Retry``) or delay topics
(setting ``delayed_policy=relay``). It consumes every partition queue of those topics
(``{topic}-retry.{p}``, ``{topic}-delay.{p}``), each on a channel of its own, over a
connection of its own. The queues have single active consumer: whatever the group's
membership says, one relay at a time receives from a queue, and another takes over
when it leaves (the copies it held go back to the queue first).

A received copy is held, unacked, until its ``x-deliver-at`` (a wait on the relay's
stop event, never a blocking sleep), then republished to its ``x-origin-topic``
(:func:`streamapp.failures.retry_chain.republished`: ``x-deliver-at`` and ``x-origin-topic``
dropped, every other header kept) with routing key = the queue's partition, through the
worker's confirmed sink, and acked only once the broker confirmed it. A crash between
the confirm and the ack republishes it again: at least once (the per-stream version
guard skips what an agent applied). A failed republish is tried again, with back-off,
while the copy stays unacked. Up to ``amqp_prefetch`` copies per queue are held at once,
each going out when due, so a long back-off does not hold shorter ones behind it within
that window (per-message TTL would: RabbitMQ expires messages at the queue's head only).

On stop the waits end at once and the channels close: every copy not yet republished
goes back to its queue. A queue deleted under the relay (``basic.cancel``) stops the
worker with an error naming it and the command that makes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from ...engine.backoff import Pace, pause
from ...errors import SourceError
from ...failures import retry_chain as chain
from ...settings.settings import Settings
from ...topics import TopicPlan
from .connection import connect
from .sink import RabbitSink
from .topology import queue_name
from .wire import from_message

log = logging.getLogger("streamapp.relay")


class RabbitRelay:
    """Republishes due copies of ``topics`` (retry and delay topics) through ``sink``."""

    def __init__(
        self, settings: Settings, sink: RabbitSink, topics: Sequence[TopicPlan], app_ref: str
    ) -> None:
        self.settings, self.sink, self.app_ref = settings, sink, app_ref
        self.queues = [(queue_name(t.name, p), p) for t in topics for p in range(t.partitions)]
        self.held = 0
        """Copies received and not yet republished (waiting for their due time)."""
        self.relayed = 0
        self.held_per_queue: dict[str, int] = {}
        """Copies held per partition queue (``/status``, ``/metrics``)."""
        self.ready: dict[str, int] = {}
        """Ready (not yet received) copies per partition queue, as last probed."""
        self._connection: AbstractRobustConnection | None = None
        self._channels: list[AbstractChannel] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._failed: asyncio.Future[None] | None = None

    @property
    def held_copies(self) -> int:
        """Copies received and waiting for their due time (metrics)."""
        return self.held

    def lag(self) -> dict[tuple[str, int], int]:
        """Copies not republished yet per retry or delay topic partition: those held
        (unacked) plus the queue's ready ones (as of the last probe, once a second)."""
        return {
            (name.rsplit(".", 1)[0], p): self.held_per_queue.get(name, 0) + self.ready.get(name, 0)
            for name, p in self.queues
        }

    async def _probe(self) -> None:
        """Every second, each relayed queue's ready messages (a passive declare on a
        channel of its own: a failed probe never closes a consuming channel)."""
        assert self._connection is not None
        channel = await self._connection.channel()
        while not self._stop.is_set():
            for name, _ in self.queues:
                try:
                    underlay = await channel.get_underlay_channel()  # aio-pika caches a
                    declared = await underlay.queue_declare(name, passive=True)  # passive one
                    self.ready[name] = declared.message_count or 0
                except Exception as exc:  # gone, or the connection is down: next time
                    log.debug("relay: depth of %s: %r", name, exc)
                    if channel.is_closed:
                        channel = await self._connection.channel()
            await pause(self._stop, 1.0)

    async def start(self) -> None:
        """Connect and consume every retry and delay partition queue."""
        self._failed = asyncio.get_running_loop().create_future()
        self._connection = await connect(self.settings, "RabbitMQ relay")
        for name, p in self.queues:
            channel = await self._connection.channel()
            self._channels.append(channel)
            await channel.set_qos(prefetch_count=self.settings.amqp_prefetch)
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(self._on_cancel(name))
            queue = await channel.declare_queue(name, passive=True)
            await queue.consume(self._on_message(name, p), no_ack=False)
        probe = asyncio.create_task(self._probe(), name="relay queue depths")
        self._tasks.add(probe)
        probe.add_done_callback(self._tasks.discard)
        log.info("relay started on %d queues", len(self.queues))

    async def stop(self) -> None:
        """End the waits, let republishes in flight finish, close: the copies not
        republished go back to their queues (unacked)."""
        self._stop.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(None)

    async def wait(self) -> None:
        """Until stopped; raises when a relayed queue can no longer be consumed."""
        if self._failed is not None:
            await self._failed

    def _on_cancel(self, queue: str) -> Callable[[Any], None]:
        def cancelled(_: Any) -> None:
            self._gone(queue)

        return cancelled

    def _on_message(
        self, queue: str, p: int
    ) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def received(message: AbstractIncomingMessage) -> None:
            """Called per delivery, in order: the copy waits in a task of its own."""
            task = asyncio.create_task(self._relay(message, queue, p), name=f"relay {queue}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return received

    def _gone(self, queue: str) -> None:
        if self._stop.is_set() or self._failed is None or self._failed.done():
            return
        self._failed.set_exception(
            SourceError(
                f"relay: queue {queue!r} had its consumer cancelled by RabbitMQ (deleted?), "
                "so its retry or delayed copies would never be republished; the worker "
                f"stops. Re-create it with `STREAMAPP_BROKER=rabbitmq streamapp topics "
                f"create -A {self.app_ref}`.",
                retriable=False,
            )
        )

    async def _relay(self, message: AbstractIncomingMessage, queue: str, p: int) -> None:
        key, value, headers = from_message(message.body, message.headers, message.content_type)
        origin = chain.header(headers, chain.ORIGIN_TOPIC)
        if origin is None:
            log.error(
                "relay: a copy in %s has no %s header: left in the queue (move it by hand)",
                queue,
                chain.ORIGIN_TOPIC,
            )
            return
        self.held += 1
        self.held_per_queue[queue] = self.held_per_queue.get(queue, 0) + 1
        try:
            due_s = (chain.due_ms(headers) or 0) / 1000
            await pause(self._stop, due_s - time.time())
            republished = chain.republished(origin.decode(), value, key, headers)
            pace = Pace(self._stop, 0.5, 10.0)
            while not self._stop.is_set() and _alive(message):
                try:
                    await self.sink.publish(
                        republished.topic,
                        republished.value,
                        key=republished.key,
                        headers=republished.headers,
                        partition=p,
                    )
                except Exception as exc:
                    log.error("relay: republishing from %s failed (%s); again", queue, exc)
                    await pace.wait()
                    continue
                await _ack(message, queue)
                self.relayed += 1
                return
        finally:
            self.held -= 1
            self.held_per_queue[queue] -= 1


def _alive(message: AbstractIncomingMessage) -> bool:
    """The channel ``message`` came on is open (after a reconnect its tag means nothing:
    the broker redelivers it on the new channel)."""
    try:
        channel: Any = message.channel
        return not channel.is_closed
    except Exception:  # aio-pika raises once the channel is closed
        return False


async def _ack(message: AbstractIncomingMessage, queue: str) -> None:
    try:
        await message.ack()
    except Exception as exc:  # the channel died: the broker redelivers it (at least once)
        log.info("relay: ack in %s skipped (%r); it comes again", queue, exc)
