"""Start-up retries cover the topology check, decided by ``StreamappError.retriable``: a
worker started before its topics (Kafka) or exchanges and queues (RabbitMQ) exist
starts once they are made within the retry window; a wrong partition count is not
retried (it fails at once, however long the window)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamapp import App, Backoff, Event, FromEventStore, Retry
from streamapp.errors import ConfigError
from streamapp.transports.kafka.topology import create_topics as create_kafka_topics
from streamapp.transports.rabbitmq.topology import create_topology
from streamapp.worker import Worker
from tests.conftest import Services

from .harness import produce
from .test_chain_partitions import _make_topic
from .test_rabbitmq_retry_chain import new_app, send, until

pytestmark = pytest.mark.integration

WINDOW = Backoff(attempts=60, initial_s=0.2, max_s=0.5)
"""About 29 s of retries."""


def _kafka_app(ns: str, tmp_path: Path, bootstrap: str) -> tuple[App, Any, Counter[str]]:
    app = App(
        f"{ns}app", kafka_bootstrap=bootstrap, data_dir=tmp_path, web_port=0, startup_retry=WINDOW
    )
    topic = app.topic(f"{ns}in", partitions=2)
    seen: Counter[str] = Counter()

    @app.agent(topic, on_failure=Retry(intervals=(0.05,), backoff=(1,)))
    async def count(event: Event) -> None:
        seen[event.id] += 1

    return app, topic, seen


async def _later(delay_s: float, make: Any) -> float:
    await asyncio.sleep(delay_s)
    await make()
    return time.monotonic()


async def test_a_kafka_worker_started_before_its_topics_starts_once_they_are_made(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"sr{uuid.uuid4().hex[:6]}-"
    app, topic, seen = _kafka_app(ns, tmp_path, kafka_bootstrap)
    settings = app.settings()
    worker = Worker(app, settings)
    started = time.monotonic()
    making = asyncio.create_task(_later(1.5, lambda: create_kafka_topics(app, settings)))
    try:
        await worker.start()
        ready = time.monotonic()
        made = await making
        print(f"topics made {made - started:.1f}s, worker started {ready - started:.1f}s")
        assert made <= ready < made + 5
        await produce(kafka_bootstrap, topic.name, [Event.create("t", stream_id="s", id="e")])

        async def handled() -> bool:
            return seen["e"] == 1

        await until(handled, "handled by the worker that waited for its topics")
    finally:
        making.cancel()
        await worker.stop()


async def test_a_wrong_partition_count_is_not_retried(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = f"srn{uuid.uuid4().hex[:6]}-"
    app, _topic, _seen = _kafka_app(ns, tmp_path, kafka_bootstrap)
    await _make_topic(kafka_bootstrap, f"{ns}in-retry", 1)
    await create_kafka_topics(app, app.settings())
    worker = Worker(app, app.settings())
    with (
        caplog.at_level(logging.INFO, logger="streamapp.startup"),
        pytest.raises(ConfigError, match="has 1 partitions"),
    ):
        await worker.start()
    await worker.stop()
    retried = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retried == []  # refused at the first try: waiting cannot fix a partition count


async def test_a_rabbitmq_worker_started_before_its_queues_starts_once_they_are_made(
    services: Services, tmp_path: Path
) -> None:
    ns = f"srr{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, services.amqp, startup_retry=WINDOW)
    topic = app.topic(f"{ns}in", partitions=2)
    seen: Counter[str] = Counter()

    @app.agent(topic, history=FromEventStore())
    async def count(event: Event) -> None:
        seen[event.id] += 1

    settings = app.settings()
    worker = Worker(app, settings)
    started = time.monotonic()
    making = asyncio.create_task(_later(1.5, lambda: create_topology(app, settings)))
    try:
        await worker.start()
        ready = time.monotonic()
        made = await making
        print(f"topology made {made - started:.1f}s, worker started {ready - started:.1f}s")
        assert made <= ready < made + 5
        await send(app, topic.name, [Event.create("t", stream_id="s", id="e")])

        async def handled() -> bool:
            return seen["e"] == 1

        await until(handled, "handled by the worker that waited for its queues")
    finally:
        making.cancel()
        await worker.stop()
