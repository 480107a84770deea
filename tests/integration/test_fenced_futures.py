"""On real Kafka: a transactional writer fenced by the partition's next owner fails its
batch with FencedError, and leaves no send future whose ProducerFenced nobody retrieved
(asyncio would print each as "Future exception was never retrieved")."""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from streamapp import App, Event, Table, TableView
from streamapp.errors import FencedError
from streamapp.records import Message
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import BatchChanges
from streamapp.transports.kafka.topology import create_topics
from streamapp.transports.kafka.transaction import KafkaTransaction

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_a_fenced_writer_leaves_no_unretrieved_future(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = f"fence{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path)
    topic = app.topic(f"{ns}in", partitions=1)
    out = app.topic(f"{ns}out", partitions=1)
    table: Table[int] = Table("t")

    @app.agent(topic, tables=[table], sinks=[out])
    async def agent(event: Event, t: TableView[int], *, send: object) -> None: ...

    await create_topics(app, app.settings())
    source = TopicPartition(topic.name, 0)

    def writer() -> KafkaTransaction:
        return KafkaTransaction(
            kafka_bootstrap,
            f"{ns}txn",
            source,
            app.id,
            app.changelog_topic,
            timeout_s=30,
            stall_timeout_s=30,
            retention_ms={},
        )

    value = b"x" * 1000  # 2,000 records: several record batches, one future each
    batch = BatchChanges(
        {"t": {f"k{i}".encode(): value for i in range(2000)}}, {}, Checkpoint(live=1)
    )
    outputs = [Message(out.name, b"v", b"k", (), 0) for _ in range(20)]
    zombie, owner = writer(), writer()
    await zombie.open()
    await owner.open()  # fences the zombie: same transactional id
    caplog.set_level(logging.ERROR, logger="asyncio")
    try:
        with pytest.raises(FencedError, match="fenced by another worker"):
            await zombie.commit([(agent, batch)], outputs, None)
        await zombie.close()
        assert await owner.commit([(agent, batch)], [], None)
    finally:
        await zombie.close()
        await owner.close()
    for _ in range(3):
        await asyncio.sleep(0.1)
        gc.collect()
    unretrieved = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unretrieved == [], unretrieved[0].getMessage()
