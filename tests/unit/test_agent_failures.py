"""Failures that come from the agent's own code take the failure policy, never the source."""

from __future__ import annotations

import asyncio

from streamapp import App, Event, Outcome, Park, Table, TableView
from streamapp.memory import MemoryBroker


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
