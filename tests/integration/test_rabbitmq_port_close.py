"""A partition port closed while it requeues never breaks its connection (real RabbitMQ).

The broker frees a channel at its ``Channel.Close``; any frame after it on that channel
(a ``basic.nack`` spawned while the close was under way, say) is a connection error,
``CHANNEL_ERROR - expected 'channel.open'``, which drops every other partition's channel
of the worker's connection (seen in the version-deploy acceptance run: one partition's
revoke cost its worker every channel, its members' beats and its partitions).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import aio_pika
import pytest

from streamapp.records import DeliveryRecord
from streamapp.transports.rabbitmq.port import RabbitPartitionPort
from tests.conftest import Services
from tests.support.waits import until

pytestmark = pytest.mark.integration

MESSAGES = 200
ROUNDS = 5


@pytest.fixture
async def connection(services: Services) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    conn = await aio_pika.connect(services.amqp)  # not robust: a connection error ends it
    try:
        yield conn
    finally:
        await conn.close()


async def _queue_of(connection: aio_pika.abc.AbstractConnection) -> str:
    name = f"port-close-{uuid.uuid4().hex[:8]}"
    channel = await connection.channel(publisher_confirms=True)
    try:
        queue = await channel.declare_queue(name, auto_delete=False)
        for i in range(MESSAGES):
            body = f'{{"i": {i}}}'.encode()
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=f"m{i}", headers={"cloudEvents_id": f"m{i}"}),
                routing_key=queue.name,
            )
    finally:
        await channel.close()
    return name


def _taker(got: list[DeliveryRecord]) -> Callable[[list[DeliveryRecord]], bool]:
    def take(records: list[DeliveryRecord]) -> bool:
        got.extend(records)
        return True

    return take


async def _in_hand(got: list[DeliveryRecord], n: int) -> None:
    def enough() -> bool:
        return len(got) >= n

    await until(enough, what=f"{n} deliveries in hand", progress=got.__len__)


async def _alive(connection: aio_pika.abc.AbstractConnection, queue: str) -> bool:
    """One round trip on the connection: the broker answers frames in order, so a
    connection error caused by a frame written before this one has arrived by then."""
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, passive=True)
        await channel.close()
    except Exception:
        return False
    return not connection.is_closed


async def test_a_port_closed_while_requeueing_keeps_the_connection(
    connection: aio_pika.abc.AbstractConnection,
) -> None:
    """Each round: deliveries in hand, a rewind that leaves the ones below it unsettled
    (they come back first, each requeued alone while the port waits for the rewound
    head: a stream of ``basic.nack``), then the close in the middle of that stream."""
    for round_ in range(ROUNDS):
        queue = await _queue_of(connection)
        got: list[DeliveryRecord] = []
        failed: list[BaseException] = []
        port = RabbitPartitionPort(
            connection,  # type: ignore[arg-type]  # a plain connection: typed alike
            "port-close",
            0,
            queue,
            prefetch=100,
            requeue_interval_s=0.0,
            feed=_taker(got),
            fail=failed.append,
        )
        await port.begin(0, stateful=False)
        port.resume()
        await _in_hand(got, 100)
        port.rewind(50)
        port.resume()  # requeued now (interval 0); 0..49 come back first, requeued one by one
        start = port.redelivered
        for _ in range(100_000):  # bounded; each turn lets the loop read a frame
            if port.redelivered >= start + 3:
                break  # the burst of single requeues has begun: close in its middle
            await asyncio.sleep(0)
        assert port.redelivered >= start + 3, "the requeued deliveries did not come back"
        await port.close()
        assert not failed, failed
        assert await _alive(connection, queue), f"round {round_}: the close broke the connection"
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await channel.close()
