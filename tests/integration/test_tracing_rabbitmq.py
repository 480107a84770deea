"""Tracing on real RabbitMQ (the SDK's in-memory exporter, the engine in this process): the
forwarder publishes an appended event with its trace context as ``cloudEvents_`` headers,
and the retry chain's copy keeps it, so the failed attempt, the retried one and the
commit are one trace with the append and the forward (the same on Kafka:
test_tracing_kafka.py)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from streamapp import Event, FromEventStore, Retry, Table, TableView
from streamapp.catchup.forwarder import Forwarder, forwarded_topics
from streamapp.cli.forward import forward_sink
from streamapp.engine.phase import Phase
from streamapp.eventstore import Append, open_store
from streamapp.transports.rabbitmq.topology import create_topology
from streamapp.worker import Worker
from tests.conftest import Services
from tests.support.spans import (
    named,
    of_event,
    parent_id,
    recording,
    span_id,
    trace_id,
    traceparent,
)
from tests.support.waits import until

from .test_rabbitmq_retry_chain import new_app, tap

pytestmark = pytest.mark.integration


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_the_trace_crosses_rabbitmq_and_its_retry_queue(
    services: Services, tmp_path: Path
) -> None:
    ns = f"trrmq{uuid.uuid4().hex[:6]}-"
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}?create=1")
    failed: set[str] = set()
    with recording() as spans:
        app = new_app(ns, tmp_path, services.amqp)
        topic = app.topic(f"{ns}in", partitions=2)
        counts: Table[int] = Table("counts")

        @app.agent(
            topic,
            tables=[counts],
            history=FromEventStore(),
            on_failure=Retry(intervals=(), max_reconsume=2, backoff=(0.2,)),
        )
        async def count(event: Event, view: TableView[int]) -> None:
            if event.id not in failed:
                failed.add(event.id)
                raise RuntimeError("the first attempt fails")
            assert event.stream_id is not None
            view[event.stream_id] = view.get(event.stream_id, 0) + 1

        settings = app.settings()
        await create_topology(app, settings)
        worker = Worker(app, settings)
        make_sink, encode = forward_sink(app, settings)
        forwarder = Forwarder(
            store, make_sink, forwarded_topics(app, settings), name=app.id, encode=encode,
            poll_interval_s=0.1,
        )  # fmt: skip

        def progress() -> object:
            tasks = sorted(
                (p, t.phase.name) for (_, p), t in worker.source.assignment.tasks.items()
            )
            return len(spans.get_finished_spans()), tuple(tasks)

        async with tap(services.amqp, {topic.name: 2, f"{topic.name}-retry": 2}) as seen:
            await worker.start()
            forwarding = asyncio.create_task(forwarder.run(), name="forwarder")
            try:
                tasks = worker.source.assignment.tasks
                await until(
                    lambda: len(tasks) == 2 and all(t.phase is Phase.LIVE for t in tasks.values()),
                    what="both partitions live",
                    progress=progress,
                )
                event = Event.create("order.placed", stream_id="o-1", id="ev-1", data={})
                assert (await store.append_many([Append("o-1", [event])])).error is None

                def delivered() -> bool:
                    handled = of_event(named(spans, "handle count"), "ev-1")
                    return any(_attrs(s)["streamapp.outcome"] == "delivered" for s in handled)

                await until(delivered, what="ev-1 failed, retried and delivered", progress=progress)
            finally:
                forwarding.cancel()
                await asyncio.gather(forwarding, return_exceptions=True)
                await worker.stop()
                await store.close()
    (append,) = named(spans, "append")
    (forward,) = of_event(named(spans, "forward"), "ev-1")
    first, second = of_event(named(spans, "handle count"), "ev-1")
    assert {trace_id(s) for s in (append, forward, first, second)} == {trace_id(append)}
    assert {parent_id(s) for s in (forward, first, second)} == {span_id(append)}
    assert (_attrs(first)["streamapp.outcome"], _attrs(first)["streamapp.settled"]) == (
        "failed",
        True,
    )
    assert _attrs(second)["streamapp.attempts"] == 2
    commits = [c for c in named(spans, "commit ") if parent_id(c) == span_id(first)]
    assert commits, "the batch that copied ev-1 to the retry queue committed in its trace"
    context = traceparent(append).encode()
    crossed = [m for m in seen if m.headers.get("cloudEvents_id") == b"ev-1"]
    assert {m.exchange for m in crossed} >= {topic.name, f"{topic.name}-retry"}
    assert {m.headers["cloudEvents_traceparent"] for m in crossed} == {context}
