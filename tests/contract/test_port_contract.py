"""The port contract: what every transport's partition port promises the partition task
(:class:`~streamapp.engine.interfaces.PartitionPort`), on the real brokers.

:class:`PortContract` holds the cases every port passes; :class:`FetchingContract` those
of a port whose partition is fetched on its own while the task works (Kafka's poll loop,
RabbitMQ's consumer): the memory broker hands records only inside ``process()``, one
batch at a time, so it has nothing to pause. The harness (``port_harness.py``) drives
each port as the task does and puts a probe where the task takes deliveries.

Positions: an *absolute* port (Kafka, memory) numbers deliveries by the partition's own
offsets; a relative one (RabbitMQ, no offsets) numbers them from :meth:`begin` on, so
``begin(N)`` there means "the first delivery gets position N", and what it delivers is
what the queue holds (everything not settled). Either way positions are consecutive and
in order while nothing is skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from conftest import PgUrlFactory, Services

from streamapp.records import Delivery
from streamapp.topics import partition_for

from .port_harness import (
    TOPIC_PARTITIONS,
    KafkaPortHarness,
    KafkaSinkHarness,
    Member,
    MemoryPortHarness,
    MemorySinkHarness,
    PortHarness,
    RabbitMember,
    RabbitPortHarness,
    RabbitSinkHarness,
    SinkHarness,
    StorePortHarness,
    key_for,
)


def consecutive(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def positions(deliveries: Sequence[Delivery]) -> list[int]:
    return [d.position for d in deliveries]


def expected(
    h: PortHarness, m: Member, partition: int, first: int, n: int, start: int
) -> list[int]:
    """The positions of records ``first`` to ``first + n`` of ``partition`` when delivery
    began at ``start``: their own on an absolute port, numbered from ``start`` else."""
    if m.port(partition).absolute:
        return [h.position_of(partition, i) for i in range(first, first + n)]
    return consecutive(start, n)


class PortContract:
    """Every transport's port. Subclasses provide the ``h`` fixture."""

    keeps_offsets: bool = False
    """The transport reports the last settle itself (``committed()``: Kafka)."""

    knows_end: bool = False
    """``end()`` answers without a request (Kafka's high watermark, the memory list)."""

    @pytest.fixture
    def h(self) -> PortHarness:
        raise NotImplementedError("a transport's subclass provides the harness")

    async def test_begin_delivers_from_its_position_in_order_per_partition(
        self, h: PortHarness
    ) -> None:
        zero, one = await h.append(0, 6), await h.append(1, 3)
        m = await h.open([0, 1])
        start = await m.begin(0, h.position_of(0, 2))
        assert start == h.position_of(0, 2)
        skip = 2 if m.port(0).absolute else 0  # relative: the queue holds all six
        got = await m.take(0, 6 - skip)
        assert h.idents(got) == zero[skip:]
        assert positions(got) == expected(h, m, 0, skip, 6 - skip, start)
        assert {d.partition for d in got} == {0}
        begun = await m.begin(1, h.position_of(1, 0))
        other = await m.take(1, 3)
        assert h.idents(other) == one
        assert positions(other) == expected(h, m, 1, 0, 3, begun)
        assert {d.partition for d in other} == {1}
        marker = await h.append(0, 1)  # nothing else of partition 0 came meanwhile
        assert h.idents(await m.take(0, 1)) == marker
        assert m.untaken(0) == []

    async def test_the_next_owner_resumes_at_the_last_settle(self, h: PortHarness) -> None:
        """Settle 4 of 6, close: the next owner gets records 4 and 5, nothing before
        (never redelivered) and nothing lost; the settle is the transport's own where
        it keeps one (Kafka's committed offset, RabbitMQ's acks), else the checkpoint
        the task gives ``begin``."""
        sent = await h.append(0, 6)
        first = await h.open([0])
        await first.begin(0, h.position_of(0, 0))
        got = await first.take(0, 6)
        await first.port(0).settle(got[4].position)
        await first.close()
        second = await h.open([0])
        committed = await second.port(0).committed()
        if self.keeps_offsets:
            assert committed is not None
            assert (committed.position, dict(committed.ahead)) == (got[4].position, {})
        else:
            assert committed is None
        resume = None if h.keeps_settled else got[4].position
        begun = await second.begin(0, resume, stateful=False)
        again = await second.take(0, 2)
        assert h.idents(again) == sent[4:]
        assert positions(again) == expected(h, second, 0, 4, 2, begun)
        marker = await h.append(0, 1)
        assert h.idents(await second.take(0, 1)) == marker  # nothing before the settle

    async def test_an_unsettled_close_redelivers_everything_to_the_next_owner(
        self, h: PortHarness
    ) -> None:
        sent = await h.append(0, 3)
        first = await h.open([0])
        await first.begin(0, h.position_of(0, 0))
        assert h.idents(await first.take(0, 3)) == sent
        await first.close()
        second = await h.open([0])
        resume = None if h.keeps_settled else h.position_of(0, 0)
        begun = await second.begin(0, resume, stateful=False)
        again = await second.take(0, 3)
        assert h.idents(again) == sent
        assert positions(again) == expected(h, second, 0, 0, 3, begun)

    async def test_settling_is_idempotent_and_a_later_settle_supersedes(
        self, h: PortHarness
    ) -> None:
        sent = await h.append(0, 6)
        first = await h.open([0])
        await first.begin(0, h.position_of(0, 0))
        got = await first.take(0, 6)
        port = first.port(0)
        for at in (2, 2, 5, 5):
            await port.settle(got[at].position)
        await first.close()
        second = await h.open([0])
        await second.begin(0, None if h.keeps_settled else got[5].position, stateful=False)
        assert h.idents(await second.take(0, 1)) == sent[5:]
        marker = await h.append(0, 1)
        assert h.idents(await second.take(0, 1)) == marker

    async def test_rewind_hands_again_from_the_position_in_order(self, h: PortHarness) -> None:
        """As the task rewinds after a failed record: settle what is done, pause, rewind
        to the failed position, resume; the partition comes again from there."""
        sent = await h.append(0, 5)
        m = await h.open([0])
        await m.begin(0, h.position_of(0, 0))
        got = await m.take(0, 5)
        port = m.port(0)
        await port.settle(got[2].position)
        port.pause()
        m.rewind(0, got[2].position)
        port.resume()
        again = await m.take(0, 3)
        assert h.idents(again) == sent[2:]
        assert positions(again) == expected(h, m, 0, 2, 3, got[2].position)
        marker = await h.append(0, 1)
        assert h.idents(await m.take(0, 1)) == marker  # the rest came once

    async def test_end_and_through_after_the_last_delivery(self, h: PortHarness) -> None:
        await h.append(0, 4)
        m = await h.open([0])
        await m.begin(0, h.position_of(0, 0))
        got = await m.take(0, 4)
        after = got[-1].position + 1
        port = m.port(0)
        end = port.end()
        assert (end is not None) == self.knows_end
        if end is not None:
            assert end == after
        assert await port.through(after) == after  # no markers on a plain topic


