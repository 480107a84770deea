"""A test-only app whose agent raises ``Refuse`` on an event of type ``v9`` (unless
``STREAMAPP_TEST_REFUSE_FIXED`` is set: the fixed code), counting events per stream in
table ``counts``. ``ORDERS_NAMESPACE`` prefixes the app id and topic."""

from __future__ import annotations

import os

from streamapp import App, Event, FromEventStore, Refuse, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
FIXED = bool(os.environ.get("STREAMAPP_TEST_REFUSE_FIXED"))

app = App(f"{NAMESPACE}rf")
source = app.topic(f"{NAMESPACE}rf-in", partitions=1)
counts: Table[int] = Table("counts")


@app.agent(source, tables=[counts], history=FromEventStore())
async def count(event: Event, view: TableView[int]) -> None:
    if event.type == "v9" and not FIXED:
        raise Refuse("schema v9 is unknown to this code; deploy the version that knows it")
    sid = event.stream_id
    assert sid is not None
    view[sid] = view.get(sid, 0) + 1
