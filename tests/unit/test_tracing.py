"""streamapp's spans, recorded by the OpenTelemetry SDK's in-memory exporter, on the memory
broker (the same partition tasks as every transport), an SQLite event store and two
workers' views on real ports: one span per handled delivery in its event's trace, one
per batch commit, sends and appends that keep or start a context, a forwarded lookup
that carries it. The same on real Kafka: tests/integration/test_tracing_kafka.py."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamapp import App, Event, Park, Redeliver, Retry, Send, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.eventstore import Append, open_store
from streamapp.testing import MemoryBroker
from streamapp.web.views import make_app
from tests.support.doubles import StaticDirectory
from tests.support.spans import (
    named,
    of_event,
    parent_id,
    recording,
    span_id,
    trace_id,
    traceparent,
)
from tests.support.webworld import World, order, orders_app

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
PARENT = f"00-{TRACE}-{SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording() as exporter:
        yield exporter


def _event(id: str, parent: str | None = PARENT, stream: str = "s", **ext: str) -> Event:
    extensions = {"traceparent": parent, **ext} if parent is not None else ext
    return Event.create("e", stream_id=stream, id=id, data={}, extensions=extensions)


def _counting(app: App, **options: Any) -> Table[int]:
    """Agent ``count`` of topic ``in``: counts events per stream; the first attempt at an
    event of type ``boom`` fails."""
    counts: Table[int] = Table("counts")
    failed: set[str] = set()

    @app.agent(app.topic("in", partitions=2), tables=[counts], **options)
    async def count(event: Event, view: TableView[int]) -> None:
        sid = event.stream_id
        assert sid is not None
        if event.type == "boom" and event.id not in failed:
            failed.add(event.id)
            raise RuntimeError("the first attempt fails")
        view[sid] = view.get(sid, 0) + 1

    return counts


async def test_a_handled_event_is_a_child_span_of_its_context_then_its_batch_commits(
    spans: InMemorySpanExporter,
) -> None:
    app = App("t")
    _counting(app)
    broker = MemoryBroker(app)
    record = broker.send("in", _event("a"))
    await broker.process()
    (handled,) = of_event(named(spans, "handle count"), "a")
    assert trace_id(handled) == int(TRACE, 16)
    assert parent_id(handled) == int(SPAN, 16)
    assert handled.kind is SpanKind.CONSUMER
    assert dict(handled.attributes or {}) == {
        "streamapp.agent": "count",
        "streamapp.topic": "in",
        "streamapp.partition": record.partition,
        "streamapp.position": record.position,
        "streamapp.attempts": 1,
        "streamapp.outcome": "delivered",
        "streamapp.settled": True,
        "cloudevents.event_id": "a",
        "cloudevents.event_type": "e",
    }
    (commit,) = named(spans, "commit in")
    assert parent_id(commit) == span_id(handled)
    assert trace_id(commit) == int(TRACE, 16)
    attributes = commit.attributes or {}
    assert attributes["streamapp.partition"] == record.partition
    assert attributes["streamapp.events"] == 1


async def test_a_commit_links_every_delivery_of_its_batch_beyond_the_first(
    spans: InMemorySpanExporter,
) -> None:
    app = App("t")
    _counting(app)
    broker = MemoryBroker(app)
    records = [broker.send("in", _event(f"e{i}", parent=None, stream="one")) for i in range(4)]
    await broker.process()
    handled = named(spans, "handle count")
    assert [(s.attributes or {})["streamapp.position"] for s in handled] == [
        r.position for r in records
    ]
    assert len({trace_id(s) for s in handled}) == 4  # no context: each its own trace
    assert all(s.parent is None for s in handled)
    (commit,) = named(spans, "commit in")
    assert parent_id(commit) == span_id(handled[0])
    assert [link.context.span_id for link in commit.links] == [span_id(s) for s in handled[1:]]
    assert (commit.attributes or {})["streamapp.events"] == 4


@pytest.mark.parametrize(
    "bad",
    [
        "garbage",
        f"00-{'0' * 32}-{SPAN}-01",  # an all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # an all-zero span id
        f"ff-{TRACE}-{SPAN}-01",  # the forbidden version
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper case
        "",
    ],
)
async def test_an_invalid_context_is_ignored_and_the_event_still_delivered(
    spans: InMemorySpanExporter, bad: str
) -> None:
    app = App("t")
    counts = _counting(app)
    broker = MemoryBroker(app)
    broker.send("in", _event("x", parent=bad, tracestate="a=b"))
    outcomes = await broker.process()
    assert broker.table(counts.name).get("s") == 1
    assert sum(outcomes.values()) == 1
    (handled,) = named(spans, "handle count")
    assert handled.parent is None
    assert trace_id(handled) != int(TRACE, 16)
    assert (handled.attributes or {})["streamapp.outcome"] == "delivered"


async def test_an_unreadable_trace_header_is_ignored_and_the_event_still_delivered(
    spans: InMemorySpanExporter,
) -> None:
    app = App("t")
    counts = _counting(app)
    broker = MemoryBroker(app)
    key, value, headers = codec.encode(_event("x"))
    broken = [(n, v) for n, v in headers if n != "ce_traceparent"] + [("ce_traceparent", b"\xff")]
    broker.send_raw("in", value, key=key, headers=broken)
    await broker.process()
    assert broker.table(counts.name).get("s") == 1
    (handled,) = named(spans, "handle count")
    assert handled.parent is None


async def test_each_attempt_is_a_span_in_the_event_trace_counting_attempts(
    spans: InMemorySpanExporter,
) -> None:
    """Redeliver: the failed attempt's span (failed, not settled, status ERROR) and the
    next one's, attempt 2, both children of the event's context."""
    app = App("t")
    counts = _counting(app, on_failure=Redeliver(pause_s=0.0))
    broker = MemoryBroker(app)
    broker.send(
        "in", Event.create("boom", stream_id="s", id="b", extensions={"traceparent": PARENT})
    )
    await broker.process()
    assert broker.table(counts.name).get("s") == 1
    first, second = of_event(named(spans, "handle count"), "b")
    assert [(s.attributes or {})["streamapp.attempts"] for s in (first, second)] == [1, 2]
    assert (first.attributes or {})["streamapp.outcome"] == "failed"
    assert (first.attributes or {})["streamapp.settled"] is False
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (second.attributes or {})["streamapp.outcome"] == "delivered"
    assert {parent_id(first), parent_id(second)} == {int(SPAN, 16)}


async def test_a_retried_event_keeps_its_trace_across_the_retry_topic(
    spans: InMemorySpanExporter,
) -> None:
    app = App("t")
    counts = _counting(app, on_failure=Retry(intervals=(), max_reconsume=3, backoff=(1.0,)))
    broker = MemoryBroker(app)
    broker.send(
        "in", Event.create("boom", stream_id="s", id="b", extensions={"traceparent": PARENT})
    )
    await broker.process()
    assert broker.table(counts.name).get("s") == 1
    assert broker.records("in-retry")  # the copy went through the retry topic
    first, second = of_event(named(spans, "handle count"), "b")
    assert (first.attributes or {})["streamapp.settled"] is True  # the retry copy settles it
    assert (second.attributes or {})["streamapp.attempts"] == 2  # x-reconsume counted
    assert {trace_id(first), trace_id(second)} == {int(TRACE, 16)}
    assert {parent_id(first), parent_id(second)} == {int(SPAN, 16)}


async def test_a_parked_copy_keeps_the_context_it_came_with(spans: InMemorySpanExporter) -> None:
    app = App("t")
    _counting(app, on_failure=Park("in.parked"))
    broker = MemoryBroker(app)
    broker.send(
        "in", Event.create("boom", stream_id="s", id="b", extensions={"traceparent": PARENT})
    )
    await broker.process()
    (parked,) = broker.records("in.parked")
    assert dict(parked.headers)["ce_traceparent"] == PARENT.encode()
    (handled,) = named(spans, "handle count")
    assert (handled.attributes or {})["streamapp.settled"] is True


async def test_a_derived_event_continues_the_trace_of_the_delivery_that_sent_it(
    spans: InMemorySpanExporter,
) -> None:
    app = App("t")
    out = app.topic("out")
    got: list[Event] = []

    @app.agent(app.topic("in"), sinks=[out])
    async def relay(event: Event, *, send: Send) -> None:
        assert event.stream_id is not None
        send(out, Event.create("derived", stream_id=event.stream_id, id=f"{event.id}/d"))
        send(out, _event(f"{event.id}/kept", parent=f"00-{'1' * 32}-{'2' * 16}-01"))

    @app.agent(out)
    async def downstream(event: Event) -> None:
        got.append(event)

    broker = MemoryBroker(app)
    broker.send("in", _event("a"))
    await broker.process()
    (sent_by,) = named(spans, "handle relay")
    derived = next(e for e in got if e.id == "a/d")
    assert derived.extensions["traceparent"] == traceparent(sent_by)
    kept = next(e for e in got if e.id == "a/kept")
    assert kept.extensions["traceparent"] == f"00-{'1' * 32}-{'2' * 16}-01"
    (then,) = of_event(named(spans, "handle downstream"), "a/d")
    assert trace_id(then) == int(TRACE, 16)
    assert parent_id(then) == span_id(sent_by)


async def test_a_blocking_handler_runs_in_its_deliverys_span(spans: InMemorySpanExporter) -> None:
    app = App("t")
    seen: list[tuple[int, int, str]] = []

    @app.agent(app.topic("in"), blocking=True)
    def slow(event: Event) -> None:
        current = trace.get_current_span().get_span_context()
        seen.append((current.trace_id, current.span_id, threading.current_thread().name))

    broker = MemoryBroker(app)
    broker.send("in", _event("a"))
    await broker.process()
    (handled,) = named(spans, "handle slow")
    ((trace_of, span_of, thread),) = seen
    assert (trace_of, span_of) == (trace_id(handled), span_id(handled))
    assert thread != threading.current_thread().name  # it ran in the lane's thread


async def test_an_append_starts_a_context_or_keeps_the_one_given(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}?create=1")
    try:
        given = _event("given")
        invalid = _event("invalid", parent="garbage")
        plain = _event("plain", parent=None)
        result = await store.append_many(
            [Append("s", [given, invalid, plain]), Append("t", [_event("t1", stream="t")])]
        )
        assert result.error is None
        rows = {row.event().id: row.event() for row in await store.read_all(1, 10)}
    finally:
        await store.close()
    (append,) = named(spans, "append")
    assert append.kind is SpanKind.PRODUCER
    assert append.parent is None
    attributes = append.attributes or {}
    assert attributes["db.system.name"] == "sqlite"
    assert (attributes["streamapp.events"], attributes["streamapp.appended"]) == (4, 4)
    assert rows["given"].extensions["traceparent"] == PARENT
    assert rows["invalid"].extensions["traceparent"] == traceparent(append)
    assert rows["plain"].extensions["traceparent"] == traceparent(append)


async def test_an_append_inside_a_span_of_the_application_joins_its_trace(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A web handler of the application appends in its own request span: the append is
    its child, and so the events' trace is the request's."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}?create=1")
    try:
        with provider.get_tracer("app").start_as_current_span("POST /orders") as request:
            await store.append_many([Append("s", [_event("p", parent=None)])])
    finally:
        await store.close()
    (append,) = named(spans, "append")
    assert parent_id(append) == request.get_span_context().span_id
    assert trace_id(append) == request.get_span_context().trace_id


# a view lookup forwarded to the key's owner -----------------------------------------------
@pytest.fixture
async def pair(spans: InMemorySpanExporter) -> AsyncIterator[tuple[str, str, World]]:
    """Two workers' views on real ports, over partitions 0-1 and 2-3 (made with tracing on)."""
    app = orders_app()
    keys = [f"order-{i}" for i in range(40)]
    runners, urls, worlds = [], [], []
    for partitions in ([0, 1], [2, 3]):
        world = World(app)
        await world.own(partitions)
        await world.send(*(order(k, "paid") for k in keys))
        world.assignment.directory = StaticDirectory()
        runner = web.AppRunner(make_app(world.assignment, f"w{partitions[0]}"))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        worlds.append(world)
    a, b = worlds
    assert isinstance(a.assignment.directory, StaticDirectory)
    assert isinstance(b.assignment.directory, StaticDirectory)
    a.assignment.directory.owners = {2: urls[1], 3: urls[1]}
    b.assignment.directory.owners = {0: urls[0], 1: urls[0]}
    try:
        yield urls[0], urls[1], b
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_a_forwarded_view_lookup_carries_the_trace_context(
    spans: InMemorySpanExporter, pair: tuple[str, str, World]
) -> None:
    asked, owner, owners_world = pair
    key = next(f"order-{i}" for i in range(40) if owners_world.partition_of(f"order-{i}") >= 2)
    spans.clear()
    async with aiohttp.ClientSession() as http:
        url = f"{asked}/tables/order_status/{key}"
        async with http.get(url, headers={"traceparent": PARENT}) as r:
            assert r.status == 200, await r.text()
            assert r.headers["X-Streamapp-Forwarded-To"] == owner
    served = [s for s in named(spans, "GET /tables/") if s.kind is SpanKind.SERVER]
    (client,) = [s for s in named(spans, "GET /tables/") if s.kind is SpanKind.CLIENT]
    first = next(s for s in served if parent_id(s) == int(SPAN, 16))  # the asked worker's
    at_owner = next(s for s in served if s is not first)
    assert client.kind is SpanKind.CLIENT
    assert parent_id(client) == span_id(first)
    assert at_owner.kind is SpanKind.SERVER
    assert parent_id(at_owner) == span_id(client)
    assert {trace_id(s) for s in (first, client, at_owner)} == {int(TRACE, 16)}
    assert (client.attributes or {})["http.response.status_code"] == 200
    assert (at_owner.attributes or {})["http.route"] == "/tables/{table}/{key}"


def test_store_append_is_a_span_and_stamps_the_lines_without_a_context(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from streamapp.cli import main
    from streamapp.codecs.structured import to_json

    env = {"STREAMAPP_EVENT_STORE": f"sqlite:///{tmp_path}/events.db"}
    lines = [to_json(_event("given")), to_json(_event("plain", parent=None))]
    appended = CliRunner().invoke(
        main, ["store", "append", "-A", "agents.orders:app", "-"], input=b"\n".join(lines), env=env
    )
    assert appended.exit_code == 0, appended.output
    read = CliRunner().invoke(main, ["store", "read", "-A", "agents.orders:app"], env=env)
    stored = {e["id"]: e for e in (orjson.loads(x)["event"] for x in read.stdout.splitlines())}
    (append,) = named(spans, "append")
    assert stored["given"]["traceparent"] == PARENT
    assert stored["plain"]["traceparent"] == traceparent(append)
