"""On real Kafka: the worker's shared transaction sends its records, waits for them, and
only then adds its offsets, so that no Produce is refused while the transaction changes.

Kafka verifies a transactional Produce with the transaction coordinator (KIP-890). When
AddOffsetsToTxn changes the same transaction at that moment, the broker answers
aiokafka's Produce (v7) NOT_ENOUGH_REPLICAS, which aiokafka retries after
``retry_backoff_ms`` (100 ms): with the offsets added while the records were still in
flight, 1-3 transactions in a hundred of eight partitions and their offsets waited so
(each Produce of all eight refused at once), which made a live p99 of 100 ms and more.
The first test fails on that order (2 of 2 runs): 150 such transactions see no refused
Produce. The second: a refused send fails its transaction even when it carries no
offsets (aiokafka would commit it without the refused batch).
"""

from __future__ import annotations

import logging
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.errors import PublishError
from streamapp.records import Message
from streamapp.transports.kafka.txn_writer import Part, TransactionalWriter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 8
TRANSACTIONS = 150


async def create(bootstrap: str, *topics: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(list(topics))
    finally:
        await admin.close()


async def test_records_are_acked_before_the_offsets_join_the_transaction(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    ns = f"order{uuid.uuid4().hex[:6]}-"
    changelog, source = f"{ns}changelog", f"{ns}source"
    await create(
        kafka_bootstrap, NewTopic(changelog, PARTITIONS, 1), NewTopic(source, PARTITIONS, 1)
    )
    writer = TransactionalWriter(kafka_bootstrap, f"{ns}txn", group_id=f"{ns}group", timeout_s=30)
    caplog.set_level(logging.WARNING, logger="aiokafka.producer.sender")
    ends: list[list[int]] = []
    try:
        await writer.start()
        for n in range(TRANSACTIONS):
            parts = [
                Part(
                    TopicPartition(source, p),
                    [(changelog, [(f"k{p}".encode(), f"v{n}".encode())])],
                    [],
                    (n + 1, ""),
                )
                for p in range(PARTITIONS)
            ]
            ends.append([positions[0] for positions in await writer.run(parts)])
    finally:
        await writer.close()
    refused = [r.getMessage() for r in caplog.records if "NotEnoughReplicas" in r.getMessage()]
    assert refused == [], f"{len(refused)} Produce requests refused, first: {refused[0]}"
    # each transaction committed one record per partition, after the one before (and
    # its commit marker, which takes an offset too)
    assert ends == [[2 * n + 1] * PARTITIONS for n in range(TRANSACTIONS)]


async def test_a_refused_send_fails_a_transaction_without_offsets(kafka_bootstrap: str) -> None:
    """A cycle whose parts carry no offset (a replayed batch, a new table's first one)
    still fails when one of its sends is refused: aiokafka would commit the transaction
    without the refused batch (a changelog batch lost under a committed transaction)."""
    ns = f"refuse{uuid.uuid4().hex[:6]}-"
    changelog, small = f"{ns}changelog", f"{ns}small"
    await create(
        kafka_bootstrap,
        NewTopic(changelog, 1, 1),
        NewTopic(small, 1, 1, topic_configs={"max.message.bytes": "1000"}),
    )
    writer = TransactionalWriter(kafka_bootstrap, f"{ns}txn", group_id=f"{ns}group", timeout_s=30)
    part = Part(
        TopicPartition(f"{ns}source", 0),
        [(changelog, [(b"k", b"v")])],
        [Message(small, b"x" * 5000, b"k", (), 0)],  # refused: MESSAGE_TOO_LARGE
        None,
    )
    try:
        await writer.start()
        with pytest.raises(PublishError, match="TooLarge"):  # the broker's refusal, named
            await writer.run([part])
    finally:
        await writer.close()
    reader = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await reader.start()
    try:
        tp = TopicPartition(changelog, 0)
        reader.assign([tp])
        fetched = await reader.getmany(tp, timeout_ms=2000)
        assert fetched.get(tp, []) == []  # the changelog record was aborted with it
    finally:
        await reader.stop()
