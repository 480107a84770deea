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
from streamapp.transports.kafka.txn_writer import TransactionalWriter

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
        with pytest.raises(FencedError, match="fenced by a newer producer of its transactional id"):
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


async def test_openings_cancelled_mid_start_leave_one_producer_that_commits(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The worker's one writer, started by several partitions' openings at once, each
    cancelled while the start runs (their stores found damaged): the start goes on as
    the writer's, and no producer of the same id is left starting beside the one kept,
    whose InitProducerId could land after it and fence it. A commit then succeeds."""
    ns = f"fence{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path)
    topic = app.topic(f"{ns}in", partitions=1)
    table: Table[int] = Table("t")

    @app.agent(topic, tables=[table])
    async def agent(event: Event, t: TableView[int]) -> None: ...

    await create_topics(app, app.settings())
    shared = TransactionalWriter(kafka_bootstrap, f"{ns}txn", group_id=app.id, timeout_s=30)

    def transaction() -> KafkaTransaction:
        return KafkaTransaction(
            kafka_bootstrap,
            shared.transactional_id,
            TopicPartition(topic.name, 0),
            app.id,
            app.changelog_topic,
            timeout_s=30,
            stall_timeout_s=30,
            retention_ms={},
            writer=shared,
        )

    try:
        for _ in range(3):  # rounds of openings cancelled at different points of a start
            openings = [asyncio.create_task(transaction().open()) for _ in range(4)]
            for delay in (0.0, 0.002, 0.01, 0.03):
                await asyncio.sleep(delay)
                openings.pop(0).cancel()
            await asyncio.sleep(0)
        owner = transaction()
        await owner.open()
        # What the old writer left behind (a producer per cancelled opening, still
        # starting) had long ended its InitProducerId by now: the one kept still commits.
        await asyncio.sleep(1.0)
        batch = BatchChanges({"t": {b"k": b"1"}}, {}, Checkpoint(live=1))
        assert await owner.commit([(agent, batch)], [], None)
    finally:
        await shared.close()
