"""The one way to RabbitMQ: a robust connection, retried at start-up (``startup_retry``)."""

from __future__ import annotations

import asyncio
import logging
from typing import cast
from urllib.parse import urlsplit

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import AMQPConnectionError

from ..errors import BrokerUnavailableError
from ..settings import Settings

log = logging.getLogger("streamapp.rabbitmq")


def safe_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


async def connect(
    settings: Settings, what: str = "RabbitMQ", *, robust: bool = True
) -> AbstractRobustConnection:
    """A robust connection to setting ``amqp_url``; after a loss it reconnects on its own
    (channels and consumers are restored; unacked deliveries come again, redelivered).
    With ``robust=False`` a plain connection (typed alike): a loss closes it for good."""
    delays = settings.startup_retry.delays()
    for attempt in range(len(delays) + 1):
        try:
            if not robust:
                plain = await aio_pika.connect(settings.amqp_url, timeout=10)
                return cast(AbstractRobustConnection, plain)
            return await aio_pika.connect_robust(settings.amqp_url, timeout=10)
        except (AMQPConnectionError, OSError, TimeoutError) as exc:
            if attempt == len(delays):
                raise BrokerUnavailableError(
                    f"{what}: RabbitMQ at {safe_url(settings.amqp_url)} (setting amqp_url, "
                    f"STREAMAPP_AMQP_URL) did not answer after {attempt + 1} attempts "
                    f"({exc!r}); is the broker up?"
                ) from exc
            log.info("%s: RabbitMQ not ready (%r); retrying in %.1fs", what, exc, delays[attempt])
            await asyncio.sleep(delays[attempt])
    raise AssertionError("unreachable")
