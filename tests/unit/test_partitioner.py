"""A topic names its producers' partitioner (``app.topic(..., partitioner=...)``): the
table write check, view routing and sends place its keys by it, and a key that came on
another partition than the topic's partitioner gives is an error that names both
partitions, the partitioner and the setting (:mod:`streamapp.topics`). That
librdkafka's producer picks the partition ``crc32`` gives is checked against a real
confluent-kafka producer in ``tests/integration/test_librdkafka_partitioner.py``."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from streamapp import App, Event, FromEventStore, Outcome, Park, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.catchup.feed import StoreFeed
from streamapp.errors import ConfigError, ForeignKeyError
from streamapp.eventstore import Append, open_store
from streamapp.tables.partition import PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.testing import MemoryBroker
from streamapp.topics import Partitioner, TopicSpec, partition_for
from tests.support.doubles import MemoryPort
from tests.support.tasks import feed_factory, until_live

KEYS = [f"acct-{i}" for i in range(400)]


def _where(key: str, partitions: int) -> tuple[int, int]:
    """``key``'s partition by murmur2 and by crc32."""
    raw = key.encode()
    return partition_for(raw, partitions), partition_for(raw, partitions, Partitioner.CRC32)


def test_crc32_is_the_unsigned_crc_of_the_key_modulo_the_partition_count() -> None:
    # CRC-32's check value: 0xCBF43926, above 2**31 (a signed CRC would give another
    # partition)
    assert partition_for(b"123456789", 1000, Partitioner.CRC32) == 0xCBF43926 % 1000 == 262
    for key in KEYS:
        assert partition_for(key.encode(), 12, Partitioner.CRC32) == zlib.crc32(key.encode()) % 12
    assert TopicSpec("t", 12, partitioner=Partitioner.CRC32).partition_of(b"acct-7") == (
        zlib.crc32(b"acct-7") % 12
    )
    assert TopicSpec("t", 12).partition_of(b"acct-7") == partition_for(b"acct-7", 12)


def test_a_topic_names_one_of_the_partitioners_or_is_refused() -> None:
    app = App("t")
    assert app.topic("a").partitioner is Partitioner.MURMUR2
    assert app.topic("b", partitioner="crc32").partitioner is Partitioner.CRC32
    with pytest.raises(ValueError, match=r"topic 'c': partitioner='consistent_random' is not "
                       r"one of 'murmur2', 'crc32'"):  # fmt: skip
        app.topic("c", partitioner="consistent_random")
    with pytest.raises(ConfigError, match=r"'b' declared twice .* partitioner='crc32'"):
        app.topic("b")


def test_a_table_read_across_topics_of_other_partitioners_is_refused() -> None:
    app = App("t")
    mine, theirs = app.topic("mine", partitioner="crc32"), app.topic("theirs")
    totals: Table[int] = Table("totals")

    @app.agent(theirs, tables=[totals])
    async def count(event: Event, view: TableView[int]) -> None: ...

    with pytest.raises(ConfigError, match=r"partitioner='crc32'.*partitioner='murmur2'"):

        @app.agent(mine, reads=[totals])
        async def peek(event: Event, view: object) -> None: ...


def test_a_crc32_table_takes_the_keys_crc32_puts_on_its_partition() -> None:
    key = next(k for k in KEYS if len(set(_where(k, 8))) == 2)
    murmur, crc = _where(key, 8)
    table = Table("balances")
    tables = PartitionTables(
        [table], MemoryStore(spaces_for([table])), crc, TopicSpec("p", 8, partitioner="crc32")
    )
    tables.views[0][key] = 1
    assert tables.views[0].get(key) == 1
    murmur_tables = PartitionTables(
        [table], MemoryStore(spaces_for([table])), crc, TopicSpec("p", 8)
    )
    with pytest.raises(ForeignKeyError, match=f"belongs to partition {murmur}, but"):
        murmur_tables.views[0][key] = 1


def _app(partitioner: str) -> App:
    app = App("pay")
    payments = app.topic("payments", partitions=8, format="json", partitioner=partitioner)
    balances: Table[int] = Table("balances")

    @app.agent(payments, tables=[balances], on_failure=Park("payments-parked"))
    async def project(event: Event, view: TableView[int]) -> None:
        account = event.stream_id
        assert account is not None
        view[account] = view.get(account, 0) + event.data["amount"]

    return app


