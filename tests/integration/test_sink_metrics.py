"""Operators' metrics of the sinks, on the real brokers: each publish the broker does not
confirm moves ``streamapp_publish_failures_total{sink, destination, outcome}`` (and the
worker's ``/status`` ``sinks`` section) by exactly the messages that failed: a RabbitMQ
return (mandatory publish to an exchange with no binding), a nack (``x-max-length=0``,
``reject-publish``), a confirm that never comes (an AMQP proxy drops it), and on Kafka a
topic that does not exist (auto-create off) and a record the broker refuses."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import aio_pika
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.errors import PublishError
from streamapp.records import Message
from streamapp.settings.settings import Settings
from streamapp.transports.kafka.sink import KafkaSink
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.topology import QUEUE_ARGUMENTS
from streamapp.web.metrics import WorkerMetrics
from tests.conftest import Services

from .harness import Proxy

pytestmark = pytest.mark.integration


def _failures(metrics: WorkerMetrics, sink: str, destination: str) -> dict[str, float]:
    """The counter's value per outcome for one destination, as scraped."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name != "streamapp_publish_failures":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels["destination"] == destination:
                assert labels["sink"] == sink
                out[labels["outcome"]] = sample.value
    return out


def _settings(amqp: str) -> Settings:
    return Settings(app_id="sinkmetrics", broker="rabbitmq", amqp_url=amqp)


async def _topic(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs=config)])
    finally:
        await admin.close()


async def test_rabbitmq_returned_and_nacked_publishes_are_counted(services: Services) -> None:
    ns = f"smr{uuid.uuid4().hex[:6]}"
    unbound, full = f"{ns}-unbound", f"{ns}-full"
    connection = await aio_pika.connect(services.amqp)
    metrics = WorkerMetrics()
    try:
        channel = await connection.channel()
        for name in (unbound, full):
            await channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT, auto_delete=True)
        arguments = {**QUEUE_ARGUMENTS, "x-max-length": 0, "x-overflow": "reject-publish"}
        queue = await channel.declare_queue(f"{full}.0", arguments=arguments, auto_delete=True)
        await queue.bind(full, routing_key="0")
        settings = _settings(services.amqp)
        sink = RabbitSink(settings, {unbound: 1, full: 1}, timeout_s=5, metrics=metrics)
        await sink.start()
        try:
            for _ in range(2):
                with pytest.raises(PublishError, match="returned unroutable"):
                    await sink.publish(unbound, b"x", key=b"k")
            with pytest.raises(PublishError, match="nacked by the broker"):
                await sink.publish(full, b"x", key=b"k")
        finally:
            await sink.stop()
        assert _failures(metrics, "rabbitmq", unbound) == {"returned": 2.0}
        assert _failures(metrics, "rabbitmq", full) == {"nacked": 1.0}
        assert metrics.operations()["sinks"] == {
            "rabbitmq": {full: {"nacked": 1}, unbound: {"returned": 2}}
        }
    finally:
        await connection.close()


@pytest.mark.slow
async def test_a_rabbitmq_confirm_that_never_comes_is_counted_timed_out(
    services: Services,
) -> None:
    parts = urlsplit(services.amqp)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5672, amqp=True)
    port = await proxy.start()
    ns = f"smt{uuid.uuid4().hex[:6]}"
    exchange = f"{ns}-out"
    connection = await aio_pika.connect(services.amqp)
    metrics = WorkerMetrics()
    try:
        channel = await connection.channel()
        await channel.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT, auto_delete=True)
        queue = await channel.declare_queue(f"{exchange}.0", auto_delete=True)
        await queue.bind(exchange, routing_key="0")
        settings = _settings(f"amqp://guest:guest@127.0.0.1:{port}/")
        sink = RabbitSink(settings, {exchange: 1}, timeout_s=1.0, metrics=metrics)
        proxy.confirms_held.add(proxy.accepted)  # the sink's connection, the next one
        await sink.start()
        try:
            with pytest.raises(PublishError, match="publish_timeout_s"):
                await sink.publish(exchange, b"x", key=b"k")
            messages = [Message(exchange, b"y", b"k") for _ in range(3)]
            with pytest.raises(PublishError, match="3 not confirmed"):
                await sink.publish_many(messages)
        finally:
            await sink.stop()
        assert proxy.confirms_dropped >= 1  # acks may be merged (multiple)
        assert _failures(metrics, "rabbitmq", exchange) == {"timed_out": 4.0}
    finally:
        await connection.close()
        await proxy.stop()


async def test_kafka_publish_failures_are_counted(kafka_bootstrap: str) -> None:
    ns = f"smk{uuid.uuid4().hex[:6]}"
    missing, small = f"{ns}-missing", f"{ns}-small"
    await _topic(kafka_bootstrap, small, {"max.message.bytes": "2000"})
    metrics = WorkerMetrics()
    sink = KafkaSink(kafka_bootstrap, timeout_s=1.0, metrics=metrics)
    await sink.start()
    try:
        with pytest.raises(PublishError, match=missing):  # auto-create is off
            await sink.publish(missing, b"x", key=b"k")
        with pytest.raises(PublishError):  # the broker refuses a record over the limit
            await sink.publish_many([Message(small, b"z" * 10_000, b"k") for _ in range(2)])
    finally:
        await sink.stop()
    assert _failures(metrics, "kafka", missing) == {"timed_out": 1.0}
    assert _failures(metrics, "kafka", small) == {"failed": 2.0}
