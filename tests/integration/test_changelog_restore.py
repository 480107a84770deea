"""A restore's own fetch of a real changelog partition: committed batches only, every
record once, across fetches and writes of any size."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from streamapp import Table
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.transports.kafka import changelog_read, transaction
from streamapp.transports.kafka.transaction import KafkaTransaction, restore

from .harness import compacted_changelog

pytestmark = pytest.mark.integration

AGENT = cast(Any, None)  # the writer asks its changelog function only, which ignores it
TABLE: Table[int] = Table("rows")


@pytest.fixture
async def changelog(kafka_bootstrap: str) -> TopicPartition:
    return await compacted_changelog(kafka_bootstrap, "restore")


def _writer(bootstrap: str, changelog: TopicPartition, source: TopicPartition) -> KafkaTransaction:
    """The transactional writer of ``source``'s task (the same id: a second one fences the
    first) over ``changelog``."""
    return KafkaTransaction(
        bootstrap,
        f"{changelog.topic}-writer",
        source,
        "restore-group",
        lambda agent: changelog.topic,
        timeout_s=30,
        stall_timeout_s=10,
        retention_ms={},
    )


async def _aborted(bootstrap: str, tp: TopicPartition, keys: list[str]) -> None:
    """A transaction of another producer that writes ``keys`` and is aborted."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{tp.topic}-aborter", enable_idempotence=True
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for key in keys:
            await producer.send(tp.topic, b"999", key=b"drows\x00" + key.encode(), partition=0)
        await producer.send(tp.topic, Checkpoint(live=999).positions(), key=b"c", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()


@pytest.mark.parametrize("small", [False, True], ids=["one-fetch", "tiny-fetches-and-chunks"])
async def test_restore_applies_committed_batches_only_each_record_once(
    kafka_bootstrap: str,
    changelog: TopicPartition,
    monkeypatch: pytest.MonkeyPatch,
    small: bool,
) -> None:
    if small:  # a fetch of one record batch at a time, a write every 7 records
        monkeypatch.setattr(changelog_read, "PARTITION_FETCH_BYTES", 1)
        monkeypatch.setattr(transaction, "CHUNK", 7)
    source = TopicPartition(f"{changelog.topic}-source", 0)
    writer = _writer(kafka_bootstrap, changelog, source)
    written = PartitionTables([TABLE], MemoryStore(spaces_for([TABLE])), 0)
    await writer.open()
    try:
        for n in range(1, 6):  # committed batches, an aborted transaction between each
            for i in range(20):
                written.views[0][f"k{i}"] = n * 100 + i
                written.record_version(f"k{i}", n)
                written.commit_event()
            batch = written.take_batch(Checkpoint(live=n))
            (position,) = await writer.commit([(AGENT, batch)], [], None)
            written.write(batch, position)
            await _aborted(kafka_bootstrap, changelog, [f"k{i}" for i in range(0, 30, 3)])
    finally:
        await writer.close()

    fresh = PartitionTables([TABLE], MemoryStore(spaces_for([TABLE])), 0)
    applied = await restore(kafka_bootstrap, changelog, fresh, 10.0)
    assert applied == 5 * (20 + 20 + 1)  # data, versions, checkpoint: the aborted ones never
    assert dict(fresh.views[0].items()) == {f"k{i}": 500 + i for i in range(20)}
    assert fresh.applied_version("k3") == 5
    assert fresh.checkpoint.live == 5
    assert fresh.checkpoint.mark == written.checkpoint.mark
    assert fresh.checkpoint.changelog > written.checkpoint.changelog  # past the last abort
    again = await restore(kafka_bootstrap, changelog, fresh, 10.0)
    assert again == 0  # at the end: nothing read twice

    # A new owner: its writer opens (fencing the first), then restores the same state.
    owner = _writer(kafka_bootstrap, changelog, source)
    taken = PartitionTables([TABLE], MemoryStore(spaces_for([TABLE])), 0)
    await owner.open()
    try:
        assert await owner.restore(AGENT, taken) == applied
        assert dict(taken.views[0].items()) == dict(fresh.views[0].items())
        assert taken.checkpoint.changelog == fresh.checkpoint.changelog
    finally:
        await owner.close()
