"""A partition whose queue the broker gives to another consumer is stalled, not live.

On the session's RabbitMQ: another connection consumes the partition queue first (the
queue's single active consumer), takes one message and never acks, as a worker cut off
from the broker looks until its AMQP heartbeat expires. The worker that owns the
partition gets nothing while messages wait: ``/status`` says ``stalled``, the metric
counts it, the log says why once. Once that connection closes, the broker hands the
queue over: the partition is live again and every event applied once, in order.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from streamapp.transports.rabbitmq.source import RabbitSource
from streamapp.transports.rabbitmq.stalled import STALLED_AFTER_S
from streamapp.transports.rabbitmq.topology import create_topology, queue_name
from tests.conftest import Services
from tests.contract.rabbit_harness import RabbitHarness
from tests.contract.test_agent_contract import ev, log_app, logged
from tests.support.waits import frozen, until

pytestmark = pytest.mark.integration


async def test_a_queue_held_by_another_consumer_is_stalled_then_handed_over(
    services: Services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = RabbitHarness(services.amqp, tmp_path)
    app = log_app(h, partitions=1)
    await create_topology(app, app.settings())
    queue = queue_name(h.name("in"), 0)
    other = await aio_pika.connect(services.amqp)
    taken: list[aio_pika.abc.AbstractIncomingMessage] = []
    try:
        channel = await other.channel()
        await channel.set_qos(prefetch_count=1)
        held = await channel.declare_queue(queue, passive=True)

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            taken.append(message)  # never acked: the broker sends it nothing more

        await held.consume(hold)  # the first consumer: the active one
        with caplog.at_level(logging.WARNING, logger="streamapp.partition"):
            await h.start(app)
            names = [f"a{v}" for v in range(1, 21)]
            for v, name in enumerate(names, 1):
                await h.send(ev("a", name, version=v))
            assert h.worker is not None
            source = h.worker.source
            assert isinstance(source, RabbitSource)
            name = f"{h.name('in')}[0]"
            seen: dict[str, Any] = {}

            async def stalled() -> bool:
                seen.update(source.assignment.status()[name])
                return seen["phase"] == "stalled"

            await until(stalled, what=f"{name} stalled", stalled_s=STALLED_AFTER_S * 6)
        assert len(taken) == 1, taken
        assert seen["stalled_s"] >= STALLED_AFTER_S - 1, seen
        assert "1 other consumer(s)" in "".join(
            r.getMessage() for r in caplog.records if "no delivery for" in r.getMessage()
        )
        assert source.assignment.stalled_count() == 1
        assert "streamapp_stalled_partitions 1.0" in h.worker.metrics.render().decode()
        warned = [
            r.getMessage()
            for r in caplog.records
            if "the broker gives the queue to another consumer" in r.getMessage()
        ]
        assert len(warned) == 1, warned
        assert queue in warned[0]
        assert "amqp_heartbeat_s" in warned[0]

        await other.close()  # what it held goes back; the broker hands the queue over
        table: dict[str, Any] = {}

        async def applied() -> bool:
            table["a"] = await h.table("log", "a")
            return table["a"] == logged(*names)

        await until(applied, what="every event applied", progress=lambda: frozen(table))
        await until(
            lambda: source.assignment.status()[name]["phase"] == "live", what=f"{name} live"
        )
        assert source.assignment.stalled_count() == 0
        assert "streamapp_stalled_partitions 0.0" in h.worker.metrics.render().decode()
    finally:
        await h.stop()
        await other.close()


async def test_the_amqp_heartbeat_is_the_setting(services: Services, tmp_path: Path) -> None:
    """The worker's connection proposes ``amqp_heartbeat_s`` (the client's default is 60 s,
    which would let the broker keep a dead worker's queues for a minute)."""
    h = RabbitHarness(services.amqp, tmp_path)
    app = log_app(h, partitions=1, amqp_heartbeat_s=3)
    try:
        await h.start(app)
        assert h.worker is not None
        source = h.worker.source
        assert isinstance(source, RabbitSource)
        await until(
            lambda: any(p.channel is not None for p in source.ports.values()),
            what="the partition consumed",
        )
        (port,) = source.ports.values()
        assert port.channel is not None
        underlay = await port.channel.get_underlay_channel()
        assert underlay.connection.heartbeat_timeout == 3
    finally:
        await h.stop()
