"""Start-up retries while the broker is not ready yet (setting ``startup_retry``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaConnectionError

from ..errors import BrokerUnavailableError
from ..settings import Settings

log = logging.getLogger("streamapp.kafka")


async def with_startup_retry(
    settings: Settings, what: str, start: Callable[[], Awaitable[None]]
) -> None:
    """Call ``start`` until it connects; back off 100 ms to 2 s, ten attempts by default."""
    delays = settings.startup_retry.delays()
    for attempt in range(len(delays) + 1):
        try:
            await start()
            return
        except KafkaConnectionError as exc:
            if attempt == len(delays):
                raise BrokerUnavailableError(
                    f"{what}: Kafka at {settings.kafka_bootstrap} (setting kafka_bootstrap) did "
                    f"not answer after {attempt + 1} attempts ({exc}); is the broker up?"
                ) from exc
            log.info("%s: Kafka not ready (%s); retrying in %.1fs", what, exc, delays[attempt])
            await asyncio.sleep(delays[attempt])
