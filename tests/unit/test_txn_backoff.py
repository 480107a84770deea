"""The wait before a transactional writer asks again when the broker is still writing
the previous transaction's markers (aiokafka's BACKOFF_OVERRIDE: 20 ms) is 2 ms once a
Kafka source exists; a shorter one is kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiokafka.producer import sender

from streamapp.transports.kafka.txn_backoff import (
    CONCURRENT_TRANSACTIONS_BACKOFF_S,
    shorten_concurrent_transactions_backoff,
)


@pytest.fixture
def original() -> Iterator[float]:
    before = sender.BACKOFF_OVERRIDE
    yield before
    sender.BACKOFF_OVERRIDE = before


def test_the_wait_between_transactions_is_shortened(original: float) -> None:
    sender.BACKOFF_OVERRIDE = 0.02  # aiokafka's own
    shorten_concurrent_transactions_backoff()
    assert sender.BACKOFF_OVERRIDE == CONCURRENT_TRANSACTIONS_BACKOFF_S == 0.002


def test_a_shorter_wait_is_kept(original: float) -> None:
    sender.BACKOFF_OVERRIDE = 0.001
    shorten_concurrent_transactions_backoff()
    assert sender.BACKOFF_OVERRIDE == 0.001
