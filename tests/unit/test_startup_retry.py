"""``retry_startup`` retries by ``StreamappError.retriable`` alone, and nested steps share
the outermost step's attempts."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import KafkaConnectionError

from streamapp import Backoff, ConfigError, MissingTopicError, Settings
from streamapp.errors import BrokerUnavailableError, SourceError
from streamapp.transports.kafka.connection import with_startup_retry
from streamapp.transports.startup import retry_startup

SETTINGS = Settings(app_id="a", startup_retry=Backoff(attempts=4, initial_s=0.001, max_s=0.001))


def _never(exc: Exception) -> None:
    return None


async def test_retriable_errors_are_retried_until_the_attempts_are_spent() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise MissingTopicError(["t"], "m:app")

    with pytest.raises(MissingTopicError):
        await retry_startup(SETTINGS, "check", step, _never)
    assert calls == 4


async def test_a_non_retriable_error_fails_at_once() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise ConfigError("topic 't' has 1 partitions but ... 2")

    with pytest.raises(ConfigError):
        await retry_startup(SETTINGS, "check", step, _never)
    assert calls == 1


async def test_a_client_error_is_classified_then_retried_as_it_says() -> None:
    calls = 0

    async def step() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OSError("refused")
        return calls

    def classify(exc: Exception) -> SourceError | None:
        return SourceError(str(exc), retriable=True) if isinstance(exc, OSError) else None

    assert await retry_startup(SETTINGS, "connect", step, classify) == 3
    with pytest.raises(KeyError):  # not the transport's: raised as it is, once
        await retry_startup(SETTINGS, "connect", _raises_key_error, classify)


async def _raises_key_error() -> None:
    raise KeyError("x")


async def test_nested_steps_share_the_outer_attempts() -> None:
    inner_calls = 0

    async def inner() -> None:
        nonlocal inner_calls
        inner_calls += 1
        raise SourceError("down", retriable=True)

    async def outer() -> None:
        await retry_startup(SETTINGS, "connect", inner, _never)

    with pytest.raises(SourceError):
        await retry_startup(SETTINGS, "check", outer, _never)
    assert inner_calls == 4  # not 4 x 4


async def test_each_retry_line_names_its_attempt_and_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="streamapp.startup")

    async def step() -> None:
        raise KafkaConnectionError("refused")

    with pytest.raises(BrokerUnavailableError) as info:
        await with_startup_retry(SETTINGS, "connecting", step)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    for n, line in enumerate(lines, 1):
        assert line.startswith(f"connecting: attempt {n} of 4 failed: connecting: Kafka at "), line
        assert "attempts" not in line.split("failed:", 1)[1], line  # no budget said as spent
    assert str(info.value).endswith(
        "is the broker up? Gave up after 4 attempts (setting startup_retry)."
    )
