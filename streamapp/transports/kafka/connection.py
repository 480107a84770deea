"""Start-up retries on Kafka (setting ``startup_retry``):
:func:`streamapp.transports.startup.retry_startup` with aiokafka's errors made streamapp
errors, retriable as aiokafka marks them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaConnectionError, KafkaError

from ...errors import BrokerUnavailableError, SourceError, StreamappError
from ...settings.settings import Settings
from ..startup import retry_startup


async def with_startup_retry(
    settings: Settings, what: str, start: Callable[[], Awaitable[None]]
) -> None:
    """Call ``start`` until it succeeds or fails for good; back off 100 ms to 2 s, ten
    attempts by default. Retried: what :attr:`StreamappError.retriable` says (a broker
    not answering, a missing topic), never a wrong setting or partition count."""

    def classify(exc: Exception) -> StreamappError | None:
        if isinstance(exc, KafkaConnectionError):
            return BrokerUnavailableError(
                f"{what}: Kafka at {settings.kafka_bootstrap} (setting kafka_bootstrap) did "
                f"not answer ({exc}); is the broker up?"
            )
        if isinstance(exc, KafkaError):
            return SourceError(f"{what}: Kafka failed: {exc!r}", retriable=exc.retriable)
        return None

    await retry_startup(settings, what, start, classify)
