"""Outputs: registration of sinks and ``send``, the topic plan, and sends on the memory
broker (routing, rollback with the event, errors naming the agent and topic)."""

from __future__ import annotations

from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Park, Redeliver, Send, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.testing import MemoryBroker, StuckRecordsError
from streamapp.topics import TopicRole, partition_for


def _derived(event: Event, suffix: str = "d") -> Event:
    assert event.stream_id is not None
    return Event.create("derived", stream_id=event.stream_id, id=f"{event.id}/{suffix}")


# registration ---------------------------------------------------------------------------
def test_sinks_must_be_declared_topics_of_the_app() -> None:
    app = App("t")
    src = app.topic("in")

    async def h(event: Event, *, send: Send) -> None:
        pass

    with pytest.raises(ConfigError, match="agent 'h': sink 'out' is a string"):
        app.agent(src, sinks=["out"])(h)  # type: ignore[list-item]
    other = App("other").topic("out")
    with pytest.raises(ConfigError, match=r"agent 'h': sink 'out' .* not a declared topic"):
        app.agent(src, sinks=[other])(h)
    out = app.topic("out")
    with pytest.raises(ConfigError, match="sinks= takes a list of topics"):
        app.agent(src, sinks=out)(h)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="listed twice in sinks"):
        app.agent(src, sinks=[out, out])(h)
    agent = app.agent(src, sinks=[out])(h)
    assert agent.sinks == (out,)


def test_send_is_keyword_only_and_only_with_sinks() -> None:
    app = App("t")
    src, out = app.topic("in"), app.topic("out")
    t: Table[int] = Table("t")

    async def no_send(event: Event) -> None:
        pass

    async def positional(event: Event, send: Any) -> None:
        pass

    async def keyword(event: Event, view: TableView[int], *, send: Send) -> None:
        pass

    with pytest.raises(ConfigError, match=r"agent 'no_send': it declares sinks.*takes no `send`"):
        app.agent(src, sinks=[out])(no_send)
    with pytest.raises(ConfigError, match="`send` must be keyword-only"):
        app.agent(src, sinks=[out])(positional)
    with pytest.raises(ConfigError, match=r"takes `send` but the agent declares no sinks"):
        app.agent(src, tables=[t])(keyword)
    agent = app.agent(src, tables=[t], sinks=[out])(keyword)
    assert agent.tables == (t,)


def test_output_topics_are_planned_with_role_output() -> None:
    app = App("t")
    src, out, chained = (
        app.topic("in", partitions=4),
        app.topic("out", partitions=3),
        app.topic("mid", partitions=2),
    )

    @app.agent(src, sinks=[out, chained])
    async def first(event: Event, *, send: Send) -> None:
        pass

    @app.agent(chained)
    async def second(event: Event) -> None:
        pass

    roles = {p.name: (p.role, p.partitions) for p in app.topic_plan()}
    assert roles["out"] == (TopicRole.OUTPUT, 3)
    assert roles["mid"] == (TopicRole.SOURCE, 2)  # an output another agent reads is a source
    assert roles["in"] == (TopicRole.SOURCE, 4)
    assert roles["out"][0] == "output"  # roles are strings too (what topics create prints)


# on the memory broker -------------------------------------------------------------------
async def test_sends_go_to_the_partition_of_their_stream_id_once_the_event_settles() -> None:
    app = App("t")
    src, out = app.topic("in", partitions=2), app.topic("out", partitions=5)
    counts: Table[int] = Table("counts")

    @app.agent(src, tables=[counts], sinks=[out], on_failure=Park("in.parked"))
    async def derive(event: Event, counts: TableView[int], *, send: Send) -> None:
        assert event.stream_id is not None
        counts[event.stream_id] = counts.get(event.stream_id, 0) + 1
        send(out, _derived(event))
        send("out", _derived(event, "again"))  # by name too
        if event.type == "boom":
            raise RuntimeError("after the sends")

    broker = MemoryBroker(app)
    for i in range(20):
        broker.send("in", Event.create("ok", stream_id=f"s{i}", id=f"e{i}"))
    broker.send("in", Event.create("boom", stream_id="s1", id="bad"))
    await broker.process()
    records = broker.records("out")
    ids = [codec.decode(r.key, r.value, r.headers).id for r in records]
    assert sorted(ids) == sorted(
        [f"e{i}/d" for i in range(20)] + [f"e{i}/again" for i in range(20)]
    )
    for r in records:
        assert r.key is not None
        assert r.partition == partition_for(r.key, 5)
    assert broker.table("counts").get("s1") == 1  # the failed event's write rolled back
    assert len(broker.records("in.parked")) == 1


