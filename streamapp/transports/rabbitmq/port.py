"""The partition port on RabbitMQ: one partition queue, its channel, its consumer.

RabbitMQ has no offsets, so positions are a per-partition delivery sequence assigned
here, continuing from the task's checkpoint (``begin``). Each partition queue has its own
channel, so a delivery tag, and an ``ack(multiple=True)``, concern that partition alone.
Deliveries are kept in arrival order until settled and handed to the task as they come,
while it is not paused: a busy task queues them as its next batch (:mod:`streamapp.engine.ahead`),
so batches grow with the load; the prefetch bounds how many the broker sends ahead. The
port consumes on the client channel itself (aiormq's ``basic_consume``): no aio-pika
message object and no second task per delivery.

- ``settle(p)``: ack, with ``multiple=True``, up to the last delivery below ``p``.
- ``rewind(p)``: the deliveries at and after ``p`` are held, then requeued (``nack``
  with requeue, never without) when the task resumes, at most once per requeue interval
  (a requeued message comes straight back: PITFALLS.md). Until the first of them comes
  back (matched by ``message_id``), later arrivals are requeued too, so order holds.
- A reconnect (robust connection) gives the channel a new life: deliveries of the old
  one are dropped here, the broker redelivers them (``redelivered=True``) and they get
  new positions; a settle of an old delivery is skipped (its tag died with the channel),
  and the stream-version guard applies each event once.
- The port consumes again itself after a reconnect (the queue is not left to the robust
  client, whose recovery would fail the whole connection over one missing queue).
- A partition whose queue has messages ready while the port holds none and heard
  nothing for a while is *stalled* (:mod:`.stalled`): the broker gives the queue's single
  active consumer to another connection. The port tells how long it has been idle and
  consumes anew when asked.
- A consumer the broker cancels (``basic.cancel``: the queue was deleted, or it moved)
  is gone for good, and so is a queue missing after a reconnect. The port closes its
  channel (what it held goes back to the queue, if the queue still exists) and fails
  the source with an error naming the queue and the command that re-creates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple

from aio_pika.abc import AbstractChannel, AbstractRobustChannel, AbstractRobustConnection
from aiormq.abc import AbstractChannel as ClientChannel
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import ChannelNotFoundEntity

from ...engine.interfaces import NO_LANES, Committed
from ...errors import ConfigError, SourceError
from ...records import DeliveryRecord
from .connection import close_channel
from .wire import from_message

log = logging.getLogger("streamapp.partition")

CLOSE_TIMEOUT_S = 5.0
"""How long closing a partition's channel may take before the port goes on."""

AWAIT_LIMIT_S = 30.0
"""After a requeue, how long later arrivals wait for the first requeued message."""


class _Entry(NamedTuple):
    delivery: DeliveryRecord
    message: DeliveredMessage
    life: ClientChannel
    """The client channel it came on (its tag means nothing on another)."""


