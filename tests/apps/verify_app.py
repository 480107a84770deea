"""A test-only app for ``streamapp verify``: the orders projection whose handler counts
paid amounts, and adds ``STREAMAPP_TEST_VERIFY_BONUS`` to each payment (0 by default):
a worker run with one value and a verify run with another is an app whose code changed
between the live table and its rebuild. ``ORDERS_NAMESPACE`` prefixes the app id and
topic.

``STREAMAPP_TEST_VERIFY_CLOCK=1``: the handler reads the clock for ``order.shipped``
events (the value keeps ``time.time()``), a nondeterministic handler: a rebuild of a
stream with such an event differs from the live value, the others do not.

``STREAMAPP_TEST_VERIFY_V2=1``: ``totals`` version 2 (``switch="manual"``) beside v1,
written by its own agent: the same fold except that a cancellation counts as a payment
of 0 (``"cancelled": True``), so v1 and v2 differ exactly on the streams with an
``order.cancelled`` event.
"""

from __future__ import annotations

import os
import time
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
BONUS = int(os.environ.get("STREAMAPP_TEST_VERIFY_BONUS", "0"))
CLOCK = os.environ.get("STREAMAPP_TEST_VERIFY_CLOCK") == "1"
V2 = os.environ.get("STREAMAPP_TEST_VERIFY_V2") == "1"

app = App(f"{NAMESPACE}verify")
orders = app.topic(f"{NAMESPACE}verify-orders", partitions=4)
totals: Table[dict[str, Any]] = Table("totals")


def _fold(version: int) -> Any:
    async def project(event: Event, view: TableView[dict[str, Any]]) -> None:
        sid = event.stream_id
        assert sid is not None
        row = dict(view.get(sid) or {"events": 0, "paid": 0})
        row["events"] += 1
        if event.type == "order.paid":
            row["paid"] += int((event.data or {}).get("n", 0)) + BONUS
        if CLOCK and event.type == "order.shipped":
            row["shipped_at"] = time.time()
        if version == 2 and event.type == "order.cancelled":
            row["cancelled"] = True
        view[sid] = row

    return project


app.agent(orders, tables=[totals], name="total", history=FromEventStore())(_fold(1))
if V2:
    totals_v2: Table[dict[str, Any]] = Table("totals", version=2, switch="manual")
    app.agent(orders, tables=[totals_v2], name="total_v2", history=FromEventStore())(_fold(2))