async def test_a_send_to_an_undeclared_topic_fails_the_event_naming_agent_and_topic() -> None:
    app = App("t")
    src, out = app.topic("in", partitions=1), app.topic("out", partitions=1)
    app.topic("elsewhere", partitions=1)

    @app.agent(src, sinks=[out], on_failure=Park("in.parked"))
    async def derive(event: Event, *, send: Send) -> None:
        if event.type == "stray":
            send("elsewhere", _derived(event))
        elif event.type == "nokey":
            send(out, Event(id="x", source="s", type="t"))
        elif event.type == "notevent":
            send(out, {"id": 1})  # type: ignore[arg-type]
        else:
            send(out, _derived(event))

    broker = MemoryBroker(app)
    for kind in ("stray", "nokey", "notevent", "fine"):
        broker.send("in", Event.create(kind, stream_id="s", id=kind))
    await broker.process()
    reasons = [
        dict(r.headers)["streamapp-park-reason"].decode() for r in broker.records("in.parked")
    ]
    assert reasons[0].startswith(
        "OutputError: agent 'derive' sends to topic 'elsewhere', which it does not declare"
    )
    assert "has no stream id" in reasons[1]
    assert "takes an Event, not dict" in reasons[2]
    assert [codec.decode(r.key, r.value, r.headers).id for r in broker.records("out")] == ["fine/d"]


async def test_derived_events_feed_the_agents_of_their_topic_in_the_same_process_call() -> None:
    app = App("t")
    src, mid = app.topic("in", partitions=2), app.topic("mid", partitions=3)
    seen: Table[list[str]] = Table("seen")

    @app.agent(src, sinks=[mid])
    async def forward(event: Event, *, send: Send) -> None:
        send(mid, _derived(event))

    @app.agent(mid, tables=[seen])
    async def collect(event: Event, seen: TableView[list[str]]) -> None:
        assert event.stream_id is not None
        seen[event.stream_id] = [*seen.get(event.stream_id, []), event.id]

    broker = MemoryBroker(app)
    for i in range(6):
        broker.send("in", Event.create("x", stream_id=f"s{i % 2}", id=f"e{i}"))
    await broker.process()
    assert broker.table("seen").get("s0") == ["e0/d", "e2/d", "e4/d"]
    assert broker.table("seen").get("s1") == ["e1/d", "e3/d", "e5/d"]
    assert broker.pending("mid") == 0


async def test_a_redelivered_event_sends_once_when_it_finally_settles() -> None:
    app = App("t")
    src, out = app.topic("in", partitions=1), app.topic("out", partitions=1)
    tries: list[str] = []

    @app.agent(src, sinks=[out], on_failure=Redeliver())
    async def derive(event: Event, *, send: Send) -> None:
        tries.append(event.id)
        send(out, _derived(event))
        if event.id == "flaky" and tries.count("flaky") < 3:
            raise ConnectionError("transient")

    broker = MemoryBroker(app)
    for name in ("a", "flaky", "b"):
        broker.send("in", Event.create("x", stream_id="s", id=name))
    await broker.process()
    assert tries == ["a", "flaky", "flaky", "flaky", "b"]
    assert [codec.decode(r.key, r.value, r.headers).id for r in broker.records("out")] == [
        "a/d",
        "flaky/d",
        "b/d",
    ]


async def test_stuck_records_send_nothing() -> None:
    app = App("t")
    src, out = app.topic("in", partitions=1), app.topic("out", partitions=1)

    @app.agent(src, sinks=[out])
    async def derive(event: Event, *, send: Send) -> None:
        send(out, _derived(event))
        raise RuntimeError("always")

    broker = MemoryBroker(app, max_attempts=3)
    broker.send("in", Event.create("x", stream_id="s", id="e"))
    with pytest.raises(StuckRecordsError, match="agent 'derive'"):
        await broker.process()
    assert broker.records("out") == []
