"""Tracing on real Kafka (the OpenTelemetry SDK's in-memory exporter, the engine in this
process): one trace from an event's append through the forwarder and its handling to the
batch commit; a retried event's spans in one trace across the retry topic (its copies
keep the context, the dead letter's too); a view lookup forwarded to the key's owner
carries the context to the other worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from streamapp import App, Event, FromEventStore, Retry, Table, TableView
from streamapp.catchup.forwarder import Forwarder, forwarded_topics
from streamapp.cli.forward import forward_sink
from streamapp.codecs import kafka as codec
from streamapp.engine.phase import Phase
from streamapp.eventstore import Append, open_store
from streamapp.transports.kafka.topology import create_topics as create_app_topics
from streamapp.worker import Worker
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

from .harness import read_topic

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"


def _live(*workers: Worker, partitions: int) -> Callable[[], bool]:
    """Every partition of the topic live, each on one of ``workers``."""

    def check() -> bool:
        tasks = [t for w in workers for t in w.source.assignment.tasks.values()]
        return len(tasks) == partitions and all(t.phase is Phase.LIVE for t in tasks)

    return check


def _progress(spans: InMemorySpanExporter, *workers: Worker) -> Callable[[], object]:
    """A wait's progress: spans ended, and each worker's partitions and counts."""

    def moved() -> object:
        tasks = tuple(
            (p, t.phase.name, t.counts.processed)
            for w in workers
            for (_, p), t in sorted(w.source.assignment.tasks.items())
        )
        return len(spans.get_finished_spans()), tasks

    return moved


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_one_trace_from_the_append_through_forward_and_handle_to_the_commit(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"trace{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    store = await open_store(f"{url}?create=1")
    with recording() as spans:
        app = App(
            f"{ns}app",
            kafka_bootstrap=kafka_bootstrap,
            data_dir=tmp_path / "data",
            web_port=0,
            event_store=url,
        )
        topic = app.topic(f"{ns}orders", partitions=2)
        counts: Table[int] = Table("counts")

        @app.agent(topic, tables=[counts], history=FromEventStore())
        async def count(event: Event, view: TableView[int]) -> None:
            assert event.stream_id is not None
            view[event.stream_id] = view.get(event.stream_id, 0) + 1

        settings = app.settings()
        await create_app_topics(app, settings)
        worker = Worker(app, settings)
        make_sink, encode = forward_sink(app, settings)
        forwarder = Forwarder(
            store, make_sink, forwarded_topics(app, settings), name=app.id, encode=encode,
            poll_interval_s=0.1,
        )  # fmt: skip
        await worker.start()
        forwarding = asyncio.create_task(forwarder.run(), name="forwarder")
        try:
            await until(
                _live(worker, partitions=2),
                what="both partitions live",
                progress=_progress(spans, worker),
            )
            event = Event.create("order.placed", stream_id="o-1", id="ev-1", data={"n": 1})
            assert (await store.append_many([Append("o-1", [event])])).error is None

            def committed() -> ReadableSpan | None:
                handled = [
                    s
                    for s in of_event(named(spans, "handle count"), "ev-1")
                    if _attrs(s)["streamapp.topic"] == topic.name
                ]
                commits = [c for c in named(spans, "commit ") for h in handled
                           if parent_id(c) == span_id(h)]  # fmt: skip
                return commits[0] if commits else None

            commit = await until(
                committed,
                what="ev-1 appended, forwarded, handled and committed",
                progress=_progress(spans, worker),
            )
        finally:
            forwarding.cancel()
            await asyncio.gather(forwarding, return_exceptions=True)
            await worker.stop()
            await store.close()
    (append,) = named(spans, "append")
    (forward,) = of_event(named(spans, "forward"), "ev-1")
    (handle,) = [s for s in of_event(named(spans, "handle count"), "ev-1")
                 if _attrs(s)["streamapp.topic"] == topic.name]  # fmt: skip
    assert append.parent is None
    assert append.kind is SpanKind.PRODUCER
    assert {trace_id(s) for s in (append, forward, handle, commit)} == {trace_id(append)}
    assert parent_id(forward) == span_id(append)  # the context the event carries,
    assert parent_id(handle) == span_id(append)  # unchanged over every hop
    assert parent_id(commit) == span_id(handle)
    assert append.start_time <= forward.start_time <= handle.start_time <= commit.start_time
    assert _attrs(forward)["streamapp.position"] == 1
    assert _attrs(forward)["streamapp.topics"] == (topic.name,)
    assert _attrs(handle)["streamapp.outcome"] == "delivered"
    assert _attrs(commit)["streamapp.partition"] == _attrs(handle)["streamapp.partition"]
    (record,) = await read_topic(kafka_bootstrap, topic.name)
    assert dict(record.headers)["ce_traceparent"] == traceparent(append).encode()
    assert record.offset == _attrs(handle)["streamapp.position"]


async def _send(bootstrap: str, topic: str, events: list[Event]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for event in events:
            key, value, headers = codec.encode(event)
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def test_a_retried_event_keeps_one_trace_across_the_retry_topic(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``flaky`` fails its first attempt, goes to the retry topic, comes back through the
    relay and is delivered: both spans in the event's trace. ``poison`` always fails and
    ends in the dead-letter topic: every copy keeps the ``ce_traceparent`` it came with."""
    ns = f"trretry{uuid.uuid4().hex[:6]}-"
    failed: set[str] = set()
    with recording() as spans:
        app = App(f"{ns}app", kafka_bootstrap=kafka_bootstrap, data_dir=tmp_path, web_port=0)
        topic = app.topic(f"{ns}in", partitions=2)

        @app.agent(topic, on_failure=Retry(intervals=(), max_reconsume=2, backoff=(0.3,)))
        async def picky(event: Event) -> None:
            if event.type == "poison" or event.id not in failed:
                failed.add(event.id)
                raise ValueError(f"cannot digest {event.id} yet")

        settings = app.settings()
        await create_app_topics(app, settings)
        worker = Worker(app, settings)
        await worker.start()
        try:
            await until(
                _live(worker, partitions=2), what="both live", progress=_progress(spans, worker)
            )
            poison_parent = f"00-{'a' * 32}-{'b' * 16}-01"
            flaky = Event.create(
                "ok", stream_id="k", id="flaky", extensions={"traceparent": PARENT}
            )
            poison = Event.create(
                "poison", stream_id="k", id="poison", extensions={"traceparent": poison_parent}
            )
            await _send(kafka_bootstrap, topic.name, [flaky, poison])

            def done() -> bool:
                flaky = of_event(named(spans, "handle picky"), "flaky")
                poison = of_event(named(spans, "handle picky"), "poison")
                delivered = any(_attrs(s)["streamapp.outcome"] == "delivered" for s in flaky)
                return delivered and len(poison) == 3  # max_reconsume + 1

            await until(
                done,
                what="flaky delivered, poison dead-lettered",
                progress=_progress(spans, worker),
            )
        finally:
            await worker.stop()
    first, second = of_event(named(spans, "handle picky"), "flaky")
    assert {trace_id(first), trace_id(second)} == {int(TRACE, 16)}
    assert {parent_id(first), parent_id(second)} == {int(SPAN, 16)}
    assert (_attrs(first)["streamapp.outcome"], _attrs(first)["streamapp.settled"]) == (
        "failed",
        True,
    )
    assert (_attrs(second)["streamapp.attempts"], _attrs(second)["streamapp.outcome"]) == (
        2,
        "delivered",
    )
    assert _attrs(first)["streamapp.position"] != _attrs(second)["streamapp.position"]
    poison = of_event(named(spans, "handle picky"), "poison")
    assert [_attrs(s)["streamapp.attempts"] for s in poison] == [1, 2, 3]
    assert {trace_id(s) for s in poison} == {int("a" * 32, 16)}
    retried = await read_topic(kafka_bootstrap, f"{topic.name}-retry")
    by_id = {dict(r.headers)["ce_id"]: dict(r.headers) for r in retried}
    assert by_id[b"flaky"]["ce_traceparent"] == PARENT.encode()
    assert by_id[b"poison"]["ce_traceparent"] == poison_parent.encode()
    (dead,) = await read_topic(kafka_bootstrap, f"{topic.name}-dlq")
    assert dict(dead.headers)["ce_traceparent"] == poison_parent.encode()


