"""A small app for the ``streamapp reset`` CLI tests: two agents with tables on one
topic, one agent without any (``-A tests.apps.reset_world:app``)."""

from __future__ import annotations

from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

app = App("rw")
events = app.topic("rw-events", partitions=4)
tally_table: Table[dict[str, Any]] = Table("tally")
latest_table: Table[dict[str, Any]] = Table("latest")


@app.agent(events, tables=[tally_table], history=FromEventStore())
async def tally(event: Event, view: TableView[dict[str, Any]]) -> None:
    key = event.stream_id
    assert key is not None
    view[key] = {"n": (view.get(key) or {"n": 0})["n"] + 1}


@app.agent(events, tables=[latest_table], history=FromEventStore())
async def latest(event: Event, view: TableView[dict[str, Any]]) -> None:
    key = event.stream_id
    assert key is not None
    view[key] = {"id": event.id}


@app.agent(events)
async def echo(event: Event) -> None:
    pass
