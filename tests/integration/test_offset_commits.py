"""Coalesced offset commits on a real group: every partition's latest position lands,
positions recorded while a commit is in flight go with the next one, a position of a
partition no longer assigned is dropped without failing the others, and nothing is
recorded after close."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.kafka.commits import OffsetCommits

pytestmark = pytest.mark.integration

PARTITIONS = 4


async def _committed(bootstrap: str, group: str) -> dict[int, tuple[int, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: (meta.offset, meta.metadata) for tp, meta in found.items()}


async def test_positions_commit_together_latest_wins_and_unassigned_ones_are_dropped(
    kafka_bootstrap: str,
) -> None:
    topic, group = f"commits-{uuid.uuid4().hex[:8]}", f"commits-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        for _ in range(300):  # the group forms (bounded: 30 s)
            await consumer.getmany(timeout_ms=100)
            if len(consumer.assignment()) == PARTITIONS:
                break
        assert len(consumer.assignment()) == PARTITIONS
        commits = OffsetCommits(consumer)
        for p in range(PARTITIONS):
            commits.record(TopicPartition(topic, p), 1)
        for p in range(PARTITIONS):  # before the first commit goes out: replaced
            commits.record(TopicPartition(topic, p), 10 + p, f"m{p}")
        commits.record(TopicPartition(f"{topic}-not-ours", 0), 5)
        await commits.flush()
        assert await _committed(kafka_bootstrap, group) == {
            p: (10 + p, f"m{p}") for p in range(PARTITIONS)
        }
        await commits.close()
        commits.record(TopicPartition(topic, 0), 99)
        await asyncio.sleep(0.2)
        assert (await _committed(kafka_bootstrap, group))[0] == (10, "m0")
    finally:
        await consumer.stop()