def _two_workers_app(ns: str, bootstrap: str, data_dir: Path) -> App:
    app = App(
        f"{ns}app",
        kafka_bootstrap=bootstrap,
        data_dir=data_dir,
        web_port=0,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    counts: Table[int] = Table("counts")

    @app.agent(app.topic(f"{ns}in", partitions=4), tables=[counts])
    async def count(event: Event, view: TableView[int]) -> None:
        assert event.stream_id is not None
        view[event.stream_id] = view.get(event.stream_id, 0) + 1

    return app


async def test_a_view_lookup_forwarded_to_the_owner_carries_the_trace_context(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"trview{uuid.uuid4().hex[:6]}-"
    keys = [f"s{i}" for i in range(16)]
    with recording() as spans:
        first = _two_workers_app(ns, kafka_bootstrap, tmp_path / "a")
        second = _two_workers_app(ns, kafka_bootstrap, tmp_path / "b")
        await create_app_topics(first, first.settings())
        await _send(kafka_bootstrap, f"{ns}in", [Event.create("e", stream_id=k) for k in keys])
        a, b = Worker(first, first.settings()), Worker(second, second.settings())
        a.id, b.id = f"{a.id}-a", f"{b.id}-b"  # one process: the members topic keys by id
        await a.start()
        try:
            await b.start()
            try:
                await until(
                    lambda: (
                        _live(a, b, partitions=4)()
                        and all(w.source.assignment.tasks for w in (a, b))
                    ),
                    what="4 partitions live over both workers",
                    progress=_progress(spans, a, b),
                )
                theirs = {p for _, p in b.source.assignment.tasks}
                topic = first.topics[f"{ns}in"]
                key = next(k for k in keys if topic.partition_of(k.encode()) in theirs)
                url = f"http://127.0.0.1:{a.web_port}/tables/counts/{key}"

                last: list[object] = []
                async with aiohttp.ClientSession() as http:

                    async def answered() -> bool:
                        spans.clear()
                        async with http.get(url, headers={"traceparent": PARENT}) as r:
                            last[:] = [r.status, dict(r.headers), await r.text()]
                            return r.status == 200 and "X-Streamapp-Forwarded-To" in r.headers

                    await until(
                        answered,
                        what=f"{key} answered by its owner through worker a",
                        progress=_progress(spans, a, b),
                        detail=lambda: last,
                    )
            finally:
                await b.stop()
        finally:
            await a.stop()
    served = [s for s in named(spans, "GET /tables/") if s.kind is SpanKind.SERVER]
    (client,) = [s for s in named(spans, "GET /tables/") if s.kind is SpanKind.CLIENT]
    at_a = next(s for s in served if parent_id(s) == int(SPAN, 16))
    (at_owner,) = [s for s in served if s is not at_a]
    assert parent_id(client) == span_id(at_a)
    assert parent_id(at_owner) == span_id(client)
    assert {trace_id(s) for s in (at_a, client, at_owner)} == {int(TRACE, 16)}
    assert _attrs(at_owner)["http.response.status_code"] == 200
    assert _attrs(client)["server.address"] == b.views_url