class RabbitPartitionPort:
    """One owned partition queue, as the partition task drives it."""

    absolute = False

    def __init__(
        self,
        connection: AbstractRobustConnection,
        topic: str,
        partition: int,
        queue: str,
        *,
        prefetch: int,
        requeue_interval_s: float,
        feed: Callable[[list[DeliveryRecord]], bool],
        fail: Callable[[BaseException], None],
        app_ref: str = "MODULE:app",
    ) -> None:
        self.topic, self.partition, self.queue = topic, partition, queue
        self.name = f"{topic}[{partition}]"
        self.prefetch, self.requeue_interval_s = prefetch, requeue_interval_s
        self._connection = connection
        self._feed = feed
        """Hands deliveries to the task; False when it does not accept them now."""
        self._fail = fail
        """Fails the source: this partition cannot run here (the worker stops)."""
        self.app_ref = app_ref
        self.on_renewed: Callable[[], None] | None = None
        """Called when a re-opened channel consumes again (another consumer may have
        been active on the queue meanwhile)."""
        self._channel: AbstractChannel | None = None
        self._consumer_tag: str | None = None
        self._entries: deque[_Entry] = deque()
        """Received, not settled, in position order."""
        self._unhanded: list[DeliveryRecord] = []
        """Received, not handed to the task yet (the tail of ``_entries``), in order."""
        self._next = 0
        """The position of the next delivery accepted."""
        self._handed = 0
        """Deliveries below this position were handed to the task."""
        self._paused = True
        self._held: list[tuple[DeliveredMessage, ClientChannel]] = []
        """Rewound deliveries waiting for their requeue."""
        self._awaiting: bytes | None = None
        self._awaiting_since = 0.0
        self._last_requeue = 0.0
        self._life: ClientChannel | None = None
        """The channel (client side) the current deliveries came on."""
        self._requeue_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.redelivered = 0
        """Deliveries that came with the broker's redelivered flag."""
        self.acked = 0
        """Deliveries acked (the ack frame written on a live channel)."""
        self.cancelled: SourceError | None = None
        """Set when the broker cancelled the consumer (the partition stopped)."""
        self._closed = False
        """Closed by its task: a re-opened channel does not consume again."""
        self._silent = False
        """Set, synchronously, before its channel's ``Channel.Close`` is written: no ack
        or nack may follow that frame (the broker frees the channel at the close, and a
        frame on a freed channel is a connection error, ``CHANNEL_ERROR - expected
        'channel.open'``, that drops every channel of the connection)."""
        self._heard = time.monotonic()
        """When the last delivery came (or the port began consuming, or again)."""
        self._consuming = asyncio.Lock()
        """Held while the consumer is (re-)registered: one ``basic.consume`` at a time."""

    # PartitionPort -----------------------------------------------------------------
    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        if self.cancelled is not None:
            return  # stopped for good: nothing more is handed
        self._paused = False
        if self._held:
            wait = self._last_requeue + self.requeue_interval_s - time.monotonic()
            if wait > 0:
                if self._requeue_timer is None:
                    self._requeue_timer = asyncio.get_running_loop().call_later(wait, self._requeue)
            else:
                self._requeue()
        self._hand()

    def rewind(self, position: int) -> None:
        """Hold the deliveries at and after ``position``; they are requeued on resume."""
        kept = [e for e in self._entries if e.delivery.position < position]
        rewound = [(e.message, e.life) for e in self._entries if e.delivery.position >= position]
        self._entries = deque(kept)
        self._unhanded = []
        if rewound and self._awaiting is None:
            self._awaiting = _fingerprint(rewound[0][0])
        self._held += rewound
        self._next = self._handed = position

    async def settle(self, position: int, ahead: Mapping[str, int] = NO_LANES) -> None:
        """Ack every delivery below ``position`` (one ack, ``multiple=True``). Agents
        ahead are not kept: AMQP has no offsets (a restart runs those deliveries through
        them again; agents with tables skip them by stream version)."""
        last: DeliveredMessage | None = None
        entries, life = self._entries, self._life
        count = 0
        while entries and entries[0].delivery.position < position:
            entry = entries.popleft()
            if entry.life is life:
                last = entry.message
                count += 1
        if last is None or life is None or self._silent:
            return  # closing: the broker requeues them and the version guard skips them
        try:
            await life.basic_ack(_tag(last), multiple=True)
            self.acked += count
        except Exception as exc:  # the channel died meanwhile: the broker redelivers
            log.info("%s: ack below position %d skipped (%r)", self.name, position, exc)

    async def committed(self) -> Committed | None:
        return None  # no offsets: positions continue from the tables' checkpoints

    def end(self) -> int | None:
        return None  # AMQP tells no queue end without a request: lag unknown here

    async def through(self, position: int) -> int:
        return position

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        if stateful and position is None and not earliest:
            error = ConfigError(
                f"partition queue {self.queue!r}: this worker has no table state for "
                f"{self.name} and its agent declares no history. RabbitMQ keeps no "
                "changelog, so the partition would start empty: declare "
                "history=FromEventStore() on the agent (the partition is then rebuilt by "
                "replaying the event store), or bring its data directory back."
            )
            self._fail(error)  # loud: the worker stops
            raise error
        start = self._next = self._handed = position or 0
        try:
            channel = await self._connection.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            await self._watch(channel)
            if isinstance(channel, AbstractRobustChannel):  # a reconnect: a new client channel
                channel.reopen_callbacks.add(self._reopened)
            await self._consume(channel)
        except Exception as exc:
            raise SourceError(f"{self.name}: cannot consume queue {self.queue!r}: {exc!r}") from exc
        self._channel = channel
        self._heard = time.monotonic()
        log.info("%s: consuming queue %s (prefetch %d)", self.name, self.queue, self.prefetch)
        return start  # deliveries may have come while the consumer registered: from here

    # stalled (:mod:`.stalled`) ----------------------------------------------------------
    def idle_s(self) -> float | None:
        """Seconds since the last delivery while the port consumes and holds none (None:
        not consuming, closed, stopped, or deliveries in hand: its task is busy)."""
        if self._channel is None or self._closed or self.cancelled is not None:
            return None
        if self._entries or self._held:
            return None
        return time.monotonic() - self._heard

    @property
    def channel(self) -> AbstractChannel | None:
        """The channel it consumes on (None before ``begin`` and after ``close``)."""
        return self._channel

    async def consume_anew(self) -> bool:
        """Cancel its consumer and consume the queue again (to the back of its
        consumers); False when that failed (the caller tries again later)."""
        channel = self._channel
        if channel is None or self.closed():
            return False
        async with self._consuming:  # never beside a re-consume after a reconnect
            if self._silent:  # the channel closes: nothing more on it
                return False
            try:
                if self._consumer_tag is not None:
                    underlay = await channel.get_underlay_channel()
                    await underlay.basic_cancel(self._consumer_tag)
                if not self._silent:
                    await self._consume(channel)
            except Exception as exc:
                log.warning("%s: consuming %s anew failed: %r", self.name, self.queue, exc)
                return False
        return True

    # the consumer --------------------------------------------------------------------
    async def _consume(self, channel: AbstractChannel) -> None:
        """Consume the partition queue on ``channel``. On a robust channel, not robustly
        (the client would re-declare the queue on a reconnect, and one missing queue would
        fail the whole connection's recovery): :meth:`_reopened` consumes again itself."""
        if isinstance(channel, AbstractRobustChannel):
            await channel.declare_queue(self.queue, passive=True, robust=False)
        else:
            await channel.declare_queue(self.queue, passive=True)
        # On the client channel itself: aio-pika's consumer would wrap each delivery in
        # an IncomingMessage and a task of its own, beside the client's task per delivery.
        underlay = await channel.get_underlay_channel()
        consumed = await underlay.basic_consume(
            self.queue, self._on_message, no_ack=False, consumer_tag=self._consumer_tag
        )
        self._consumer_tag = consumed.consumer_tag

    async def _watch(self, channel: AbstractChannel | None) -> None:
        """Hear the broker's ``basic.cancel`` on the client channel under ``channel``."""
        if channel is None:
            return
        underlay = await channel.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(self._on_cancel)

    async def _reopened(self, channel: AbstractRobustChannel | None) -> None:
        """The robust connection re-opened ``channel`` after a loss: consume again once
        the channel is restored (this callback runs inside the restore)."""
        if channel is None or self.cancelled is not None or self._closed:
            return
        await self._watch(channel)
        self._spawn(self._consume_again(channel))

    async def _consume_again(self, channel: AbstractRobustChannel) -> None:
        try:
            await channel.ready()
            underlay = await channel.get_underlay_channel()
            probe = await underlay.connection.channel(publisher_confirms=False)
            try:  # on a channel of its own: a 404 closes the channel it is asked on
                await probe.queue_declare(self.queue, passive=True)
            finally:
                await close_channel(probe, CLOSE_TIMEOUT_S)
        except ChannelNotFoundEntity:
            self._gone("no longer exists after a reconnect (deleted while the connection was down)")
            return
        except Exception as exc:  # lost again: the next re-open tries again
            log.warning("%s: consuming %s again failed: %r", self.name, self.queue, exc)
            return
        if self.closed():  # closed meanwhile: no consumer for a port nobody reads
            return
        try:
            async with self._consuming:
                if self._silent:
                    return
                await self._consume(channel)
        except Exception as exc:
            log.warning("%s: consuming %s again failed: %r", self.name, self.queue, exc)
            return
        self._heard = time.monotonic()  # the time without a connection is no stall
        if self.closed():
            with contextlib.suppress(Exception):
                await close_channel(channel, CLOSE_TIMEOUT_S)
            return
        log.info("%s: consuming queue %s again after a reconnect", self.name, self.queue)

    def _on_cancel(self, frame: Any) -> None:
        """The broker cancelled a consumer of this channel (it never comes back)."""
        tag = getattr(frame, "consumer_tag", None)
        ours = self._consumer_tag
        if ours is not None and tag != ours:
            return
        self._gone(
            "had its consumer cancelled by RabbitMQ (basic.cancel: the queue was deleted, "
            "or it moved to another node)"
        )

    def _gone(self, why: str) -> None:
        """The partition queue cannot be consumed any more: stop here, fail the source."""
        if self.cancelled is not None:
            return
        self.cancelled = SourceError(
            f"{self.name}: queue {self.queue!r} {why}, so this partition would sit idle; "
            "the worker stops. Messages of a deleted queue are gone with it: re-create the "
            f"topology with `STREAMAPP_BROKER=rabbitmq streamapp topics create -A "
            f"{self.app_ref}`, republish what is missing (e.g. `streamapp forward` from "
            "the event store), then start the worker again.",
            retriable=False,
        )
        log.error("%s", self.cancelled)
        self._paused = True
        self._spawn(self._close_channel())  # not inline: we may run in its reader task
        self._fail(self.cancelled)

    async def _on_message(self, message: DeliveredMessage) -> None:
        """Called in delivery order (one task each, started in order): no await here."""
        life = message.channel
        if life.is_closed:  # its channel closed already: the broker redelivers it
            return
        if life is not self._life:
            self._new_life(life)
        self._heard = time.monotonic()
        if message.delivery.redelivered:  # type: ignore[union-attr]  # a Basic.Deliver
            self.redelivered += 1
        if self._awaiting is not None:
            if self._held or _fingerprint(message) != self._awaiting:
                if time.monotonic() - self._awaiting_since < AWAIT_LIMIT_S or self._held:
                    self._requeue_soon(message, life)
                    return
                log.warning(
                    "%s: a requeued delivery did not come back within %.0fs; going on",
                    self.name,
                    AWAIT_LIMIT_S,
                )
            self._awaiting = None
        props = message.header.properties
        key, value, headers = from_message(message.body, props.headers, props.content_type)
        position = self._next
        self._next += 1
        delivery = DeliveryRecord(self.topic, self.partition, position, key, value, headers)
        self._entries.append(_Entry(delivery, message, life))
        self._unhanded.append(delivery)
        if not self._paused:
            self._hand()

    def _new_life(self, channel: ClientChannel) -> None:
        if self._life is not None:
            log.warning(
                "%s: the channel was re-opened; %d unsettled deliveries come again",
                self.name,
                len(self._entries) + len(self._held),
            )
        self._life = channel
        self._heard = time.monotonic()
        if self.on_renewed is not None:
            self.on_renewed()
        self._entries.clear()  # their tags died with the old channel
        self._unhanded = []
        self._held.clear()
        self._awaiting = None
        self._handed = self._next

    def _hand(self) -> None:
        """Hand what the task has not had yet to it, in one list (the task takes it as
        its next batch, or as the batch after the one in hand)."""
        pending = self._unhanded
        if self._paused or not pending:
            return
        if self._life is not None and self._life.is_closed:  # they come again, on the new one
            self._entries = deque(e for e in self._entries if e.delivery.position < self._handed)
            self._unhanded = []
            return
        if self._feed(pending):
            self._unhanded = []
            self._handed = pending[-1].position + 1

    def _requeue_soon(self, message: DeliveredMessage, life: ClientChannel) -> None:
        if self._held:  # still holding: requeued together, in order
            self._held.append((message, life))
        else:
            self._spawn(self._nack(message, multiple=False))

    def _requeue(self) -> None:
        self._requeue_timer = None
        live = [m for m, life in self._held if life is self._life]
        self._held = []
        if not live:
            self._awaiting = None
            return
        self._last_requeue = self._awaiting_since = time.monotonic()
        # One frame for all: nacks one by one would race the ack (multiple=True) of
        # the first one, which comes back at once (an unknown tag closes the channel).
        # Below the last held tag nothing else is unacked: the task settled up to the
        # rewind position before rewinding.
        last = max(live, key=_tag)
        self._spawn(self._nack(last, multiple=True))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def closed(self) -> bool:
        """True once its task closed it."""
        return self._closed

    async def close(self) -> None:
        """Stop consuming; the broker requeues what was not acked."""
        self._closed = True
        self._paused = True
        if self._requeue_timer is not None:
            self._requeue_timer.cancel()
        await self._close_channel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _nack(self, message: DeliveredMessage, *, multiple: bool) -> None:
        """Requeue ``message`` (and, ``multiple``, every unsettled one before it), unless
        the channel is closing: its close requeues them anyway."""
        if self._silent:
            return
        try:  # the check and the frame's write happen without a suspension in between
            await message.channel.basic_nack(_tag(message), multiple=multiple, requeue=True)
        except Exception as exc:  # the channel died: the broker requeues it anyway
            log.info("%s: requeue skipped (%r)", self.name, exc)

    async def _close_channel(self) -> None:
        self._silent = True
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            # A consumer being registered ends first (never cancelled: aiormq answers a
            # cancelled call with a Channel.Close of its own), bounded like the close.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S), self._consuming:
                    pass
            try:  # bounded: a robust channel closed while it reopens can wait forever
                closed = await close_channel(channel, CLOSE_TIMEOUT_S)
            except Exception as exc:
                log.debug("%s: closing the channel: %r", self.name, exc)
                return
            if not closed:
                log.warning(
                    "%s: the channel did not close within %.0fs; going on (the broker "
                    "requeues its unacked deliveries when the connection goes)",
                    self.name,
                    CLOSE_TIMEOUT_S,
                )


def _tag(message: DeliveredMessage) -> int:
    """The delivery tag of a consumed message (a ``Basic.Deliver`` always has one)."""
    return message.delivery.delivery_tag or 0  # type: ignore[union-attr]


def _fingerprint(message: DeliveredMessage) -> bytes:
    """Identifies a message across a requeue: its ``message_id``, else its content."""
    properties = message.header.properties
    if properties.message_id:
        return str(properties.message_id).encode()
    digest = hashlib.blake2b(message.body, digest_size=16)
    digest.update(repr(sorted((properties.headers or {}).items())).encode())
    return digest.digest()
