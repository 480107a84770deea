"""A test-only app with three agents on one topic, two of them sending derived events.

- ``count`` (a table and a sink): counts events per order and sends
  ``<id>/counted`` carrying the count;
- ``echo`` (no table, a sink): sends ``<id>/echoed``; transactional through its sends;
- ``tally`` (a table, no sink): counts events per order on its own.

``ORDERS_NAMESPACE`` prefixes the app id and topics, so each test has its own.
"""

from __future__ import annotations

import os

from streamapp import App, Event, Send, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}outs")
orders = app.topic(f"{NAMESPACE}outs-orders", partitions=4)
derived = app.topic(f"{NAMESPACE}outs-derived", partitions=4)
counts: Table[int] = Table("counts")
tallies: Table[int] = Table("tallies")


@app.agent(orders, tables=[counts], sinks=[derived])
async def count(event: Event, counts: TableView[int], *, send: Send) -> None:
    sid = event.stream_id
    assert sid is not None
    counts[sid] = n = counts.get(sid, 0) + 1
    send(derived, Event.create("counted", stream_id=sid, id=f"{event.id}/counted", data={"n": n}))


@app.agent(orders, sinks=[derived])
async def echo(event: Event, *, send: Send) -> None:
    sid = event.stream_id
    assert sid is not None
    send(derived, Event.create("echoed", stream_id=sid, id=f"{event.id}/echoed"))


@app.agent(orders, tables=[tallies])
async def tally(event: Event, tallies: TableView[int]) -> None:
    sid = event.stream_id
    assert sid is not None
    tallies[sid] = tallies.get(sid, 0) + 1
