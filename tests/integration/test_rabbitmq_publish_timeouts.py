"""Publishing on real RabbitMQ, with the default ``publish_timeout_s`` (5 s): a confirm
that never comes (a proxy drops the broker's ``basic.ack`` on the sink's connection) and
a broker nack (a queue with ``x-max-length=0``, ``x-overflow=reject-publish``) each fail
the batch's publish with an error naming the cause and the setting; the record comes
again (redelivered) and, once the broker confirms, is applied once; nothing is lost."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import pytest

from streamapp import App, Event, FromEventStore, Send, Table, TableView
from streamapp.codecs import amqp as codec
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.transports.rabbitmq.topology import QUEUE_ARGUMENTS, create_topology, plans
from streamapp.worker import Worker
from tests.conftest import Services
from tests.support.tasks import source_progress

from .harness import Proxy
from .test_rabbitmq_retry_chain import depth, table_value, until

pytestmark = pytest.mark.integration


def _app(ns: str, tmp_path: Path, amqp: str) -> tuple[App, Any, Any, Counter[str]]:
    app = App(
        f"{ns}app",
        broker="rabbitmq",
        amqp_url=amqp,
        event_store=f"sqlite:///{tmp_path / 'events.db'}",
        data_dir=tmp_path / "data",
        web_port=0,
        poll_timeout_ms=100,
        amqp_heartbeat_ms=200,
        amqp_session_timeout_ms=1200,
        rebalance_timeout_ms=4000,
        batch_budget_ms=1000,
        shutdown_timeout_s=20.0,
    )
    source = app.topic(f"{ns}in", partitions=1)
    out = app.topic(f"{ns}out", partitions=1)
    sums: Table[int] = Table("sums")
    calls: Counter[str] = Counter()

    @app.agent(source, tables=[sums], sinks=[out], history=FromEventStore())
    async def summer(event: Event, view: TableView[int], *, send: Send) -> None:
        calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + event.data["n"]
        send(out, Event.create("summed", stream_id=sid, id=f"{event.id}/summed", data={}))

    return app, source, out, calls


async def _send(app: App, amqp: str, topic: str, event: Event) -> None:
    settings = app.settings().with_(amqp_url=amqp)
    sink = RabbitSink(settings, {p.name: p.partitions for p in plans(app)})
    await sink.start()
    try:
        key, value, headers = codec.encode(event)
        await sink.publish(topic, value, key=key, headers=headers)
    finally:
        await sink.stop()


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """Whether a logged batch failure (ERROR) contains ``text``."""
    return any(text in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


async def _failure(caplog: pytest.LogCaptureFixture, text: str, within_s: float) -> float:
    """Seconds until a logged batch failure contains ``text``; ``within_s`` is the
    guarantee under test (the publish fails in publish_timeout_s, it does not hang)."""
    started = time.monotonic()
    while not _logged(caplog, text):
        assert time.monotonic() - started < within_s, f"no failure with {text!r} in {within_s}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def _applied_once(
    worker: Worker, amqp: str, ns: str, calls: Counter[str], delivered: int | None = None
) -> None:
    """Applied once and acked; ``delivered``: derived events in ``out.0`` (None: one per
    handler call, at least once)."""

    async def done() -> bool:
        settled = await depth(amqp, f"{ns}in.0") == 0
        return settled and await table_value(worker, "sums", "s") == 7

    await until(done, "applied and acked once confirmed")
    assert calls["e"] >= 2  # it came again after the failed publish
    assert await table_value(worker, "sums", "s") == 7  # applied once
    expected = calls["e"] if delivered is None else delivered
    assert await depth(amqp, f"{ns}out.0") == expected


@pytest.mark.slow
async def test_a_confirm_that_never_comes_fails_the_publish_in_publish_timeout_s(
    services: Services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    amqp = services.amqp
    parts = urlsplit(amqp)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5672, amqp=True)
    port = await proxy.start()
    ns = f"pto{uuid.uuid4().hex[:6]}-"
    app, source, _out, calls = _app(ns, tmp_path, f"amqp://guest:guest@127.0.0.1:{port}/")
    await create_topology(app, app.settings().with_(amqp_url=amqp))
    worker = Worker(app, app.settings())
    sink_connection = proxy.accepted  # the worker's first connection is its sink's
    try:
        await worker.start()
        proxy.confirms_held.add(sink_connection)
        event = Event.create("add", stream_id="s", data={"n": 7}, id="e", version=1)
        await _send(app, amqp, source.name, event)
        took = await _failure(caplog, "(setting publish_timeout_s)", within_s=15)
        print(f"publish failed after {took:.1f}s, {proxy.confirms_dropped} confirms dropped")
        assert took >= 4.5  # it waited out publish_timeout_s (5 s), not a shorter bound
        assert proxy.confirms_dropped >= 1
        assert any("1 not confirmed" in r.getMessage() for r in caplog.records)
        assert await table_value(worker, "sums", "s") is None  # nothing written yet
        proxy.confirms_held.clear()
        # The unconfirmed publish did reach its queue: at least once downstream.
        await _applied_once(worker, amqp, ns, calls)
    finally:
        proxy.confirms_held.clear()
        await worker.stop()
        await proxy.stop()


async def test_a_broker_nack_fails_the_publish_and_the_record_comes_again(
    services: Services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    amqp = services.amqp
    ns = f"pnk{uuid.uuid4().hex[:6]}-"
    app, source, out, calls = _app(ns, tmp_path, amqp)
    settings = app.settings()
    await create_topology(app, settings)
    connection = await aio_pika.connect(amqp)
    try:
        channel = await connection.channel()
        await channel.queue_delete(f"{ns}out.0")
        full = {**QUEUE_ARGUMENTS, "x-max-length": 0, "x-overflow": "reject-publish"}
        queue = await channel.declare_queue(f"{ns}out.0", durable=True, arguments=full)
        await queue.bind(out.name, routing_key="0")
        worker = Worker(app, settings)
        await worker.start()
        try:
            event = Event.create("add", stream_id="s", data={"n": 7}, id="e", version=1)
            await _send(app, amqp, source.name, event)
            await until(
                lambda: _logged(caplog, "nacked by the broker"),
                "a publish nacked by the broker",
                lambda: source_progress(worker.source),
            )
            await until(lambda: _at_least(calls, 2), "delivered again after the nack")
            assert await table_value(worker, "sums", "s") is None
            await channel.queue_delete(f"{ns}out.0")
            queue = await channel.declare_queue(
                f"{ns}out.0", durable=True, arguments=QUEUE_ARGUMENTS
            )
            await queue.bind(out.name, routing_key="0")
            await _applied_once(worker, amqp, ns, calls, delivered=1)  # nacked: never stored
        finally:
            await worker.stop()
    finally:
        await connection.close()


async def _at_least(calls: Counter[str], n: int) -> bool:
    return calls["e"] >= n
