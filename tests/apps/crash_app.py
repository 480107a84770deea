"""The reference orders projection with outputs, for the crash-point tests.

``project`` keeps ``order_status`` as ``agents.orders`` does (a count of events applied
per order: exact only if each event is applied once) and sends ``<id>/projected`` for
each event to the derived topic. Every agent has tables: the source offset is settled
after the store write, outside the transaction (``engine/commit.py``).

``ORDERS_NAMESPACE`` prefixes the app id and topics, so each test has its own.
"""

from __future__ import annotations

import os

from agents.orders import ORDER_EVENTS
from streamapp import App, Event, Send, TableView
from tables.orders import OrderStatus, order_status

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}crash")
orders = app.topic(f"{NAMESPACE}crash-orders", partitions=2)
derived = app.topic(f"{NAMESPACE}crash-derived", partitions=2)


@app.agent(orders, tables=[order_status], sinks=[derived])
async def project(event: Event, statuses: TableView[OrderStatus], *, send: Send) -> None:
    if event.type not in ORDER_EVENTS:
        raise ValueError(f"unknown order event type {event.type!r}")
    order_id = event.stream_id
    assert order_id is not None
    current = statuses.get(order_id)
    version = (current["version"] if current else 0) + 1
    statuses[order_id] = {
        "status": event.type.removeprefix("order."),
        "version": version,
        "last_event_id": event.id,
    }
    send(
        derived,
        Event.create(
            "order.projected", stream_id=order_id, id=f"{event.id}/projected", data={"v": version}
        ),
    )
