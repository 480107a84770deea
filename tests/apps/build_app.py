"""A test-only app that gains a second version of its table between runs.

``project`` replays its topic's orders from the event store, then goes live, keeping
each order's last status and event count in ``order_status`` (version 1).
``BUILD_V2=1`` adds ``project_v2`` on the same topic, writing ``order_status`` version 2:
another fold of the same events (also the first status), slowed by ``BUILD_V2_SLEEP_S``
per event (default 0.002) so that its replay lasts while live events arrive.
``BUILD_V2_HISTORY=0`` declares it without history (built from the topic, when the topic
keeps everything). ``ORDERS_NAMESPACE`` prefixes the app id and topics.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
V2 = os.environ.get("BUILD_V2") == "1"
SLEEP_S = float(os.environ.get("BUILD_V2_SLEEP_S", "0.002"))
V2_HISTORY = FromEventStore() if os.environ.get("BUILD_V2_HISTORY", "1") == "1" else None

app = App(f"{NAMESPACE}build")
orders = app.topic(f"{NAMESPACE}build-orders", partitions=4)
v1: Table[dict[str, Any]] = Table("order_status")
v2: Table[dict[str, Any]] = Table("order_status", version=2)


@app.agent(orders, tables=[v1], history=FromEventStore(), name="project")
async def project(event: Event, order_status: TableView[dict[str, Any]]) -> None:
    sid = event.stream_id
    assert sid is not None
    current = order_status.get(sid)
    order_status[sid] = {
        "status": event.type.removeprefix("order."),
        "version": (current["version"] if current else 0) + 1,
    }


if V2:

    @app.agent(orders, tables=[v2], history=V2_HISTORY, name="project_v2")
    async def project_v2(event: Event, order_status: TableView[dict[str, Any]]) -> None:
        if SLEEP_S:
            await asyncio.sleep(SLEEP_S)
        sid = event.stream_id
        assert sid is not None
        current = order_status.get(sid)
        status = event.type.removeprefix("order.")
        order_status[sid] = {
            "status": status,
            "version": (current["version"] if current else 0) + 1,
            "first": current["first"] if current else status,
        }
