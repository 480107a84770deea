"""A plain JSON topic written by a confluent-kafka producer with its defaults, on real
Kafka: librdkafka's default partitioner (``consistent_random``: CRC-32 of the key) puts
most keys on another partition than Kafka's murmur2. Declared
``app.topic(..., partitioner="crc32")``, every record is projected and every key's view
answers through its owner; left at murmur2, each misplaced record is parked with an
error naming both partitions and the setting (``tests/apps/plain_app.py``). streamapp's
own sinks (Kafka, RabbitMQ) place a keyed message to a crc32 topic by crc32 too."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import orjson
import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from streamapp import App, Event, Send
from streamapp.records import Message
from streamapp.topics import Partitioner, TopicSpec, partition_for
from streamapp.transports.kafka.sink import KafkaSink
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.topology import create_topology
from tests.conftest import Services
from tests.support.waits import until_sync

from .harness import (
    WorkerProc,
    create_topics,
    read_table,
    read_topic,
    wait_caught_up,
    wait_group_ready,
)

pytestmark = [pytest.mark.integration]

APP = "tests.apps.plain_app:app"
PARTITIONS = 4
"""``payments``' partition count in the app."""

Records = list[tuple[bytes, bytes]]


def _produce(bootstrap: str, topic: str, records: Records) -> dict[bytes, int]:
    """Produce with confluent-kafka's ``Producer`` as a user would, its defaults untouched
    (so librdkafka's ``consistent_random`` partitioner); each key's partition as its
    delivery report gave it."""
    producer = Producer({"bootstrap.servers": bootstrap})
    placed: dict[bytes, int] = {}
    failed: list[KafkaError] = []

    def report(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is not None:
            failed.append(err)
            return
        key = msg.key()
        assert isinstance(key, bytes)
        assert placed.setdefault(key, msg.partition()) == msg.partition()  # one place a key

    for key, value in records:
        producer.produce(topic, value, key=key, on_delivery=report)
        producer.poll(0)
    until_sync(  # librdkafka delivers in the background: its reports are the progress
        lambda: producer.flush(1) == 0,
        what=f"{len(records)} records delivered to {topic}",
        progress=lambda: (len(placed), len(failed)),
        poll_s=0,
    )
    assert not failed, failed[:3]
    return placed


def _payments(n_accounts: int, per_account: int) -> tuple[Records, dict[str, Any]]:
    """JSON payment records keyed by account, and each account's expected balance row."""
    rng = random.Random(11)
    records, expected = [], {}
    for n in range(1, per_account + 1):
        for i in range(n_accounts):
            account = f"acct-{i}"
            row = expected.setdefault(account, {"total": 0, "count": 0, "last": 0})
            amount = rng.randrange(1, 100)
            row.update(total=row["total"] + amount, count=n, last=n)
            value = {"account": account, "amount": amount, "n": n}
            records.append((account.encode(), orjson.dumps(value)))
    return records, expected


def _namespace(bootstrap: str) -> str:
    """A fresh namespace with the plain app's topics made."""
    ns = f"crc{uuid.uuid4().hex[:6]}-"
    create_topics(bootstrap, ns, APP)
    return ns


async def _feed(
    bootstrap: str, ns: str, workers: list[WorkerProc], records: Records
) -> dict[bytes, int]:
    """The workers ready on ``payments``, ``records`` produced as a default confluent
    producer places them, the group caught up on them: each key's partition."""
    await wait_group_ready(workers, PARTITIONS)
    placed = await asyncio.to_thread(_produce, bootstrap, f"{ns}payments", records)
    await wait_caught_up(bootstrap, f"{ns}plain", f"{ns}payments", 120, workers)
    return placed


async def test_crc32_is_the_partition_librdkafkas_default_producer_picks(
    kafka_bootstrap: str,
) -> None:
    topic, partitions = f"crc{uuid.uuid4().hex[:6]}", 7
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    rng = random.Random(3)
    keys = [f"acct-{i}".encode() for i in range(1000)]
    keys += [str(uuid.UUID(int=rng.getrandbits(128))).encode() for _ in range(500)]
    keys += [rng.randbytes(n) for n in range(1, 65) for _ in range(4)]  # every tail length
    keys += ["Zürich-€-𝄞".encode(), b"\x00", b"\xff" * 3, b"k" * 2000]
    keys = list(dict.fromkeys(keys))
    try:
        placed = await asyncio.to_thread(
            _produce, kafka_bootstrap, topic, [(k, b"{}") for k in keys]
        )
    finally:
        admin.delete_topics([topic])[topic].result(30)
    assert len(placed) == len(keys)
    wrong = {k: (p, partition_for(k, partitions, Partitioner.CRC32)) for k, p in placed.items()
             if p != partition_for(k, partitions, Partitioner.CRC32)}  # fmt: skip
    assert not wrong, f"{len(wrong)} keys elsewhere than crc32 says: {list(wrong.items())[:3]}"
    elsewhere = sum(p != partition_for(k, partitions) for k, p in placed.items())
    assert elsewhere > len(keys) // 2  # murmur2 would place most of them wrong


async def test_a_crc32_topic_from_a_default_confluent_producer_parks_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = _namespace(kafka_bootstrap)
    records, expected = _payments(n_accounts=100, per_account=2)
    env = {"PLAIN_PARTITIONER": "crc32"}
    workers = [
        WorkerProc(
            kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log", APP, extra_env=dict(env)
        ).start()
        for n in ("a", "b")
    ]
    try:
        placed = await _feed(kafka_bootstrap, ns, workers, records)
        moved = [k for k, p in placed.items() if p != partition_for(k, PARTITIONS)]
        assert len(moved) > len(placed) // 2  # murmur2 would have parked these
        assert await read_topic(kafka_bootstrap, f"{ns}payments-parked") == []
        table = await read_table(workers, "balances", list(expected))  # one owner answers
        wrong = {a: (table.get(a), row) for a, row in expected.items() if table.get(a) != row}
        assert not wrong, f"{len(wrong)} accounts wrong, e.g. {list(wrong.items())[:3]}"
    finally:
        for w in workers:
            if w.alive:
                assert w.stop() == 0


async def test_a_murmur2_topic_from_a_default_confluent_producer_names_the_setting(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = _namespace(kafka_bootstrap)
    records, _ = _payments(n_accounts=50, per_account=1)
    worker = WorkerProc(kafka_bootstrap, ns, tmp_path / "w", tmp_path / "w.log", APP).start()
    try:
        placed = await _feed(kafka_bootstrap, ns, [worker], records)
        parked = await read_topic(kafka_bootstrap, f"{ns}payments-parked")
    finally:
        assert worker.stop() == 0
    moved = {k: p for k, p in placed.items() if p != partition_for(k, PARTITIONS)}
    assert moved
    assert sorted(r.key for r in parked) == sorted(moved)
    for record in parked:
        key, reason = record.key.decode(), dict(record.headers)["streamapp-park-reason"].decode()
        assert reason.startswith(
            f"ForeignKeyError: table 'balances': key {key!r} belongs to partition "
            f"{partition_for(record.key, PARTITIONS)}, but this event is handled in partition "
            f"{moved[record.key]}. Topic '{ns}payments' places keys by the partitioner "
            f"'murmur2' (setting app.topic('{ns}payments', ..., partitioner='murmur2')). The "
            f"'crc32' partitioner puts this key on partition {moved[record.key]}"
        ), reason
        assert f"app.topic('{ns}payments', ..., partitioner='crc32')" in reason


KEYS = [f"acct-{i}".encode() for i in range(200)]


async def test_the_kafka_sink_places_a_crc32_topics_keys_as_librdkafka_does(
    kafka_bootstrap: str,
) -> None:
    topic = f"crc{uuid.uuid4().hex[:6]}-out"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 5, 1)])[topic].result(30)
    sink = KafkaSink(kafka_bootstrap, topics={topic: TopicSpec(topic, 5, partitioner="crc32")})
    await sink.start()
    try:  # no partition given: what the relay, a retry copy and a parked replay send
        receipts = await sink.publish_many([Message(topic, b"{}", key) for key in KEYS])
    finally:
        await sink.stop()
        admin.delete_topics([topic])[topic].result(30)
    assert [r.partition for r in receipts] == [partition_for(k, 5, Partitioner.CRC32) for k in KEYS]


async def test_the_rabbitmq_sink_routes_a_crc32_topics_keys_by_crc32(services: Services) -> None:
    ns = f"crc{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", broker="rabbitmq", amqp_url=services.amqp)
    topic = app.topic(f"{ns}out", partitions=5, partitioner="crc32")

    @app.agent(app.topic(f"{ns}in", partitions=1), sinks=[topic])
    async def fan(event: Event, *, send: Send) -> None: ...

    settings = app.settings()
    await create_topology(app, settings)
    sink = RabbitSink(settings, {topic.name: 5}, topics=app.topics)
    await sink.start()
    try:
        receipts = await sink.publish_many([Message(topic.name, b"{}", key) for key in KEYS])
    finally:
        await sink.stop()
    assert [r.partition for r in receipts] == [partition_for(k, 5, Partitioner.CRC32) for k in KEYS]
