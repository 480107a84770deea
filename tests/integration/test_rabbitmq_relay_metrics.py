"""The RabbitMQ relay's gauges on the real broker: with ``amqp_prefetch=1`` the relay
holds one copy (unacked, waiting for its back-off) and a second waits ready in the retry
queue; ``streamapp_relay_held_copies`` shows 1 and ``streamapp_relay_lag`` of that
partition 2 (held + ready, probed once a second), and ``/status`` ``relays`` the same."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest

from streamapp import Event, Retry
from streamapp.topics import partition_for
from streamapp.transports.rabbitmq.topology import create_topology
from streamapp.worker import Worker

from .test_rabbitmq_retry_chain import amqp, depth, new_app, send, until

__all__ = ["amqp"]  # the fixture

pytestmark = pytest.mark.integration


async def test_rabbitmq_relay_shows_held_copies_and_retry_queue_lag(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rlm{uuid.uuid4().hex[:6]}-"
    app = new_app(ns, tmp_path, amqp, amqp_prefetch=1)
    topic = app.topic(f"{ns}in", partitions=2)

    @app.agent(topic, on_failure=Retry(intervals=(0.05,), backoff=(60,)))
    async def failing(event: Event) -> None:
        raise RuntimeError("down")

    settings = app.settings()
    await create_topology(app, settings)
    q = partition_for(b"s", 2)
    lag = f'streamapp_relay_lag{{partition="{q}",topic="{ns}in-retry"}}'
    worker = Worker(app, settings)
    await worker.start()
    try:
        events = [Event.create("x", stream_id="s", data={}, id=f"e{i}") for i in range(2)]
        await send(app, topic.name, events)

        async def one_held_one_ready() -> bool:
            text = worker.metrics.render().decode()
            return 'streamapp_relay_held_copies{relay="rabbitmq"} 1.0' in text and (
                f"{lag} 2.0" in text
            )

        await until(one_held_one_ready, "held 1, lag 2")
        assert await depth(amqp, f"{ns}in-retry.{q}") == 1  # the ready one
        url = f"http://127.0.0.1:{worker.web_port}/status"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            status = await response.json()
        (relay,) = status["relays"]
        assert relay["kind"] == "rabbitmq"
        assert relay["held_copies"] == 1
        assert relay["lag"] == {f"{ns}in-retry/{q}": 2, f"{ns}in-retry/{1 - q}": 0}
        assert status["retry_hops"] == {"failing": {"retried": {"1": 2}}}
    finally:
        await worker.stop()
