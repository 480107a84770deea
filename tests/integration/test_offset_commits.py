"""Coalesced offset commits on a real group: every partition's latest position lands,
positions recorded while a commit is in flight go with the next one, a position of a
partition no longer assigned is dropped without failing the others, nothing is
recorded after close; ``settled`` returns once a partition's commit landed (a
transaction's offset goes after it), and a flush past its bound drops what is left."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.kafka.commits import OffsetCommits

pytestmark = pytest.mark.integration

PARTITIONS = 4


async def _member(bootstrap: str, partitions: int) -> tuple[str, str, AIOKafkaConsumer]:
    """A fresh topic, and a started consumer that the group assigned all of it."""
    topic, group = f"commits-{uuid.uuid4().hex[:8]}", f"commits-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    for _ in range(300):  # the group forms (bounded: 30 s)
        await consumer.getmany(timeout_ms=100)
        if len(consumer.assignment()) == partitions:
            return topic, group, consumer
    await consumer.stop()
    raise AssertionError(f"{topic}: the group did not assign its {partitions} partitions in 30 s")


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
    topic, group, consumer = await _member(kafka_bootstrap, PARTITIONS)
    try:
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


async def test_settled_waits_for_the_partitions_commit_and_a_late_flush_drops_the_rest(
    kafka_bootstrap: str,
) -> None:
    topic, group, consumer = await _member(kafka_bootstrap, 2)
    try:
        tp = TopicPartition(topic, 0)
        commits = OffsetCommits(consumer)
        commits.record(tp, 7)
        await commits.settled(tp)  # no flush: settled alone waits for the commit
        assert (await _committed(kafka_bootstrap, group))[0] == (7, "")

        hasty = OffsetCommits(consumer, timeout_s=1e-6)  # no commit fits in that bound
        hasty.record(tp, 8)
        hasty.record(TopicPartition(topic, 1), 8)
        await hasty.flush()  # timed out: nothing is left pending or in flight
        await asyncio.wait_for(hasty.settled(tp), 0.01)
        hasty.timeout_s = 10.0
        hasty.record(tp, 9)  # and it goes on committing
        await hasty.flush()
        assert (await _committed(kafka_bootstrap, group))[0] == (9, "")
    finally:
        await consumer.stop()
