"""A test-only app for ``streamapp retire``: ``order_status`` in versions 1 and 2 on one
topic, and ``order_count`` beside them.

``RETIRE_VERSIONS`` lists the versions of ``order_status`` the code declares (``1,2``
by default; ``2``: the code after agent ``status_v1`` was removed). ``RETIRE_HISTORY=1``
gives every agent ``history=FromEventStore()``. ``ORDERS_NAMESPACE`` prefixes the app id
and the topic.
"""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
VERSIONS = {int(v) for v in os.environ.get("RETIRE_VERSIONS", "1,2").split(",")}
HISTORY = FromEventStore() if os.environ.get("RETIRE_HISTORY") == "1" else None

app = App(f"{NAMESPACE}rt")
orders = app.topic(f"{NAMESPACE}rt-orders", partitions=4)
status_v1_table: Table[dict[str, Any]] = Table("order_status")
status_v2_table: Table[dict[str, Any]] = Table("order_status", version=2)
count_table: Table[int] = Table("order_count")

if 1 in VERSIONS:

    @app.agent(orders, tables=[status_v1_table], history=HISTORY)
    async def status_v1(event: Event, view: TableView[dict[str, Any]]) -> None:
        assert event.stream_id is not None
        view[event.stream_id] = {"status": event.data["status"]}


if 2 in VERSIONS:

    @app.agent(orders, tables=[status_v2_table], history=HISTORY)
    async def status_v2(event: Event, view: TableView[dict[str, Any]]) -> None:
        assert event.stream_id is not None
        old = view.get(event.stream_id) or {"events": 0}
        view[event.stream_id] = {"status": event.data["status"], "events": old["events"] + 1}


@app.agent(orders, tables=[count_table], history=HISTORY)
async def count(event: Event, view: TableView[int]) -> None:
    assert event.stream_id is not None
    view[event.stream_id] = (view.get(event.stream_id) or 0) + 1
