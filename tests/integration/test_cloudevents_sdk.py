"""On real Kafka: records the CloudEvents SDK produces, with its 1.x API
(``cloudevents.v1.kafka``) and its 2.x API (``cloudevents.core.bindings.kafka``), in
binary and structured mode, are all applied by a streamapp agent; none is parked."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cloudevents.core.bindings import kafka as core_kafka
from cloudevents.core.v1.event import CloudEvent as CoreCloudEvent
from cloudevents.v1 import kafka as v1_kafka
from cloudevents.v1.http import CloudEvent as V1CloudEvent

from streamapp import App, Event, Park, Table, TableView
from streamapp.transports.kafka.topology import create_topics
from streamapp.worker import Worker
from tests.support.waits import frozen, until

pytestmark = pytest.mark.integration


def attributes(stream: str, datacontenttype: str | None) -> dict[str, Any]:
    attrs = {
        "id": f"id-{stream}",
        "source": "/sdk",
        "type": "order.placed",
        "streamid": stream,
        "streamversion": "1",
        "partitionkey": stream,  # the SDKs' record key
    }
    if datacontenttype is not None:
        attrs["datacontenttype"] = datacontenttype
    return attrs


def records() -> dict[str, Any]:
    """stream id -> the SDK's KafkaMessage of one event on that stream."""
    data = {"total": 12.5, "lines": ["a", "b"]}
    return {
        "v1-binary": v1_kafka.to_binary(
            V1CloudEvent(attributes("v1-binary", "application/json"), data)
        ),
        # no datacontenttype: the SDK writes the record without any content-type header
        "v1-structured": v1_kafka.to_structured(
            V1CloudEvent(attributes("v1-structured", None), data)
        ),
        # with one: the SDK moves it out of the JSON into a content-type header
        "v1-structured-ct": v1_kafka.to_structured(
            V1CloudEvent(attributes("v1-structured-ct", "application/json"), data)
        ),
        "core-binary": core_kafka.to_binary_event(
            CoreCloudEvent(attributes("core-binary", "application/json"), data)
        ),
        "core-structured": core_kafka.to_structured_event(
            CoreCloudEvent(attributes("core-structured", "application/json"), data)
        ),
    }


async def test_an_agent_applies_events_of_both_sdk_apis_in_both_modes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"sdk{uuid.uuid4().hex[:6]}-"
    app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
    topic = app.topic(f"{ns}in", partitions=2)
    parking = f"{ns}in.parked"
    applied_table: Table[dict[str, Any]] = Table("applied")

    @app.agent(topic, tables=[applied_table], on_failure=Park(parking))
    async def apply(event: Event, applied: TableView[dict[str, Any]]) -> None:
        assert event.stream_id is not None
        applied[event.stream_id] = {"id": event.id, "type": event.type, "data": event.data}

    settings = app.settings()
    await create_topics(app, settings)
    messages = records()
    assert messages["v1-structured"].headers == {}  # the record this issue is about
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for message in messages.values():
            key = message.key.encode() if isinstance(message.key, str) else message.key
            value = message.value.encode() if isinstance(message.value, str) else message.value
            await producer.send_and_wait(
                topic.name, value, key=key, headers=list(message.headers.items())
            )
    finally:
        await producer.stop()

    worker = Worker(app, settings)
    await worker.start()
    try:
        got: dict[str, Any] = {}
        url = f"http://127.0.0.1:{worker.web_port}/tables/applied/"
        async with aiohttp.ClientSession() as http:

            async def applied() -> bool:
                for stream in set(messages) - set(got):
                    async with http.get(url + stream) as r:
                        if r.status == 200:
                            got[stream] = await r.json()
                return len(got) == len(messages)

            async def progress() -> tuple[object, ...]:
                status = f"http://127.0.0.1:{worker.web_port}/status"
                async with http.get(status) as r:  # its partitions: phases, counts
                    body = await r.json() if r.status == 200 else {}
                return len(got), frozen(body.get("partitions"))

            await until(applied, what="every SDK-made event applied", progress=progress)
    finally:
        await worker.stop()
    data = {"total": 12.5, "lines": ["a", "b"]}
    assert got == {
        stream: {"id": f"id-{stream}", "type": "order.placed", "data": data} for stream in messages
    }

    consumer = AIOKafkaConsumer(
        parking, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        parked = await consumer.getmany(timeout_ms=1000)
    finally:
        await consumer.stop()
    assert not any(parked.values())
