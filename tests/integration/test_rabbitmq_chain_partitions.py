"""A one-queue dead-letter topic on real RabbitMQ: ``topics create`` keeps it as it is
(nothing missing) instead of declaring queue 1 again. That such a topic takes the
copies of every partition, and a one-queue parking topic the parks, is in the contract
suite (``tests/contract/test_chain_contract.py``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import aio_pika
import pytest

from streamapp import Event, Park, Retry
from streamapp.transports.rabbitmq.topology import create_topology
from tests.conftest import Services

from .test_rabbitmq_retry_chain import depth, new_app

pytestmark = pytest.mark.integration


async def test_topics_create_keeps_one_queue_dead_letter_and_parking_topics(
    services: Services, tmp_path: Path
) -> None:
    amqp = services.amqp
    ns = f"rdq1{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp)
    topic = app.topic(f"{ns}in", partitions=2)

    @app.agent(topic, on_failure=Retry(intervals=(0.05,), max_reconsume=1, backoff=(0.2,)))
    async def picky(event: Event) -> None:
        pass

    @app.agent(app.topic(f"{ns}other", partitions=2), on_failure=Park(f"{ns}parked"))
    async def parker(event: Event) -> None:
        pass

    settings = app.settings()
    await create_topology(app, settings)
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        await channel.queue_delete(f"{ns}in-dlq.1")  # the dead-letter topic has one queue
        await channel.queue_delete(f"{ns}parked.1")  # and so has the parking topic
    finally:
        await connection.close()
    assert await create_topology(app, settings) == []  # kept as they are: nothing missing
    assert await depth(amqp, f"{ns}in-dlq.0") == 0
    assert await depth(amqp, f"{ns}parked.0") == 0
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        for gone in (f"{ns}in-dlq.1", f"{ns}parked.1"):
            with pytest.raises(aio_pika.exceptions.ChannelClosed):
                await channel.declare_queue(gone, passive=True)
            channel = await connection.channel()
    finally:
        await connection.close()
