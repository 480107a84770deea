"""The lineage check itself on a real changelog partition (written by the partition
task's transactional writer): which kept stores it accepts and why it refuses the others."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streamapp import Table
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import BatchChanges, PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.transports.kafka.lineage import mismatch
from streamapp.transports.kafka.transaction import KafkaTransaction

from .harness import compacted_changelog

pytestmark = pytest.mark.integration

AGENT = cast(Any, None)  # the writer asks its changelog function only, which ignores it


@pytest.fixture
async def changelog(kafka_bootstrap: str) -> TopicPartition:
    return await compacted_changelog(kafka_bootstrap, "lineage")


async def check(bootstrap: str, tp: TopicPartition, cp: Checkpoint) -> str | None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        return await mismatch(consumer, tp, cp, end, 10.0)
    finally:
        await consumer.stop()


async def test_the_check_accepts_its_own_lineage_and_names_what_differs(
    kafka_bootstrap: str, changelog: TopicPartition
) -> None:
    table = Table("rows")
    pt = PartitionTables([table], MemoryStore(spaces_for([table])), 0)
    writer = KafkaTransaction(
        kafka_bootstrap,
        f"{changelog.topic}-writer",
        TopicPartition(f"{changelog.topic}-source", 0),
        "lineage-group",
        lambda agent: changelog.topic,
        timeout_s=30,
        stall_timeout_s=10,
        retention_ms={},
    )
    await writer.open()
    try:
        pt.views[0]["k"] = {"v": 1}
        pt.commit_event()
        batch = pt.take_batch(Checkpoint(live=1))
        (position,) = await writer.commit([(AGENT, batch)], [], None)
        pt.write(batch, position)
        # a batch as streamapp wrote it before marks: a checkpoint record without one
        legacy = BatchChanges({"rows": {b"j": b"2"}}, {}, Checkpoint(live=2))
        (after,) = await writer.commit([(AGENT, legacy)], [], None)
    finally:
        await writer.close()
    own = pt.checkpoint
    assert (own.changelog, own.marked) == (position, position - 1)  # data record, checkpoint

    assert await check(kafka_bootstrap, changelog, own) is None
    assert await check(kafka_bootstrap, changelog, Checkpoint()) is None  # applied nothing
    other = own.advanced(mark="0123456789abcdef")
    assert "carries mark" in (await check(kafka_bootstrap, changelog, other) or "")
    on_data = own.advanced(marked=position - 2)
    assert "data record" in (await check(kafka_bootstrap, changelog, on_data) or "")
    past = own.advanced(changelog=after + 5)
    assert f"up to offset {after + 5}, but it ends at {after + 1}" in (
        await check(kafka_bootstrap, changelog, past) or ""
    )
    unmarked = own.advanced(marked=-1)
    assert "names no changelog record" in (await check(kafka_bootstrap, changelog, unmarked) or "")
    # a store restored from the legacy batch: no mark on either side, the positions agree
    restored = Checkpoint(live=2, changelog=after + 1, marked=after - 1)
    assert await check(kafka_bootstrap, changelog, restored) is None
    moved = restored.advanced(live=3)
    assert "holds positions (2, None, False)" in (
        await check(kafka_bootstrap, changelog, moved) or ""
    )
