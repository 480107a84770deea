"""Chain topics with their own partition counts, on real Kafka: a retry topic
partitioned unlike its source is refused at start, naming both counts. (One-partition
dead-letter and parking topics taking copies from every partition are in the contract
suite, ``tests/contract/test_chain_contract.py``.)"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp import App, Event, Retry
from streamapp.errors import ConfigError
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker

pytestmark = pytest.mark.integration


async def _make_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def test_a_retry_topic_partitioned_unlike_its_source_is_refused_at_start(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = f"rt1p{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
    topic = app.topic(f"{ns}in", partitions=2)

    @app.agent(topic, on_failure=Retry(intervals=(0.05,), backoff=(1,)))
    async def picky(event: Event) -> None:
        pass

    await _make_topic(kafka_bootstrap, f"{ns}in-retry", 1)
    await create_app_topics(app, app.settings())
    worker = Worker(app, app.settings())
    with (
        caplog.at_level(logging.INFO, logger="streamapp.startup"),
        pytest.raises(ConfigError) as raised,
    ):
        await worker.start()
    await worker.stop()
    message = str(raised.value)
    assert f"'{ns}in-retry' has 1 partitions" in message
    assert "has 2" in message
    retried = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retried == []  # not retried as if the broker were down
