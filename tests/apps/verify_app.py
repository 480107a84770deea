"""A test-only app for ``streamapp verify``: the orders projection whose handler counts
paid amounts, and adds ``STREAMAPP_TEST_VERIFY_BONUS`` to each payment (0 by default):
a worker run with one value and a verify run with another is an app whose code changed
between the live table and its rebuild. ``ORDERS_NAMESPACE`` prefixes the app id and
topic."""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
BONUS = int(os.environ.get("STREAMAPP_TEST_VERIFY_BONUS", "0"))

app = App(f"{NAMESPACE}verify")
orders = app.topic(f"{NAMESPACE}verify-orders", partitions=4)
totals: Table[dict[str, Any]] = Table("totals")


@app.agent(orders, tables=[totals], history=FromEventStore())
async def total(event: Event, view: TableView[dict[str, Any]]) -> None:
    sid = event.stream_id
    assert sid is not None
    row = dict(view.get(sid) or {"events": 0, "paid": 0})
    row["events"] += 1
    if event.type == "order.paid":
        row["paid"] += int((event.data or {}).get("n", 0)) + BONUS
    view[sid] = row
