"""Failures that come from the agent's own code take the failure policy, never the source."""

from __future__ import annotations

import asyncio

import pytest

from streamapp import App, Event, Outcome, Park, Refuse, Retry, Table, TableView
from streamapp.errors import AgentRefusedError
from streamapp.testing import MemoryBroker


def _app() -> tuple[App, Table[int]]:
    app = App("t")
    table: Table[int] = Table("n")
    return app, table


async def test_a_filter_that_raises_is_a_failure_and_gets_parked() -> None:
    app, table = _app()

    def picky(event: Event) -> bool:
        if event.type == "boom":
            raise ValueError("filter broke")
        return True

    @app.agent(app.topic("in", partitions=1), tables=[table], filter=picky, on_failure=Park("p"))
    async def count(event: Event, n: TableView[int]) -> None:
        n["k"] = n.get("k", 0) + 1

    broker = MemoryBroker(app)
    for kind in ("ok", "boom", "ok"):
        broker.send("in", Event.create(kind, stream_id="s", data={}))
    counts = await broker.process()
    assert counts[Outcome.FAILED] == 1
    assert counts[Outcome.DELIVERED] == 2
    assert broker.table("n")["k"] == 2
    (parked,) = broker.records("p")
    assert dict(parked.headers)["streamapp-park-reason"] == b"ValueError: filter broke"


async def test_a_handler_leaking_cancelled_error_is_a_failure_not_a_stop() -> None:
    app, table = _app()

    @app.agent(app.topic("in", partitions=1), tables=[table], on_failure=Park("p"))
    async def count(event: Event, n: TableView[int]) -> None:
        n["k"] = n.get("k", 0) + 1
        if event.type == "slow":  # e.g. a client library's timeout leaking as cancellation
            raise asyncio.CancelledError("leaked")

    broker = MemoryBroker(app)
    for kind in ("ok", "slow", "ok"):
        broker.send("in", Event.create(kind, stream_id="s", data={}))
    counts = await broker.process()
    assert counts[Outcome.DELIVERED] == 2
    assert counts[Outcome.FAILED] == 1
    assert broker.table("n")["k"] == 2  # the failed event's write was rolled back


async def test_refuse_stops_the_partition_there_for_good_and_says_why() -> None:
    """Refuse: what came before is committed, the refused event and everything after it
    are not applied (not by any agent of the topic), and process() raises, naming the
    agent, the position and the handler's reason; a later call refuses again."""
    app, table = _app()
    other: Table[int] = Table("m")
    topic = app.topic("in", partitions=1)

    @app.agent(topic, tables=[table])
    async def count(event: Event, n: TableView[int]) -> None:
        n["k"] = n.get("k", 0) + 1
        if event.type == "v9":
            raise Refuse(f"schema {event.type} is newer than this code; deploy the new version")

    @app.agent(topic, tables=[other])
    async def also(event: Event, m: TableView[int]) -> None:
        m["k"] = m.get("k", 0) + 1

    broker = MemoryBroker(app)
    for kind in ("ok", "ok", "v9", "ok"):
        broker.send("in", Event.create(kind, stream_id="s", data={}))
    with pytest.raises(AgentRefusedError) as refused:
        await broker.process()
    message = str(refused.value)
    assert "agent 'count' refused in[0]@2" in message
    assert "Refuse: schema v9 is newer than this code; deploy the new version" in message
    assert broker.table("n")["k"] == 2  # the refused event's write was rolled back
    assert broker.table("m")["k"] == 3  # the other agent settled it (its own position)
    with pytest.raises(AgentRefusedError):
        await broker.process()
    assert broker.table("n")["k"] == 2


async def test_refuse_in_an_inline_retry_stops_the_partition_not_the_retry_topic() -> None:
    app, table = _app()
    tries: list[str] = []

    @app.agent(app.topic("in", partitions=1), tables=[table], on_failure=Retry(intervals=(0.1,)))
    async def count(event: Event, n: TableView[int]) -> None:
        tries.append(event.type)
        if event.type == "v9":
            if tries.count("v9") == 1:
                raise ValueError("flaky")
            raise Refuse("schema v9 is unknown here")
        n["k"] = n.get("k", 0) + 1

    broker = MemoryBroker(app)
    for kind in ("ok", "v9", "ok"):
        broker.send("in", Event.create(kind, stream_id="s", data={}))
    with pytest.raises(AgentRefusedError, match=r"agent 'count' refused in\[0\]@1: Refuse"):
        await broker.process()
    assert tries == ["ok", "v9", "v9"]
    assert broker.table("n")["k"] == 1
    assert broker.records("in-retry") == []
    assert broker.records("in-dlq") == []
