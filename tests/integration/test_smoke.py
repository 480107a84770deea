"""Smoke round trips on the real services started by scripts/services (or given by env)."""

from __future__ import annotations

import uuid

import aio_pika
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.support.waits import until

pytestmark = pytest.mark.integration


async def test_kafka_round_trip_with_acks_all_and_idempotence(kafka_bootstrap: str) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 3, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        sent = [await producer.send_and_wait(topic, f"v{i}".encode(), key=b"k") for i in range(5)]
    finally:
        await producer.stop()
    assert [m.offset for m in sent] == [0, 1, 2, 3, 4]  # one key: one partition, in order
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        got: list[bytes] = []

        async def five() -> bool:
            batch = await consumer.getmany(timeout_ms=500)
            got.extend(r.value for recs in batch.values() for r in recs if r.value)
            return len(got) >= 5

        await until(five, what=f"5 records read from {topic}", progress=lambda: len(got), poll_s=0)
    finally:
        await consumer.stop()
    assert got == [f"v{i}".encode() for i in range(5)]


async def test_rabbitmq_publisher_confirms_and_manual_ack(services) -> None:  # type: ignore[no-untyped-def]
    queue_name = f"smoke-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect_robust(services.amqp, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        queue = await channel.declare_queue(queue_name, durable=True, auto_delete=False)
        confirm = await channel.default_exchange.publish(
            aio_pika.Message(
                b"hello",
                message_id=uuid.uuid4().hex,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=queue_name,
            mandatory=True,
            timeout=10,
        )
        assert confirm is not None  # a Basic.Ack from the broker
        with pytest.raises(aio_pika.exceptions.DeliveryError):  # unroutable is not success
            await channel.default_exchange.publish(
                aio_pika.Message(b"lost", message_id=uuid.uuid4().hex),
                routing_key=f"{queue_name}-nobody",
                mandatory=True,
                timeout=10,
            )
        await channel.set_qos(prefetch_count=1)
        message = await queue.get(timeout=10, no_ack=False)
        assert message.body == b"hello"
        await message.ack()
        assert await queue.get(fail=False, timeout=5) is None  # acked: gone
        await queue.delete(if_unused=False, if_empty=False)


async def test_postgres_connection(services) -> None:  # type: ignore[no-untyped-def]
    async with await psycopg.AsyncConnection.connect(services.postgres, connect_timeout=10) as conn:
        cur = await conn.execute("select current_database(), 40 + 2")
        assert await cur.fetchone() == ("streamapp", 42)
