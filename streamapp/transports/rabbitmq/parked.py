"""A parking or dead-letter topic's queues read back for ``streamapp parked replay`` and
``dlq replay`` (:mod:`streamapp.failures.republish`).

A topic is an exchange and partition queues ``T.0``, ``T.1``, ... (as many as exist:
parking and dead-letter topics may have any count). Queues have no offsets, so
``--from`` and ``--until`` are refused. A run counts each queue's messages when it
starts and takes at most that many from it (``basic.get``, nothing else consumes these
queues), so records parked while it runs wait for the next run; each message is acked
once its copy is confirmed at the origin, so it leaves the queue and is sent once per
run, and a next run sends only what was parked since. One not confirmed, and every
message taken after it, go back to their queue (unacked when the channel closes). A
crash between a confirm and its ack leaves the message in the queue: the next run sends
it again (at least once across runs). A dry run takes the messages and puts them all
back (flagged redelivered, in their order).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity

from ...errors import ReplayError, SourceError
from ...failures.republish import Held, Offsets
from ...settings.settings import Settings
from .connection import connect, safe_url
from .topology import queue_name
from .wire import from_message


class RabbitHeldReader:
    """One parking or dead-letter topic's queues, each read once up to its size at the
    run's start (:class:`~streamapp.failures.republish.HeldReader`)."""

    def __init__(self, settings: Settings, topic: str, start: Offsets, until: Offsets) -> None:
        for option in (start, until):
            if option.given:
                raise ReplayError(
                    f"{option.option}: RabbitMQ queues have no offsets, so {option.option} "
                    "does not apply; leave it out: a run sends every message the topic's "
                    f"queues ({queue_name(topic, 0)}, ...) hold when it starts, and acks each "
                    "one sent, so the next run sends only what was parked since"
                )
        self.settings, self.topic = settings, topic
        self.sizes: dict[str, int] = {}
        """Per queue, the messages it held at the run's start (what the run takes)."""
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None

    async def start(self) -> None:
        self._connection = connection = await connect(
            self.settings, "RabbitMQ replay reader", robust=False
        )
        p = 0
        while True:
            name = queue_name(self.topic, p)
            channel = await connection.channel()  # a 404 closes its channel
            try:
                queue = await channel.declare_queue(name, passive=True)
            except ChannelNotFoundEntity:
                break
            finally:
                if not channel.is_closed:
                    await channel.close()
            self.sizes[name] = queue.declaration_result.message_count or 0
            p += 1
        if not self.sizes:
            raise ReplayError(
                f"--topic {self.topic!r}: RabbitMQ at {safe_url(self.settings.amqp_url)} has "
                f"no queue {queue_name(self.topic, 0)!r}; make the app's topology with "
                "`STREAMAPP_BROKER=rabbitmq streamapp topics create`"
            )
        self._channel = await connection.channel()

    async def read(self) -> AsyncIterator[Held]:
        channel = self._channel
        assert channel is not None
        for name, size in self.sizes.items():
            try:
                queue = await channel.get_queue(name, ensure=False)
            except AMQPError as exc:
                raise SourceError(f"reading queue {name!r} failed: {exc!r}") from exc
            for n in range(1, size + 1):
                try:
                    message = await queue.get(no_ack=False, fail=False, timeout=10)
                except AMQPError as exc:
                    raise SourceError(f"reading queue {name!r} failed: {exc!r}") from exc
                if message is None:
                    break  # fewer than at the start: someone else took them
                key, value, headers = from_message(
                    message.body, message.headers, message.content_type
                )
                yield Held(f"queue {name} message {n}", key, value, headers, _acker(message))

    async def stop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            await connection.close()  # what was taken and not acked goes back


def _acker(message: AbstractIncomingMessage) -> Callable[[], Awaitable[None]]:
    async def ack() -> None:
        await message.ack()

    return ack