class FetchingContract:
    """A port whose partition is fetched on its own while the task works."""

    async def test_a_paused_partition_is_handed_nothing_and_resumes_where_it_stopped(
        self, h: PortHarness
    ) -> None:
        await h.append(0, 2)
        await h.append(1, 2)
        m = await h.open([0, 1])
        await m.begin(0, 0)
        await m.begin(1, 0)
        before = await m.take(0, 2)
        await m.take(1, 2)
        m.port(0).pause()
        held = await h.append(0, 3)
        flowing = await h.append(1, 3)
        assert h.idents(await m.take(1, 3)) == flowing  # fetched meanwhile: the other flows
        assert m.untaken(0) == []
        m.port(0).resume()
        after = await m.take(0, 3)
        assert h.idents(after) == held
        assert positions(after) == expected(h, m, 0, 2, 3, before[-1].position + 1)


class SinkContract:
    """Every transport's confirmed publisher (derived events, parks, chain copies)."""

    @pytest.fixture
    def s(self) -> SinkHarness:
        raise NotImplementedError("a transport's subclass provides the sink harness")

    async def test_publish_many_confirms_in_order_each_on_its_key_partition(
        self, s: SinkHarness
    ) -> None:
        """Receipts in the order of the messages, each on its key's partition (the one
        partitioner) or the one chosen; per partition in order; bytes kept exactly."""
        keys = [key_for(0).encode(), key_for(1).encode()]
        messages = [
            s.message(f"v{i}".encode(), key=keys[i % 2], headers=[("h", str(i).encode())])
            for i in range(10)
        ]
        messages.append(s.message(b"chosen", key=keys[0], partition=1))
        receipts = await s.sink.publish_many(messages)
        assert [r.topic for r in receipts] == [s.topic] * len(messages)
        wanted = [partition_for(k, TOPIC_PARTITIONS) for k in keys]
        assert wanted == [0, 1]
        for m, r in zip(messages, receipts, strict=True):
            if r.partition is not None:  # where the broker says (Kafka, memory)
                assert r.partition == (
                    m.partition if m.partition is not None else wanted[0 if m.key == keys[0] else 1]
                )
        got = await s.read()
        by_partition = {p: [g for g in got if g.partition == p] for p in (0, 1)}
        assert [g.value for g in by_partition[0]] == [f"v{i}".encode() for i in range(0, 10, 2)]
        assert [g.value for g in by_partition[1]] == [
            *[f"v{i}".encode() for i in range(1, 10, 2)],
            b"chosen",
        ]
        for g in got:
            if g.value != b"chosen":
                i = int((g.value or b"v0")[1:])
                assert g.key == keys[i % 2]
                assert g.headers.get("h") == str(i).encode()

    async def test_publish_returns_once_the_record_is_in_the_topic(self, s: SinkHarness) -> None:
        await s.sink.publish(s.topic, b"one", key=key_for(1).encode(), headers=[("h", b"1")])
        (got,) = await s.read()  # confirmed: readable at once, no waiting
        assert (got.partition, got.key, got.value) == (1, key_for(1).encode(), b"one")
        assert got.headers.get("h") == b"1"


