"""On real Kafka: the producers of parking and of the forwarder publish with acks=all and
idempotence (the broker granted them a producer id)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from streamapp import App, Event, Park
from streamapp.cli.forward import forward_sink
from streamapp.codecs import kafka as codec
from streamapp.transports.kafka.sink import KafkaSink
from streamapp.transports.kafka.topology import create_topics
from streamapp.worker import Worker
from tests.support.tasks import source_progress
from tests.support.waits import until

pytestmark = pytest.mark.integration


def assert_durable(sink: Any) -> None:
    assert isinstance(sink, KafkaSink)
    assert (sink.config["acks"], sink.config["enable_idempotence"]) == ("all", True)
    producer: Any = sink._producer
    assert producer._sender._acks == -1  # what aiokafka sends in every ProduceRequest
    assert producer._txn_manager is not None
    assert producer._txn_manager.has_pid()  # InitProducerId answered: idempotent on the broker


async def test_parking_and_forwarder_producers_are_acks_all(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"acks{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
    topic = app.topic(f"{ns}in", partitions=1)
    parking = f"{ns}in.parked"

    @app.agent(topic, on_failure=Park(parking))
    async def refuse(event: Event) -> None:
        raise ValueError("parked on purpose")

    settings = app.settings()
    await create_topics(app, settings)
    make_sink, encode = forward_sink(app, settings)  # what `streamapp forward` publishes with
    forward = make_sink()
    await forward.start()
    worker = Worker(app, settings)
    await worker.start()
    consumer = AIOKafkaConsumer(
        parking, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        key, value, headers = encode(Event.create("e", stream_id="k", data={}, id="to-park"))
        await forward.publish(topic.name, value, key=key, headers=headers)

        async def one_parked() -> Any:
            batch = await consumer.getmany(timeout_ms=200, max_records=1)
            return next((r for records in batch.values() for r in records), None)

        parked = await until(  # progress: the worker's partition (phase, outcomes)
            one_parked,
            what=f"a record in {parking}",
            progress=lambda: source_progress(worker.source),
        )
        assert codec.decode(parked.key, parked.value, parked.headers).id == "to-park"
        assert_durable(forward)
        assert_durable(worker.sink)  # the parking producer
    finally:
        await consumer.stop()
        await worker.stop()
        await forward.stop()
