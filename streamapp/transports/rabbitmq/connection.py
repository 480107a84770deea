"""The one way to RabbitMQ: a robust connection, retried at start-up (``startup_retry``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import AMQPConnectionError

from ...errors import BrokerUnavailableError, StreamappError
from ...settings.settings import Settings
from ..startup import retry_startup

log = logging.getLogger("streamapp.rabbitmq")
T = TypeVar("T")


def safe_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


async def connect(
    settings: Settings, what: str = "RabbitMQ", *, robust: bool = True
) -> AbstractRobustConnection:
    """A robust connection to setting ``amqp_url`` (AMQP heartbeat: setting
    ``amqp_heartbeat_s``); after a loss it reconnects on its own
    (channels and consumers are restored; unacked deliveries come again, redelivered).
    With ``robust=False`` a plain connection (typed alike): a loss closes it for good.
    Start-up retries as :func:`with_startup_retry` says."""

    beat = settings.amqp_heartbeat_s  # the broker drops a connection it no longer hears

    async def open_connection() -> AbstractRobustConnection:
        if not robust:
            plain = await aio_pika.connect(settings.amqp_url, timeout=10, heartbeat=beat)
            return cast(AbstractRobustConnection, plain)
        return await aio_pika.connect_robust(settings.amqp_url, timeout=10, heartbeat=beat)

    return await with_startup_retry(settings, what, open_connection)


async def with_startup_retry(settings: Settings, what: str, step: Callable[[], Awaitable[T]]) -> T:
    """``step`` with start-up retries (setting ``startup_retry``): RabbitMQ not answering
    and a missing exchange or queue are retried, what is not retriable fails at once
    (:func:`streamapp.transports.startup.retry_startup`)."""

    def classify(exc: Exception) -> StreamappError | None:
        if isinstance(exc, AMQPConnectionError | OSError | TimeoutError):
            return BrokerUnavailableError(
                f"{what}: RabbitMQ at {safe_url(settings.amqp_url)} (setting amqp_url, "
                f"STREAMAPP_AMQP_URL) did not answer "
                f"({exc!r}); is the broker up?"
            )
        return None

    return await retry_startup(settings, what, step, classify)


class Closable(Protocol):
    """A channel, of aio-pika or of aiormq under it."""

    @property
    def is_closed(self) -> bool: ...

    def close(self) -> Awaitable[Any]: ...


_closing: set[asyncio.Future[Any]] = set()
"""Channel closes under way: held until they end (never cancelled)."""


async def close_channel(channel: Closable, timeout_s: float) -> bool:
    """Close ``channel``, waiting at most ``timeout_s``; False when it did not close in
    time. The close itself is never cancelled: aiormq answers a cancelled
    ``Channel.Close`` with a second one, and a close of a channel the broker already
    closed is a connection error (``CHANNEL_ERROR - expected 'channel.open'``) that drops
    every other channel of the connection. A close past the wait goes on by itself."""
    if channel.is_closed:
        return True
    task = asyncio.ensure_future(channel.close())
    _closing.add(task)  # held until it ends, even when the caller is cancelled
    task.add_done_callback(_forget)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if done:
        task.result()
        return True
    return False


def _forget(task: asyncio.Future[Any]) -> None:
    _closing.discard(task)
    if not task.cancelled():
        task.exception()  # seen here; a caller still waiting reads it too