class TestMemory(PortContract, SinkContract):
    knows_end = True

    @pytest.fixture
    async def s(self) -> AsyncIterator[SinkHarness]:
        harness = MemorySinkHarness()
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()

    @pytest.fixture
    async def h(self) -> AsyncIterator[PortHarness]:
        harness = MemoryPortHarness()
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()


class TestEventStore(PortContract):
    """The event store alone, on SQLite: the feed follows each partition from the
    task's checkpoint (it hands nothing while a chunk is applied: nothing to pause)."""

    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[PortHarness]:
        harness = StorePortHarness(f"sqlite:///{tmp_path}/events.db")
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestEventStorePostgres(TestEventStore):
    @pytest.fixture
    async def h(self, pg_url_factory: PgUrlFactory) -> AsyncIterator[PortHarness]:
        async with pg_url_factory() as url:
            harness = StorePortHarness(url)
            await harness.start()
            try:
                yield harness
            finally:
                await harness.stop()


@pytest.mark.integration
class TestKafka(PortContract, FetchingContract, SinkContract):
    keeps_offsets = True
    knows_end = True

    @pytest.fixture
    async def s(self, kafka_bootstrap: str) -> AsyncIterator[SinkHarness]:
        harness = KafkaSinkHarness(kafka_bootstrap)
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()

    @pytest.fixture
    async def h(self, kafka_bootstrap: str) -> AsyncIterator[PortHarness]:
        harness = KafkaPortHarness(kafka_bootstrap)
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestRabbitMQ(PortContract, FetchingContract, SinkContract):
    @pytest.fixture
    async def s(self, services: Services) -> AsyncIterator[SinkHarness]:
        harness = RabbitSinkHarness(services.amqp)
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()

    @pytest.fixture
    async def h(self, services: Services) -> AsyncIterator[PortHarness]:
        harness = RabbitPortHarness(services.amqp)
        await harness.start()
        try:
            yield harness
        finally:
            await harness.stop()

    async def test_what_a_closed_port_held_comes_back_flagged_redelivered(
        self, h: PortHarness
    ) -> None:
        """RabbitMQ's side of an unsettled close: the broker requeues the unacked
        deliveries, and they come with its redelivered flag."""
        await h.append(0, 3)
        first = await h.open([0])
        await first.begin(0, 0)
        got = await first.take(0, 3)
        await first.port(0).settle(got[2].position)  # the first two done
        await first.close()
        second = await h.open([0])
        await second.begin(0, 0, stateful=False)
        assert h.idents(await second.take(0, 1)) == [got[2].value]
        assert isinstance(second, RabbitMember)
        assert second.ports[0].redelivered == 1
