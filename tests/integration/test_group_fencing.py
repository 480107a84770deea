"""On real Kafka: a zombie's transaction is fenced by the group coordinator (KIP-447).

The transactional id is the worker's now, not the partition's: the next owner of a
partition does not fence the previous one by its ``InitProducerId``. What fences a
zombie (a worker whose partitions moved, its consumer not told yet) is the group's
generation and member id on the transaction's offsets (``TxnOffsetCommit`` v3): once
the group has moved to a generation without it, the coordinator refuses them and the
whole transaction is aborted, every partition of it. Here member A of a group commits
with its generation, another member joins (a new generation: A's partitions move), and
A's writer, still holding the old generation, tries a transaction of two partitions:
both fail with FencedError, nothing of it is visible or committed; a writer with the
group's current generation then commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.errors import FencedError
from streamapp.transports.kafka.source import group_member
from streamapp.transports.kafka.txn_offsets import Member
from streamapp.transports.kafka.txn_writer import Part, TransactionalWriter
from tests.support.waits import until

from .harness import read_topic

pytestmark = pytest.mark.integration


async def _member(
    bootstrap: str, group: str, topic: str
) -> tuple[AIOKafkaConsumer, asyncio.Task[None]]:
    """A member of ``group`` on ``topic``, polled in the background (it takes part in
    the group's rebalances)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=500,
        rebalance_timeout_ms=10_000,
    )
    await consumer.start()

    async def poll() -> None:
        while True:
            await consumer.getmany(timeout_ms=100)

    return consumer, asyncio.create_task(poll())


async def _offsets(bootstrap: str, group: str, tps: list[TopicPartition]) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    return {tp.partition: m.offset for tp, m in found.items() if m.offset >= 0}


async def test_a_zombie_is_fenced_by_the_group_coordinator(kafka_bootstrap: str) -> None:
    ns = f"zomb{uuid.uuid4().hex[:6]}-"
    source, log_topic, group = f"{ns}in", f"{ns}changelog", f"{ns}group"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 2, 1) for t in (source, log_topic)])
    finally:
        await admin.close()
    tps = [TopicPartition(source, 0), TopicPartition(source, 1)]

    def part(p: int, value: bytes, offset: int) -> Part:
        return Part(tps[p], [(log_topic, [(b"k", value)])], [], (offset, ""))

    a, a_poll = await _member(kafka_bootstrap, group, source)
    b: AIOKafkaConsumer | None = None
    b_poll: asyncio.Task[None] | None = None
    writer = None
    try:
        stale = await until(
            lambda: group_member(a) if a.assignment() else None,
            what="member A assigned",
            progress=lambda: len(a.assignment()),
        )
        held: Member = stale
        writer = TransactionalWriter(
            kafka_bootstrap, f"{ns}a", group_id=group, timeout_s=30, member=lambda: held
        )
        await writer.commit(part(0, b"a1", 5))
        assert await _offsets(kafka_bootstrap, group, tps) == {0: 5}

        # Another member joins: a new generation, A's partitions move (A rejoins too,
        # but its writer still holds the old generation, as a zombie's would).
        b, b_poll = await _member(kafka_bootstrap, group, source)
        await until(
            lambda: (
                bool(b is not None and b.assignment())
                and (m := group_member(a)) is not None
                and m.generation_id > stale.generation_id
            ),
            what="a new generation with member B assigned",
            progress=lambda: (group_member(a), b is not None and len(b.assignment())),
        )
        parts = [part(0, b"zombie", 9), part(1, b"zombie", 9)]
        results = await asyncio.gather(*(writer.commit(p) for p in parts), return_exceptions=True)
        for result in results:  # one transaction: every partition of it fails
            assert isinstance(result, FencedError), results
            assert "fenced by the group coordinator" in str(result), result
        assert await _offsets(kafka_bootstrap, group, tps) == {0: 5}
        values = [r.value for r in await read_topic(kafka_bootstrap, log_topic)]
        assert values == [b"a1"], values  # the zombie's transaction was aborted

        current = group_member(a)
        assert current is not None
        held = current  # the group's current generation: the writer commits again
        await writer.commit(part(0, b"a2", 7))
        assert await _offsets(kafka_bootstrap, group, tps) == {0: 7}
    finally:
        for poll in (a_poll, b_poll):
            if poll is not None:
                poll.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poll
        if writer is not None:
            await writer.close()
        await a.stop()
        if b is not None:
            await b.stop()
