"""A channel close cut short never breaks the connection, on real RabbitMQ.

aiormq answers a cancelled ``Channel.Close`` (a ``wait_for`` around ``close()`` that
expires between the close and the broker's ``CloseOk``) with a second ``Channel.Close``;
the broker, whose channel is closed by then, fails the whole connection
(``CHANNEL_ERROR - expected 'channel.open'``), dropping every other channel on it: a
worker's partitions, its members channel, its sink. CI met it under load as a worker's
connection lost mid-rebalance. :func:`streamapp.transports.rabbitmq.connection.close_channel`
never cancels the close. Checked: the same sweep with ``asyncio.wait_for(channel.close(),
timeout)`` breaks some of the connections (2 of 39 on an idle machine)."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from streamapp.transports.rabbitmq.connection import close_channel
from tests.conftest import Services

pytestmark = pytest.mark.integration


async def test_a_close_past_its_wait_leaves_the_connection_and_its_other_channels_open(
    services: Services,
) -> None:
    broken, late = [], 0
    for k in range(1, 61):  # waits from 0.15 ms to 9 ms: some end mid-handshake
        wait_s = 0.00015 * k
        connection = await aio_pika.connect(services.amqp)
        try:
            other = await connection.channel()
            channel = await connection.channel()
            await channel.declare_queue("", exclusive=True)
            late += not await close_channel(channel, wait_s)
            await asyncio.sleep(0.05)  # the broker's answer to whatever was sent
            if connection.is_closed or other.is_closed:
                broken.append(wait_s)
            else:
                await other.declare_queue("", exclusive=True)  # still usable
        finally:
            if not connection.is_closed:
                await connection.close()
    assert not broken, f"connections broken by a close cut short at waits {broken}"
    assert late > 0, "no close outlived its wait: the sweep tested nothing"