async def test_keys_a_librdkafka_producer_placed_are_projected_on_a_crc32_topic() -> None:
    broker = MemoryBroker(_app("crc32"))
    for key in KEYS:  # where librdkafka's default partitioner puts them
        _, crc = _where(key, 8)
        broker.send_raw("payments", b'{"amount": 2}', key=key.encode(), partition=crc)
    counts = await broker.process()
    assert counts[Outcome.DELIVERED] == len(KEYS)
    assert broker.records("payments-parked") == []
    assert all(broker.table("balances")[k] == 2 for k in KEYS)


async def test_a_key_on_another_partition_than_its_partitioner_says_names_the_setting() -> None:
    broker = MemoryBroker(_app("murmur2"))  # its producer is librdkafka's: crc32
    key = next(k for k in KEYS if len(set(_where(k, 8))) == 2)
    murmur, crc = _where(key, 8)
    broker.send_raw("payments", b'{"amount": 2}', key=key.encode(), partition=crc)
    await broker.process()
    (parked,) = broker.records("payments-parked")
    reason = dict(parked.headers)["streamapp-park-reason"].decode()
    assert reason.startswith(
        f"ForeignKeyError: table 'balances': key {key!r} belongs to partition {murmur}, but "
        f"this event is handled in partition {crc}. Topic 'payments' places keys by the "
        "partitioner 'murmur2' (setting app.topic('payments', ..., partitioner='murmur2')). "
        f"The 'crc32' partitioner puts this key on partition {crc}: if the key is the "
        "event's stream id, the topic's producers place keys by 'crc32'"
    ), reason
    assert "app.topic('payments', ..., partitioner='crc32'), restart the workers" in reason


async def test_a_key_no_partitioner_puts_there_keeps_the_stream_id_advice() -> None:
    broker = MemoryBroker(_app("crc32"))
    key = next(k for k in KEYS if 5 not in _where(k, 8))
    broker.send_raw("payments", b'{"amount": 2}', key=key.encode(), partition=5)
    await broker.process()
    (parked,) = broker.records("payments-parked")
    reason = dict(parked.headers)["streamapp-park-reason"].decode()
    assert "partitioner 'crc32' (setting app.topic('payments', ..., partitioner='crc32'))" in reason
    assert "'murmur2' partitioner puts" not in reason
    assert reason.endswith("re-key the source with group_by= so that the key is the stream id).")


async def test_a_send_to_a_crc32_topic_goes_to_the_keys_crc32_partition() -> None:
    app = App("fan")
    source = app.topic("in", partitions=1)
    out = app.topic("out", partitions=8, format="json", partitioner="crc32")

    @app.agent(source, sinks=[out])
    async def fan(event: Event, *, send: object) -> None:
        for key in KEYS[:50]:
            send(out, Event.create("t", stream_id=key, data={}))  # type: ignore[operator]

    broker = MemoryBroker(app)
    broker.send(source.name, Event.create("go", stream_id="s"))
    await broker.process()
    placed = {(r.key or b"").decode(): r.partition for r in broker.records("out")}
    assert placed == {k: _where(k, 8)[1] for k in KEYS[:50]}
    for key in KEYS[50:100]:  # a record sent as the topic's producers would: by crc32
        assert broker.send_raw("out", b"{}", key=key.encode()).partition == _where(key, 8)[1]


async def test_the_event_store_replay_hands_each_partition_the_streams_crc32_puts_there(
    tmp_path: Path,
) -> None:
    """A crc32 topic's catch-up: each partition replays exactly the streams its live
    records will carry (a murmur2 split would hand it streams whose writes its own key
    check refuses, and the replay would stick there)."""
    topic = TopicSpec("payments", 3, partitioner=Partitioner.CRC32)
    streams = [f"s{i}" for i in range(30)]
    table: Table[int] = Table("count")

    async def handler(event: Event, view: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + 1

    agent = Agent("a", handler, topic, (table,), history=FromEventStore())
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    appends = [Append(s, [Event.create("x", stream_id=s, id=f"{s}-{n}")]) for n in range(3)
               for s in streams]  # fmt: skip
    await store.append_many(appends)
    feed = StoreFeed(store, chunk=25, poll_s=0.01)
    tasks = [
        feed_factory(feed).create(
            agent,
            p,
            MemoryPort(),
            name=f"payments[{p}]",
            open_store=lambda agent, spaces: MemoryStore(spaces_for([table])),
        )
        for p in range(3)
    ]
    feed.start()
    for task in tasks:
        task.start()
    try:
        await until_live(tasks)
        for task in tasks:
            assert task.tables is not None
            mine = {s for s in streams if topic.partition_of(s.encode()) == task.partition}
            assert dict(task.tables.views[0].items()) == dict.fromkeys(mine, 3)
    finally:
        for task in tasks:
            await task.close()
        await feed.stop()
        await store.close()
