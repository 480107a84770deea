"""Several agents on one topic (lanes of one partition task), on the memory broker, and
co-partitioned reads: registration rules and where a read finds its table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Park, ReadView, Redeliver, Table, TableView
from streamapp.engine.assignment import Assignment
from streamapp.errors import TableUnavailableError
from streamapp.testing import MemoryBroker, StuckRecordsError
from streamapp.transports.kafka.port import offset_metadata, parse_metadata
from streamapp.transports.kafka.worker_id import WorkerId


def _ev(name: str, sid: str = "s", type: str = "x") -> Event:
    return Event.create(type, stream_id=sid, id=name)


def two_agents(calls: Counter[str], *, first_policy: Any, fails: str) -> App:
    """``first`` and ``second`` on one topic, each logging ids per stream; ``first``
    raises on event ``fails`` (always)."""
    app = App("t")
    topic = app.topic("in", partitions=1)
    one: Table[list[str]] = Table("one")
    two: Table[list[str]] = Table("two")

    @app.agent(topic, tables=[one], on_failure=first_policy)
    async def first(event: Event, view: TableView[list[str]]) -> None:
        calls[f"first:{event.id}"] += 1
        assert event.stream_id is not None
        view[event.stream_id] = [*view.get(event.stream_id, []), event.id]
        if event.id == fails:
            raise RuntimeError("first fails")

    @app.agent(topic, tables=[two])
    async def second(event: Event, view: TableView[list[str]]) -> None:
        calls[f"second:{event.id}"] += 1
        assert event.stream_id is not None
        view[event.stream_id] = [*view.get(event.stream_id, []), event.id]

    return app


async def test_redeliver_in_one_agent_holds_the_partition_for_all_without_rerunning_others() -> (
    None
):
    calls: Counter[str] = Counter()
    app = two_agents(calls, first_policy=Redeliver(), fails="e1")
    broker = MemoryBroker(app, max_attempts=4)
    for name in ("e0", "e1", "e2"):
        broker.send("in", _ev(name))
    with pytest.raises(StuckRecordsError) as info:
        await broker.process()
    (stuck,) = info.value.stuck
    assert stuck.agent == "first"
    assert stuck.record.position == 1
    assert calls["first:e1"] == 4
    assert calls["second:e1"] == 1  # settled by second: never run through it again
    assert calls["first:e2"] == calls["second:e2"] == 0  # nobody goes past the stuck record
    assert broker.table("one").get("s") == ["e0"]
    assert broker.table("two").get("s") == ["e0", "e1"]
    assert broker.pending("in") == 2


async def test_park_in_one_agent_parks_for_that_agent_only() -> None:
    calls: Counter[str] = Counter()
    app = two_agents(calls, first_policy=Park("in.parked"), fails="e1")
    broker = MemoryBroker(app)
    for name in ("e0", "e1", "e2"):
        broker.send("in", _ev(name))
    await broker.process()
    assert broker.table("one").get("s") == ["e0", "e2"]
    assert broker.table("two").get("s") == ["e0", "e1", "e2"]
    (parked,) = broker.records("in.parked")
    assert dict(parked.headers)["streamapp-agent"] == b"first"
    assert set(calls.values()) == {1}


def test_agents_of_one_topic_keep_their_own_tables() -> None:
    app = App("t")
    topic = app.topic("in")
    table: Table[int] = Table("t")
    app.agent(topic, tables=[table], name="x")(_noop)
    with pytest.raises(ConfigError, match=r"agent 'y': table 't' is written by agent 'x' already"):
        app.agent(topic, tables=[table], name="y")(_one_table)


async def _noop(event: Event, *views: Any) -> None:
    return None


async def _one_table(event: Event, t: Any) -> None:
    return None


# co-partitioned reads ---------------------------------------------------------------
def test_reads_are_refused_unless_co_partitioned_and_owned() -> None:
    app = App("t")
    totals: Table[int] = Table("totals")
    app.agent(app.topic("adds", partitions=4), tables=[totals], name="writer")(_noop)

    async def reader(event: Event, totals: ReadView[int]) -> None:
        pass

    with pytest.raises(ConfigError, match=r"agent 'reader' \(topic 'looks', 8 partitions\) "
                       r"cannot read table 'totals' of agent 'writer' \(topic 'adds', 4 "
                       r"partitions\).*co-partitioned"):  # fmt: skip
        app.agent(app.topic("looks", partitions=8), reads=[totals])(reader)
    with pytest.raises(ConfigError, match="names a table that no agent registered so far"):
        app.agent(app.topic("other", partitions=4), reads=[Table("nobody")])(_noop)
    with pytest.raises(ConfigError, match=r"listed in tables=\[...\] and in reads=\[...\]"):
        app.agent(app.topic("x", partitions=4), tables=[totals], reads=[totals])(_noop)
    agent = app.agent(app.topic("ok", partitions=4), reads=[totals])(reader)
    assert agent.reads == (totals,)
    assert agent.tables == ()
    assert app.copartitioned


def test_reads_bind_by_name_with_own_tables() -> None:
    app = App("t")
    totals: Table[int] = Table("totals")
    mine: Table[int] = Table("mine")
    app.agent(app.topic("a", partitions=2), tables=[totals], name="w")(_noop)

    async def reader(event: Event, totals: ReadView[int], mine: TableView[int]) -> None:
        pass

    agent = app.agent(app.topic("b", partitions=2), tables=[mine], reads=[totals])(reader)
    assert agent.views == (totals, mine)  # parameter order
    assert agent.tables == (mine,)
    assert agent.reads == (totals,)


async def test_a_read_of_a_partition_not_served_here_is_unavailable() -> None:
    app = App("t")
    totals: Table[int] = Table("totals")
    app.agent(app.topic("a", partitions=2), tables=[totals], name="w")(_noop)
    assignment = Assignment(app)
    with pytest.raises(TableUnavailableError, match="partition 1 is not owned by this worker"):
        assignment.read_store(totals, 1)


async def test_an_unavailable_read_waits_and_is_no_failure() -> None:
    """A reader whose table partition is not served is UNAVAILABLE: no attempt counted,
    no park; once served, the event applies."""
    app = App("t")
    totals: Table[int] = Table("totals")
    seen: Table[Any] = Table("seen")

    @app.agent(app.topic("a", partitions=1), tables=[totals], name="w")
    async def writer(event: Event, totals: TableView[int]) -> None:
        totals["s"] = 7

    @app.agent(app.topic("b", partitions=1), tables=[seen], reads=[totals],
               on_failure=Park("b.parked"))  # fmt: skip
    async def reader(event: Event, seen: TableView[Any], totals: ReadView[int]) -> None:
        seen["s"] = totals.get("s")

    broker = MemoryBroker(app, max_attempts=2)
    writer_task, _ = await broker._task("a", 0)
    writer_task.transition_to(writer_task.phase.RESTORING)  # as if its partition were restoring
    broker.send("b", _ev("look"))
    with pytest.raises(StuckRecordsError):
        await broker.process()
    assert broker.records("b.parked") == []  # unavailable is not a failure
    writer_task.transition_to(writer_task.phase.LIVE)
    broker.send("a", _ev("add"))
    await broker.process()
    assert broker.table("seen").get("s") == 7  # topic "a" is drained first: the add, then the look


# Kafka details ------------------------------------------------------------------------
def test_offset_metadata_round_trips_and_ignores_foreign_metadata() -> None:
    assert offset_metadata({}) == ""
    assert parse_metadata(offset_metadata({"b": 12, "c": 13})) == {"b": 12, "c": 13}
    for foreign in ("", "some tool's note", '{"ahead": {"b": 1}}', "[1]", '{"streamapp": 1}'):
        assert parse_metadata(foreign) == {}


def test_the_transactional_id_is_the_workers_kept_in_its_data_dir(tmp_path: Path) -> None:
    """One per worker (exactly-once v2), the same after a restart on the same data
    directory, another one for a second worker on it while the first holds it."""
    first = WorkerId(tmp_path, "app")
    kept = first.acquire()
    try:
        second = WorkerId(tmp_path, "app")
        other = second.acquire()
        assert other != kept
        second.release()
    finally:
        first.release()
    again = WorkerId(tmp_path, "app")
    assert again.acquire() == kept
    again.release()


async def test_an_agent_reads_the_committed_table_of_another_agent_of_its_topic() -> None:
    """Same topic, same partition task: the read sees the writer's committed state, not
    its open batch (the event in hand is not in it yet)."""
    app = App("t")
    topic = app.topic("in", partitions=2)
    totals: Table[int] = Table("totals")
    seen: Table[list[Any]] = Table("seen")

    @app.agent(topic, tables=[totals])
    async def writer(event: Event, totals: TableView[int]) -> None:
        assert event.stream_id is not None
        totals[event.stream_id] = totals.get(event.stream_id, 0) + 1

    @app.agent(topic, tables=[seen], reads=[totals])
    async def reader(event: Event, seen: TableView[list[Any]], totals: ReadView[int]) -> None:
        assert event.stream_id is not None
        seen[event.stream_id] = [*seen.get(event.stream_id, []), totals.get(event.stream_id)]

    broker = MemoryBroker(app)
    broker.send("in", _ev("e0"))
    broker.send("in", _ev("e1"))
    await broker.process()  # one batch: the writer's count is not committed yet
    broker.send("in", _ev("e2"))
    await broker.process()
    assert broker.table("totals").get("s") == 3
    assert broker.table("seen").get("s") == [None, None, 2]
